"""``cost``: the K that maximises predicted speedup, from measured acceptance and costs.

Each decision evaluates the speedup of ``spectune.control.costs`` (``predicted_speedup``,
with chunked verification's cost where it is chosen), its expected tokens per step taken
from acceptance measured per draft position:

    S(K) = (1 + E(K)) / (K c + v(K)),   E(K) = sum over j <= K of r_1 r_2 ... r_j,
    S(0) = 1 (plain decoding)

which is (1 - alpha^(K+1)) / ((1 - alpha) (K c + v(K))) where every r_j = alpha. Every
input is measured on the running request:
- alpha, the per-token acceptance: an EWMA of accepted draft tokens over tested draft
  tokens (accepted, plus the one rejected token when a step was cut short). This is the
  maximum-likelihood alpha of the i.i.d. acceptance model, unlike accepted / positions,
  which also counts the draft tokens a rejection discarded. It starts from a prior
  (``prior_alpha`` over ``prior_tokens`` tested tokens) whose weight the EWMA decays: without
  it, three first steps that accept nothing (common for a drafter that pays later, measured
  on the suffix drafter's QA prompts) set alpha to 0 and hold K at 0 for ``probe_every``
  tokens.
- r_j, the rate at which the target kept the j-th draft token among the steps that kept
  the tokens before it: EWMA-weighted, with a prior pseudo-step at alpha that decays as
  alpha's does, each time the position is reached. For r_1 it weighs ``prior_tokens``,
  as alpha's prior, so unlucky first steps stop a draft no sooner than alpha would; for
  later positions ``position_prior`` (default: one step), since they are asked about only
  once the first position pays, and a policy at K = 2 must learn its second position
  from a few steps. A position not yet reached is worth alpha (the i.i.d. model; a draft
  kept whole still goes to long K at once), one reached often what it measured. Acceptance
  is not i.i.d. for every drafter: the suffix drafter's second token was kept in 68% of
  the steps that kept its first (int4 bench, T = 0: 37% first, 25% second), against an
  alpha of 0.33, so the i.i.d. model priced its K = 2 under K = 1 while fixed K = 2 ran
  5% faster; the shipped head's second token, 35%, is close to its alpha. While
  K is at least 1, every ``deepen_every`` speculative steps one step drafts K + 1 tokens,
  so the rate one position further is measured, not only assumed.
- c, the draft cost: EWMA seconds per drafted token over the seconds of a one-token
  target step.
- v(K), the verification curve, learned from the records (``LearnedCurve``): an EWMA of
  target_time per chunk size (k + 1 tokens) and a least-squares fit t(n) = a + b x(n)
  through the sizes seen, where x(n) is the prior's excess over one token: v(n - 1) - 1 of
  the ``cost_curve`` given at construction (measured with
  ``spectune.control.costs.measure_forward_curve``, or recorded for the runtime), or
  ``verify_slope_prior`` (n - 1) without one. While one size has been seen, the prior's
  shape is scaled to it. So a prior measured on a busy machine (int4: one bench measured
  two tokens at 1.37x one, the recorded curve says 1.10x) is corrected by the steps the
  traffic takes: plain steps measure n = 1, speculative steps and probes the rest, and
  the scale is always the request's own target times, so machine load cancels. Policies
  built with one ``calibration`` (one per target in ``bench``) share what they learned.

Chunked verification (``spectune.verify.grouped``): with ``max_verify_groups > 1`` the policy also
chooses, for each K, the number of verification groups m with the lowest expected target
cost (group j runs only if the draft survived the groups before it), and S(K) uses that
cost in place of v(K). Chunking is taken only when it beats one pass by ``margin``; on a
flat verification curve (a memory-bound CPU forward) it never does, since every group pays
the forward's fixed cost again. Chunked steps split the target time over several passes,
so they do not update the cost estimates (only alpha and the draft cost).

K = 0 when no K beats plain decoding (the reason names alpha and c); while at 0 the policy
probes with K = 1 every ``probe_every`` plain tokens to refresh alpha and c, so it comes
back when the draft starts to pay, and it decides again after every plain step, whose
one-token forward corrects the curve: K comes back at once where it fell on costs the
curve had wrong. While at 0 it also has the drafter's one-token guess checked on plain
steps (``StepPlan.shadow``, ``CostConfig.shadow``), as often as ``shadow_budget``
allows: a guess that costs s of a one-token target step is asked every ceil(s / budget)
plain steps, so a lookup's guess (s ~ 0.005) and the shipped head's (s ~ 0.08 beside int4)
are checked on every plain step, a draft model's at s = 0.3 on every third, and guesses
never cost more than the budget on average (int4, 35 test prompts, T = 0: the head's
`cost` 1.06x with no guesses, 1.08x with a budget of 0.03, 1.10-1.11x with one on every
plain step). (Without them the shipped head, at K = 0 for 32 tokens after three
early misses, drafted 1-2 tokens a step again once a probe let it back.) A guess's time
is not a draft cost sample: one token asked for alone carries the drafter's fixed cost
per call, which a K-token draft spreads over K tokens. Where no one-token step is seen and
the sizes seen span less than their distance to one token, the line is also fitted through
the prior's one-token time (its shape scaled to them), so two nearby sizes do not
extrapolate their noise to one token.
A new K is taken only when its predicted speedup beats the current K's by ``margin``
(hysteresis against noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spectune.control.base import PolicyState, StepPlan
from spectune.control.chunking import cheapest, chunked_costs
from spectune.control.costs import CostCurve, ewma, predicted_speedup
from spectune.errors import InvalidParameterError
from spectune.records import MAX_K, StepRecord

__all__ = ["CostConfig", "CostK", "LearnedCurve"]


@dataclass(frozen=True)
class CostConfig:
    initial_k: int = 4  # K while the measurements warm up (less where a known curve says so)
    max_k: int = 8
    smoothing: float = 0.2  # EWMA weight of the newest step
    warmup_steps: int = 3  # speculative steps at initial_k before the model decides
    probe_every: int = 32  # plain tokens between K = 1 probes while K = 0
    margin: float = 0.02  # a new K must beat the current K's predicted speedup by this
    verify_slope_prior: float = 0.05  # v(n) slope per token until two sizes are measured
    max_verify_groups: int = 4  # chunked verification in up to this many groups (1: never)
    # The acceptance assumed before any step is measured, held as one pseudo-step that
    # tested ``prior_tokens`` draft tokens; the EWMA decays it like any old step (weight
    # (1 - smoothing)^n after n steps), so a few unlucky first steps do not stop a draft.
    prior_alpha: float = 0.3
    prior_tokens: float = 2.0
    position_prior: float = 0.2  # weight of alpha in r_2, r_3, ... (EWMA units: one step)
    deepen_every: int = 32  # speculative steps between K + 1 steps while K >= 1
    # While K = 0, ask the drafter for its one-token guess on plain steps and count whether
    # the target emitted it as a one-token step's acceptance (StepPlan.shadow): alpha keeps
    # moving while nothing is verified, so a dip of a bursty drafter does not hold K at 0
    # until probes, 32 tokens apart, undo it. A lookup's guess costs about nothing; a
    # model's (a feature head's) a draft step, and only at temperature 0 (the engines'
    # rule: its sampled drafts are not one-hot guesses). ``shadow_budget``: the share of a
    # plain step that guesses may cost on average, which sets how often they are asked.
    shadow: bool = True
    shadow_budget: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.max_k <= MAX_K or not 1 <= self.initial_k <= self.max_k:
            raise InvalidParameterError(
                f"need 1 <= initial_k <= max_k <= {MAX_K}, got "
                f"initial_k={self.initial_k} max_k={self.max_k}"
            )
        if not 0.0 < self.smoothing <= 1.0:
            raise InvalidParameterError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if self.max_verify_groups < 1:
            raise InvalidParameterError(
                f"max_verify_groups must be >= 1, got {self.max_verify_groups}"
            )
        if self.position_prior < 0.0:
            raise InvalidParameterError(f"position_prior must be >= 0, got {self.position_prior}")
        if self.warmup_steps < 1 or self.probe_every < 1 or self.deepen_every < 1:
            raise InvalidParameterError("warmup_steps, probe_every and deepen_every must be >= 1")
        if self.margin < 0.0 or self.verify_slope_prior < 0.0:
            raise InvalidParameterError("margin and verify_slope_prior must be >= 0")
        if self.shadow_budget <= 0.0:
            raise InvalidParameterError(f"shadow_budget must be > 0, got {self.shadow_budget}")
        if not 0.0 <= self.prior_alpha < 1.0 or self.prior_tokens < 0.0:
            raise InvalidParameterError(
                f"need 0 <= prior_alpha < 1 and prior_tokens >= 0, got "
                f"prior_alpha={self.prior_alpha} prior_tokens={self.prior_tokens}"
            )


class LearnedCurve:
    """Target forward time per chunk size, learned from step records (see module docstring):
    EWMA seconds per size, and a least-squares line in the prior's excess x(n) through them."""

    def __init__(
        self, smoothing: float, slope_prior: float, prior: CostCurve | None = None
    ) -> None:
        self.smoothing = smoothing
        self.slope_prior = slope_prior
        self.prior = prior  # the curve's shape before (and between) measurements
        self.seconds: dict[int, float] = {}  # chunk size -> EWMA seconds

    def observe(self, tokens: int, seconds: float) -> None:
        old = self.seconds.get(tokens)
        w = self.smoothing
        self.seconds[tokens] = seconds if old is None else (1.0 - w) * old + w * seconds

    def _excess(self, tokens: int) -> float:
        """x(n): the prior's cost of a forward over ``tokens`` beyond one token's, in units of
        one token (0 at one token)."""
        if self.prior is None:
            return self.slope_prior * (tokens - 1)
        return self.prior.relative(tokens - 1) - 1.0

    def _line(self) -> tuple[float, float, float]:
        """(a, b, floor): t(n) = max(a + b x(n), floor) through the sizes seen (at least
        one)."""
        sizes = list(self.seconds)
        xs = [self._excess(n) for n in sizes]
        times = [self.seconds[n] for n in sizes]
        mean_x = sum(xs) / len(xs)
        mean_t = sum(times) / len(times)
        if len(sizes) > 1 and max(xs) - min(xs) < min(xs):
            # No one-token step seen and the sizes seen span less than their distance to
            # one token: a line through them alone extrapolates their noise (int4, AMD EPYC:
            # three- and two-token steps at 20 and 18 ms, 1.23x and 1.19x on the prior, put
            # one token at 8.5 ms against the 15 ms plain steps took, and the policy fell to
            # K = 0). The prior's own one-token time, its shape scaled to the sizes seen,
            # stands in as one more point.
            xs.append(0.0)
            times.append(mean_t / (1.0 + mean_x))
            mean_x = sum(xs) / len(xs)
            mean_t = sum(times) / len(times)
        # A noisy fit can put the intercept at or below zero; keep one token's time positive.
        floor = max(1e-3 * mean_t, 1e-12)
        var = sum((x - mean_x) ** 2 for x in xs)
        if var < 1e-12:  # one size (or sizes the prior prices alike): the prior's shape
            scale = mean_t / (1.0 + mean_x)
            return scale, scale, floor
        covar = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, times, strict=True))
        slope = max(0.0, covar / var)
        return mean_t - slope * mean_x, slope, floor

    def time(self, tokens: int) -> float | None:
        if not self.seconds:
            return None
        intercept, slope, floor = self._line()
        return max(intercept + slope * self._excess(tokens), floor)

    def curve(self, max_tokens: int) -> CostCurve | None:
        """The learned curve over 1..max_tokens; the prior itself until a step is seen (None
        without one)."""
        if not self.seconds:
            return self.prior
        intercept, slope, floor = self._line()
        sizes = tuple(range(1, max_tokens + 1))
        times = tuple(max(intercept + slope * self._excess(n), floor) for n in sizes)
        return CostCurve(sizes, times)


class CostK:
    """Maximises the predicted speedup S(K); K = 0 with periodic K = 1 probes."""

    def __init__(
        self,
        config: CostConfig | None = None,
        *,
        cost_curve: CostCurve | None = None,
        calibration: LearnedCurve | None = None,
    ):
        """``cost_curve``: the verification curve's prior shape. ``calibration``: a learner
        shared with other requests' policies on the same target (its own prior replaces
        ``cost_curve``); None learns within this request only."""
        self.config = config or CostConfig()
        self.learned = (
            calibration
            if calibration is not None
            else LearnedCurve(self.config.smoothing, self.config.verify_slope_prior, cost_curve)
        )
        self.k = self._opening_k()
        self.speculative_steps = 0
        self.plain_tokens = 0  # plain tokens since the last probe (or since K fell to 0)
        # EWMA draft tokens tested per step (accepted + one rejected) and accepted per step,
        # alpha = accepted / tested; both start at the prior's pseudo-step.
        self.tested = self.config.prior_tokens
        self.accepted = self.config.prior_alpha * self.config.prior_tokens
        # Per draft position (index j: the (j + 1)-th token): EWMA-weighted steps that
        # reached it (kept every token before it), of those that kept it too, and how
        # often it was reached (its prior's weight decays with that).
        self.reached = [0.0] * MAX_K
        self.kept = [0.0] * MAX_K
        self.reaches = [0] * MAX_K
        self.since_deepened = 0  # speculative steps since the last K + 1 step
        self.draft_token_time: float | None = None  # EWMA seconds per drafted token
        self.guess_time: float | None = None  # EWMA seconds of a plain step's guess
        self.since_guess = 0  # plain steps since the last guess (StepPlan.shadow)
        self.target_one: float | None = None  # one-token target step seconds (learned)
        self.predicted: float | None = None  # S(K) of the current K at the last decision
        # Groups by draft length 0..max_k from the current estimates (``_group_table``);
        # None until asked. Every observation moves the estimates and clears it.
        self._table: tuple[tuple[int, ...], tuple[float, ...]] | None = None

    def _opening_k(self) -> int:
        """K for the warm-up steps: ``initial_k``, or with a curve known up front the K in
        1..initial_k that the prior acceptance and free drafting predict best, where it
        beats ``initial_k`` by the margin. On a flat curve that is ``initial_k``; where
        verification is dear (int4: 5 tokens cost 1.7x one) the warm-up probes at K = 1
        instead of paying for long drafts first. A shared calibration that has seen steps
        already gives its learned curve here."""
        cfg, curve = self.config, self._curve()
        if curve is None:
            return cfg.initial_k
        speedups = {
            k: predicted_speedup(cfg.prior_alpha, 0.0, curve, k)
            for k in range(1, cfg.initial_k + 1)
        }
        best = max(speedups, key=speedups.__getitem__)
        # Like every change of K, a smaller one must win by the margin.
        return cfg.initial_k if speedups[cfg.initial_k] + cfg.margin >= speedups[best] else best

    @property
    def alpha(self) -> float | None:
        # Capped below 1: S(K) is defined by continuity there, but a run of all-accepted
        # steps should not promise an infinite payoff.
        return min(self.accepted / self.tested, 0.99) if self.tested > 0 else None

    def position_rates(self, k: int) -> list[float]:
        """r_1..r_k: each draft position's kept rate among the steps that reached it, with
        its prior at alpha (module docstring)."""
        cfg, alpha = self.config, self.alpha or 0.0
        rates = []
        for j in range(k):
            prior = cfg.prior_tokens if j == 0 else cfg.position_prior
            weight = prior * (1.0 - cfg.smoothing) ** self.reaches[j]
            reached = self.reached[j] + weight
            rate = (self.kept[j] + weight * alpha) / reached if reached > 0 else alpha
            rates.append(min(rate, 0.99))  # as alpha: capped below 1
        return rates

    def expected_accepted(self, k: int) -> float:
        """E(k): expected draft tokens kept from a k-token draft."""
        return self._expected_by_length(k)[k]

    def _expected_by_length(self, k: int) -> list[float]:
        """E(0), E(1), ..., E(k) from one pass over the position rates."""
        table, total, run = [0.0], 0.0, 1.0
        for rate in self.position_rates(k):
            run *= rate
            total += run
            table.append(total)
        return table

    @property
    def draft_cost(self) -> float | None:
        if self.draft_token_time is None or not self.target_one:
            return None
        return self.draft_token_time / self.target_one

    def plan(self) -> StepPlan:
        cfg = self.config
        probing = self.k == 0 and self.plain_tokens >= cfg.probe_every
        deepening = 0 < self.k < cfg.max_k and self.since_deepened >= cfg.deepen_every
        k = 1 if probing else self.k + 1 if deepening else self.k
        shadow = cfg.shadow and k == 0 and self.since_guess + 1 >= self._guess_every()
        return StepPlan(k, self._group_table(k), self._reason(), shadow=shadow)

    def _guess_every(self) -> int:
        """Plain steps per guess while K = 0: ceil(s / ``shadow_budget``), s a guess's cost
        in one-token target steps (before one is measured, a drafted token's)."""
        seconds = self.guess_time if self.guess_time is not None else self.draft_token_time
        if seconds is None or not self.target_one:
            return 1
        return max(1, math.ceil(seconds / self.target_one / self.config.shadow_budget))

    def observe(self, record: StepRecord) -> None:
        self._table = None
        cfg = self.config
        w = cfg.smoothing
        tokens = record.num_draft_tokens + 1  # the target's chunk: the pending token and the draft
        if record.target_time > 0.0 and record.verify_groups == 1:
            self.learned.observe(tokens, record.target_time)
            self.target_one = self.learned.time(1)
        if record.num_draft_tokens == 0:
            if record.k == 0:
                self.plain_tokens += len(record.emitted)
            if record.shadow_hit is not None:  # a checked guess: a one-token step's evidence
                self._count_kept(int(record.shadow_hit), 1)
                # (In a batch a step's draft time is the whole pass's, so a plain step's
                # draft time alone does not say that it guessed.)
                self.guess_time = ewma(self.guess_time, record.draft_time, w)
                self.since_guess = 0
            else:
                self.since_guess += 1
            # A plain step measures the one-token forward: where K fell to 0 on costs the
            # curve had wrong, it comes back now rather than at the next probe.
            if self.speculative_steps >= cfg.warmup_steps:
                self._decide()
            return
        self._count_kept(record.accepted, record.positions)
        deepened = 0 < self.k < record.k
        self.since_deepened = 0 if deepened else self.since_deepened + 1
        per_token = record.draft_time / record.num_draft_tokens
        self.draft_token_time = ewma(self.draft_token_time, per_token, w)
        self.speculative_steps += 1
        if self.k == 0:
            self.plain_tokens = 0  # that was a probe
        if self.speculative_steps >= cfg.warmup_steps:
            self._decide()

    def _count_kept(self, accepted: int, positions: int) -> None:
        """One step's acceptance evidence: ``accepted`` of ``positions`` draft tokens kept."""
        w = self.config.smoothing
        rejected = 1 if accepted < positions else 0
        self.accepted = (1.0 - w) * self.accepted + w * accepted
        self.tested = (1.0 - w) * self.tested + w * (accepted + rejected)
        for j in range(min(accepted + rejected, MAX_K)):  # the positions reached
            self.reached[j] = (1.0 - w) * self.reached[j] + w
            self.kept[j] = (1.0 - w) * self.kept[j] + (w if j < accepted else 0.0)
            self.reaches[j] += 1

    def _curve(self) -> CostCurve | None:
        return self.learned.curve(self.config.max_k + 1)

    def _groups(self, alpha: float, curve: CostCurve, k: int) -> tuple[int, float]:
        """The verification groups for k draft tokens, and their expected cost in one-token
        forwards: the cheapest grouping, if it beats one pass by the margin; else one pass."""
        cfg = self.config
        if cfg.max_verify_groups <= 1 or k < 2:
            return 1, curve.relative(k) if k else 1.0
        costs = chunked_costs(curve, alpha, k, cfg.max_verify_groups)  # [0]: one pass
        groups = cheapest(costs)
        if costs[groups - 1] * (1.0 + cfg.margin) >= costs[0]:
            groups = 1  # chunking must beat one pass by the margin
        return groups, costs[groups - 1]

    def _groups_by_length(
        self, alpha: float, curve: CostCurve | None = None
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """``_groups`` for every draft length 0..max_k, computed once per observation (the
        decision and the plan share it: both read the same alpha and curve): the groups
        and the expected verification costs. ``curve``: the current curve, when the caller
        has built it already."""
        if self._table is None:
            curve = curve or self._curve()
            assert curve is not None  # callers check that there is one
            pairs = [self._groups(alpha, curve, n) for n in range(self.config.max_k + 1)]
            self._table = (tuple(g for g, _ in pairs), tuple(c for _, c in pairs))
        return self._table

    def _speedup(self, cost: float, k: int, verify: float, expected: float) -> float:
        """S(k) with k draft tokens whose verification costs ``verify`` one-token forwards
        (chunked or not), ``expected`` of them kept (E(k))."""
        if k == 0:
            return 1.0
        return (1.0 + expected) / (k * cost + verify)

    def _group_table(self, k: int) -> tuple[int, ...] | None:
        """Chunked verification for a draft of each length up to k (``StepPlan``), once
        alpha and the costs are known; before that no preference."""
        alpha, cfg = self.alpha, self.config
        no_curve = self.learned.prior is None and not self.learned.seconds  # _curve() is None
        if alpha is None or no_curve or self.speculative_steps < cfg.warmup_steps:
            return None
        if k < 2 or cfg.max_verify_groups <= 1:
            return (1,) * (k + 1)  # what _groups gives, without building the curve
        return self._groups_by_length(alpha)[0][: k + 1]

    def _decide(self) -> None:
        alpha, cost = self.alpha, self.draft_cost
        curve = self._curve()
        if alpha is None or cost is None or curve is None:
            return
        _, verify = self._groups_by_length(alpha, curve)
        max_k = self.config.max_k
        expected = self._expected_by_length(max_k)
        speedups = {k: self._speedup(cost, k, verify[k], expected[k]) for k in range(max_k + 1)}
        best_k = max(speedups, key=lambda k: (speedups[k], -k))
        best, current = speedups[best_k], speedups[self.k]
        if best_k != self.k and best > current * (1.0 + self.config.margin):
            if best_k == 0:
                self.plain_tokens = 0
            self.k = best_k
            current = best
        self.predicted = current

    def _reason(self) -> str | None:
        """Why K is 0 (also while a K = 1 probe runs), or None."""
        if self.k != 0:
            return None
        alpha, cost = self.alpha, self.draft_cost
        return (
            f"cost: no K beats plain decoding (alpha {alpha or 0.0:.2f}, "
            f"draft cost {cost or 0.0:.2f} of a target step)"
        )

    def state(self) -> PolicyState:
        alpha, cost = self.alpha, self.draft_cost
        return {
            "k": self.k,
            "alpha": None if alpha is None else round(alpha, 4),
            "draft_cost": None if cost is None else round(cost, 4),
            "predicted_speedup": None if self.predicted is None else round(self.predicted, 4),
        }
