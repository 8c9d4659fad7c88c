"""Hybrid drafting: per step, the suffix draft or the model draft, chosen by measured value
per cost; at temperature 0, by what each source's tokens turned out to be worth in the
situation at hand, the two compared token by token (the greedy rule, below).

**Temperature 0, a suffix chain: the greedy rule** (since 2026-12-04).
Which source is right depends on the step far more than one calibration per source can
say: on the test prompts (the shipped head of 2026-12-04, int4 and fp32), a suffix first
token of corpus probability 0.8 or more was kept 0.86-0.88 of the time where the model
drafted the same token and 0.15-0.17 (corpus match) or 0.40-0.44 (context match) where it drafted
another; the head's own probability of its token sorts its acceptance from 0.15 (under
0.2) to 0.95 (over 0.9). So at T = 0 each draft token is priced by its
**situation** (``RateKey``), and every situation's rate is learned (``RateTable``:
decayed counts from a prior of one right in two) from every step, drafted or not, since
the committed tokens show the target's own choice one past the accepted depth
(``right_depths``):

- the model's first token by agreement (``alone``: no suffix draft; ``agree``: the
  suffix's first token is the same; ``differ``) and its own probability's band
  (``Draft.confidence``; band -1 where the model does not report one); later model tokens
  by their probability's band (``model_keys``);
- the suffix's first token by its source and corpus probability's band, alone or
  (``differ``) where the model starts otherwise; later suffix tokens by the band of their
  corpus probability given the path before (``suffix_keys``).

A step asks the suffix source first. If its first token's rate alone is at least
``SURE_ENOUGH`` (0.9), the suffix chain goes without running the model. Otherwise the
model drafts the K tokens the policy asked for (c per token, paid whatever is chosen) and
the rule takes the chain of best value, (1 + expected tokens kept) / (v(d) + K c), among:
the model chain's prefixes; where the sources agree, the suffix's continuation (its later
tokens cost nothing to draft); where they differ, the suffix chain's prefixes. Tried and
left out: the two chains as sibling branches of one tree (their expected tokens add),
which the sim priced well and the engine did not (tree verification costs more than the
chain curve says: on int4 1.125x against 1.170x without trees, fp32 1.484x against
1.495x; ``docs/results/hybrid-greedy-rule``).

**Otherwise** (T > 0, or a suffix tree) the rule of the rest of this docstring holds.

Each step the suffix drafter is asked first (it costs no forward). Its proposal has a
**score** (expected accepted tokens under the corpus frequencies, ``spectune.drafters.
suffix``; for a suffix tree, the sum of its path probabilities); what it is worth is
learned from what the target kept:

- ``suffix_calibration`` = accepted tokens per unit of score over steps with a suffix
  draft: the running mean of accepted over the running mean of score (starts at 1, a
  pseudo-step of score 1: take the corpus at its word). A ratio of means, not a mean of
  per-step ratios: low-score drafts that happen to be kept (score 0.2, one token kept: a
  ratio of 5) inflate the latter (21 test prompts at T = 0 beside fp32 with the shipped
  head of 2026-12-04: 0.62 against 0.43 accepted per unit of score), which priced suffix drafts
  over the model's;
- ``model_rates`` = per draft position j, the running rate at which the target kept the
  model's j-th token given that it kept the tokens before it (each starts at 1/2, so an
  unmeasured model draft of 4 tokens is worth ~0.94 tokens: a corpus guess worth less
  than about one token goes to the model from the start, and the model's rates get
  measured even where the corpus always has a guess). The expected accepted tokens of a
  k-token model draft are E(k) = sum over j <= k of the product of the first j rates;
- ``draft_cost`` c = one model draft token's time over one target step's, as the ``cost``
  policy defines it (``spectune.control.cost``): running mean of the model's ``propose``
  seconds per drafted token over the running mean of a step's target time, timed by the
  hybrid as the span from its ``propose`` returning to the engine's ``commit`` (the
  target forward and the verification; a drafter does not see the engine's step
  records). A fixed ``draft_cost`` given at construction replaces the measurement.
  Until a model step has been timed, c counts as 0.

**Rule** (value per cost, in tokens per target-step time): a step emits its accepted tokens
plus one. It costs v(d) target steps to verify a d-token draft (the target's verification
curve on its runtime and machine, ``spectune.control.crossover``: about 1 for any d up to 8
on fp32 on a 2-core AMD EPYC but 1.57 for d = 3 on a 2-core Xeon; 1.10 for d = 1 and 1.41
for d = 3 on int4 on the EPYC; flat, v = 1, where none is known), plus, for a model draft of
k tokens, k draft steps of relative cost c (the suffix lookup costs well under 1% of a
target step and is left out). The model draft is worth its best length, k* = argmax over 1
<= k <= K of (1 + E(k)) / (v(k) + k c) (K: what the policy asked for; ties go to the shorter
draft): a model whose second token is rarely kept drafts one token, which costs one draft
step, not K. So draft from the suffix source when it proposes something (s tokens) and

    (1 + suffix_calibration * score) / v(s)  >=  (1 + E(k*)) / (v(k*) + k* c)

else run the model draft for k* tokens. Ties go to the suffix draft. With c = 0 and a
flat curve this compares accepted tokens alone (and k* = K). Running means are
exponential with weight ``1 - decay`` on the newest step. The statistics are shared by a
drafter's copies (``with_sources``), so a server learns across requests.

**Temperature 0, a suffix tree: both as one tree** (``merge_greedy``; on when the target
takes tree attention masks). A model draft is merged with the suffix tree as
further branches (shared prefixes merged; model nodes first, at most ``MAX_TREE_NODES``
nodes), so the target keeps whichever branch matches its argmax. Greedy verification is
exact for any tree of candidate tokens (``spectune.verify.tree``), so this stays
token-for-token equal to plain decoding; the extra nodes cost what the curve says (8
tokens verify in about 1.08x one token's forward on fp32 on the EPYC, 1.9x on the Xeon,
2.1x on int4).
Both sources' statistics learn from such steps: each is credited with the depth of its
own branch that the target kept. So at T = 0 the choice is among "suffix alone", "the
model alone" and "both as one tree", the best value of the three (ties in that order of
preference: suffix, both, model). The model's branch is worth what it adds where the
suffix branch fails, and the tree at least what the model's chain is worth alone (the
target keeps the deeper branch):

    merged = (1 + max(E(k*), suffix_calibration * score + (1 - q) * rescue * E(k*) / r_1))
             / (v(s + k*) + k* c)

with q = min(1, suffix_calibration * p_1) the chance the suffix's first token is kept
(p_1: its corpus probability), ``model_rescue`` = running rate at which the model's first
token was kept in merged steps whose suffix branch was rejected at once (it measures how
often the model is right where the corpus is wrong, correlation included; starts at
r_1), and E(k*) / r_1 the model tokens kept once its first is. With no suffix proposal
the model drafts alone. (s + k* counts the merged tree's nodes as if no prefix were
shared: an upper bound on its verification cost.) Before 2026-12-04 the model alone was
not a choice where the suffix source had a proposal, so a weak corpus match took the step
(or made it a tree that verifies dearly) where the model's chain was worth more.

**Temperature > 0: one source per step.** The verifier's tree path takes one
distribution for all siblings of a node (``Draft.probs``, one row per node); a tree
mixing model-probability branches with one-hot suffix branches under one parent is not a
draw it covers, so no merging: either draft is verified as it is (the model's with its
probabilities, the suffix's one-hot). The choice depends only on steps already verified,
so decoding stays lossless.

"Accepted" is the depth of the draft's path the target kept: a rejected token is never
the token emitted in its place (the residual has no mass there, and at temperature 0 the
emitted token is the argmax no kept child has), so matching the draft against the
committed context counts it exactly, for chains and trees.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from spectune.draft import MAX_TREE_NODES, Draft, tree_depths
from spectune.drafters.base import Drafter, TargetFeatures, TreeShape, describe, fresh_drafter
from spectune.drafters.suffix import SuffixDrafter, SuffixProposal
from spectune.drafters.suffix_history import HistoryStore
from spectune.drafters.suffix_index import breadth_first
from spectune.errors import InvalidParameterError
from spectune.records import MAX_K
from spectune.sampling import SamplingParams

__all__ = [
    "HybridDrafter",
    "RateTable",
    "SourceStats",
    "VerifyCost",
    "band",
    "flat_verify",
    "kept_depth",
    "merge_trees",
    "model_keys",
    "right_depths",
    "suffix_keys",
]

VerifyCost = Callable[[int], float]  # v(d): verifying d draft tokens over a one-token step


def flat_verify(draft_tokens: int) -> float:
    """v(d) = 1: verification costs one step whatever its size (a flat curve)."""
    return 1.0


SURE_ENOUGH = 0.9  # a suffix draft this often right at its first token goes without the model
CONFIDENCE_BANDS = 5  # a probability in [0, 1] falls in one of this many equal bands


def band(probability: float | None) -> int:
    """The band of a probability (-1 where none is known)."""
    if probability is None:
        return -1
    return min(int(probability * CONFIDENCE_BANDS), CONFIDENCE_BANDS - 1)


RateKey = tuple[str | int, ...]
_ONE_IN_TWO = (1.0, 2.0)  # a situation's prior: right and seen


@dataclass
class RateTable:
    """How often a draft token was right, per situation (``RateKey``): decayed counts of
    right and seen, each starting at a prior of one right in two (rate 1/2), the newest
    observation weighing ``1 / (1 - decay)`` times the average of the window it ends."""

    decay: float = 0.98
    counts: dict[RateKey, tuple[float, float]] = field(default_factory=dict)

    def rate(self, key: RateKey) -> float:
        right, seen = self.counts.get(key, _ONE_IN_TWO)
        return right / seen

    def observe(self, key: RateKey, right: bool) -> None:
        old_right, old_seen = self.counts.get(key, _ONE_IN_TWO)
        self.counts[key] = (self.decay * old_right + right, self.decay * old_seen + 1.0)

    def chain(self, keys: Sequence[RateKey]) -> list[float]:
        """Expected tokens kept of chains of 1, 2, ... tokens whose i-th token is right,
        given those before it were, at ``rate(keys[i])``."""
        expected, reach, total = [], 1.0, 0.0
        for key in keys:
            reach *= self.rate(key)
            total += reach
            expected.append(total)
        return expected


def model_keys(confidence: Sequence[float | None], agreement: str) -> list[RateKey]:
    """The situations of a model chain's tokens: the first by how the suffix draft's first
    token relates to it (``agreement``: ``alone``, ``agree`` or ``differ``) and the
    model's own probability of it; the later ones by that probability."""
    return [
        ("model", agreement, band(p)) if i == 0 else ("model-next", band(p))
        for i, p in enumerate(confidence)
    ]


def suffix_keys(probs: Sequence[float], source: str, first: str) -> list[RateKey]:
    """The situations of a suffix chain's tokens (corpus path probabilities ``probs``):
    the first by ``first`` (``suffix``: as a draft alone, ``differ``: beside a model draft
    that starts otherwise), its source and corpus probability; the later ones by the
    corpus probability of the token given the path before it."""
    keys: list[RateKey] = [(first, source, band(probs[0]))] if probs else []
    for before, path in itertools.pairwise(probs):
        keys.append(("suffix-next", band(path / before if before > 0 else 0.0)))
    return keys


def right_depths(
    keys: Sequence[RateKey], tokens: Sequence[int], kept: Sequence[int]
) -> Iterator[tuple[RateKey, bool]]:
    """(key, right) for each chain token whose truth the committed tokens ``kept`` show:
    the first, and each later one whose predecessors were all right (the target's own
    token follows the last kept draft token, so one past the accepted depth is known)."""
    for key, token, truth in zip(keys, tokens, kept, strict=False):
        yield key, token == truth
        if token != truth:
            return


@dataclass
class SourceStats:
    """What each source's drafts turned out to be worth, and what a model draft costs
    (module docstring)."""

    decay: float = 0.9
    # Running means of a suffix step's score and of the tokens it kept; both start at a
    # prior pseudo-step of score 1 (``suffix_accepted_mean``: the calibration assumed).
    suffix_score_mean: float = 1.0
    suffix_accepted_mean: float = 1.0
    model_rates: list[float] = field(default_factory=lambda: [0.5] * MAX_K)  # per position
    model_rescue: float | None = None  # model's first kept where the suffix's was not
    model_token_seconds: float | None = None  # running mean: model propose s per token
    target_step_seconds: float | None = None  # running mean: propose-to-commit seconds
    suffix_steps: int = 0  # steps with a suffix draft (alone or merged)
    model_steps: int = 0  # steps with a model draft (alone or merged)
    merged_steps: int = 0  # steps with both, as one tree
    suffix_accepted_total: int = 0
    model_accepted_total: int = 0
    rates: RateTable = field(default_factory=RateTable)  # the greedy rule's (module doc)

    @property
    def suffix_calibration(self) -> float:
        """Accepted tokens per unit of suffix score: the ratio of the running means."""
        if self.suffix_score_mean <= 0:
            return 0.0
        return self.suffix_accepted_mean / self.suffix_score_mean

    @property
    def measured_cost(self) -> float | None:
        """c as measured: model seconds per draft token over a target step's seconds."""
        if self.model_token_seconds is None or not self.target_step_seconds:
            return None
        return self.model_token_seconds / self.target_step_seconds

    def model_expected(self, k: int) -> float:
        """E(k): expected tokens the target keeps of a k-token model draft."""
        expected, reach = 0.0, 1.0
        for rate in self.model_rates[:k]:
            reach *= rate
            expected += reach
        return expected

    def model_choice(
        self, k: int, draft_cost: float | None = None, verify: VerifyCost = flat_verify
    ) -> tuple[int, float]:
        """(k*, value): the model draft's best length up to ``k`` and its tokens per
        target-step time, at relative cost ``draft_cost`` (None: the measured one, 0 until
        measured) and verification cost ``verify``."""
        cost = self.cost(draft_cost)
        best = (1, (1.0 + self.model_expected(1)) / (verify(1) + cost))
        for length in range(2, min(k, MAX_K) + 1):
            value = (1.0 + self.model_expected(length)) / (verify(length) + length * cost)
            if value > best[1]:
                best = (length, value)
        return best

    def cost(self, draft_cost: float | None = None) -> float:
        """c: ``draft_cost`` when given, else the measured one (0 until measured)."""
        return draft_cost if draft_cost is not None else (self.measured_cost or 0.0)

    def merged_value(
        self,
        score: float,
        first_prob: float,
        length: int,
        draft_cost: float | None = None,
        *,
        suffix_nodes: int = 0,
        verify: VerifyCost = flat_verify,
    ) -> float:
        """Tokens per target-step time of the suffix draft (``score``, first-token corpus
        probability ``first_prob``, ``suffix_nodes`` tokens) plus a model branch of
        ``length`` tokens."""
        cost = self.cost(draft_cost)
        nodes = min(suffix_nodes + length, MAX_TREE_NODES)  # at most: shared prefixes merge
        first = self.model_rates[0]
        rescue = first if self.model_rescue is None else self.model_rescue
        suffix_first = min(1.0, self.suffix_calibration * first_prob)
        model = self.model_expected(length)
        added = (1 - suffix_first) * rescue * model / first if first else 0.0
        # The tree keeps the deeper branch, so it is worth at least the model's chain alone.
        kept = max(model, self.suffix_calibration * score + added)
        return (1.0 + kept) / (verify(nodes) + length * cost)

    def observe_rescue(self, model_kept_first: bool) -> None:
        """A merged step whose suffix branch was rejected at its first token."""
        start = self.model_rates[0] if self.model_rescue is None else self.model_rescue
        self.model_rescue = self._mean(start, 1.0 if model_kept_first else 0.0)

    def choose(
        self,
        score: float,
        first_prob: float,
        k: int,
        draft_cost: float | None = None,
        *,
        merge: bool = False,
        suffix_nodes: int = 0,
        verify: VerifyCost = flat_verify,
    ) -> tuple[str, int]:
        """The rule (module docstring): (``suffix``, ``model`` or ``both``, k*) for a suffix
        draft of ``score``, first-token corpus probability ``first_prob`` and
        ``suffix_nodes`` tokens against the model's best draft of at most ``k`` tokens,
        alone or (``merge``) as a branch beside it. Ties go to the suffix draft, then to
        both as one tree."""
        length, model_value = self.model_choice(k, draft_cost, verify)
        values = {"suffix": (1.0 + self.suffix_calibration * score) / verify(suffix_nodes)}
        if merge:  # before the model alone: its value is a lower bound, so it wins a tie
            values["both"] = self.merged_value(
                score, first_prob, length, draft_cost, suffix_nodes=suffix_nodes, verify=verify
            )
        values["model"] = model_value
        return max(values, key=values.__getitem__), length

    def prefers_suffix(self, score: float, k: int, draft_cost: float | None = None) -> bool:
        """The rule without merging: a suffix draft of ``score`` against the model's best
        draft of at most ``k`` tokens."""
        return self.choose(score, 0.0, k, draft_cost)[0] == "suffix"

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe_suffix(self, accepted: int, score: float) -> None:
        """One verified suffix draft of ``score``: ``accepted`` tokens kept."""
        self.suffix_steps += 1
        self.suffix_accepted_total += accepted
        self.suffix_score_mean = self._mean(self.suffix_score_mean, score)
        self.suffix_accepted_mean = self._mean(self.suffix_accepted_mean, accepted)

    def observe_model(self, accepted: int, depth: int) -> None:
        """One verified model draft ``depth`` tokens deep: ``accepted`` tokens kept. The
        positions it reached each learn whether they were kept (the first rejected one: no;
        those past it were never tested)."""
        self.model_steps += 1
        self.model_accepted_total += accepted
        for position in range(min(accepted + 1, depth, len(self.model_rates))):
            kept = 1.0 if position < accepted else 0.0
            self.model_rates[position] = self._mean(self.model_rates[position], kept)

    def observe_times(self, model_token_seconds: float | None, step_seconds: float) -> None:
        if model_token_seconds is not None:
            self.model_token_seconds = self._mean(self.model_token_seconds, model_token_seconds)
        self.target_step_seconds = self._mean(self.target_step_seconds, step_seconds)


def merge_trees(
    first: tuple[Sequence[int], Sequence[int] | None],
    second: tuple[Sequence[int], Sequence[int] | None],
    max_nodes: int = MAX_TREE_NODES,
) -> tuple[list[int], list[int]]:
    """Two drafts (tokens, parents; None: a chain) as one token tree (tokens, parents),
    shared prefixes merged, listed breadth first; when ``max_nodes`` cuts, ``first``'s
    nodes are kept before ``second``'s (a cut node's descendants go too)."""
    cut = -2  # -1 is the root
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for source_tokens, source_parents in (first, second):
        links = source_parents if source_parents is not None else range(-1, len(source_tokens) - 1)
        mapped: list[int] = []  # node of each source node, or cut
        for token, parent in zip(source_tokens, links, strict=True):
            above = -1 if parent < 0 else mapped[parent]
            node = cut if above == cut else index.get((above, token), cut)
            if node == cut and above != cut and len(tokens) < max_nodes:
                node = index[(above, token)] = len(tokens)
                tokens.append(token)
                parents.append(above)
            mapped.append(node)
    order, new_parents = breadth_first(parents)
    return [tokens[n] for n in order], new_parents


def kept_depth(tokens: Sequence[int], parents: Sequence[int] | None, kept: Sequence[int]) -> int:
    """How deep the committed tokens ``kept`` follow the draft (a chain, or a tree listed
    parents first): the number of draft tokens the target accepted."""
    links = parents if parents is not None else range(-1, len(tokens) - 1)
    at, depth = -1, 0
    for node, (token, parent) in enumerate(zip(tokens, links, strict=True)):
        if parent == at and depth < len(kept) and token == kept[depth]:
            at, depth = node, depth + 1
    return depth


@dataclass(frozen=True)
class _Pending:
    source: str  # "suffix" | "model" | "both"
    start: int  # context length when the draft was made
    suffix: tuple[tuple[int, ...], tuple[int, ...] | None]  # the suffix draft (tokens, parents)
    model: tuple[tuple[int, ...], tuple[int, ...] | None]  # the model draft (tokens, parents)
    score: float
    model_token_seconds: float | None  # the model's propose seconds per drafted token
    proposed_at: float  # clock when propose returned
    # The greedy rule: each chain whose tokens' situations learn from this step.
    learn: tuple[tuple[tuple[RateKey, ...], tuple[int, ...]], ...] = ()


def _parts(draft: Draft) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    parents = None if draft.parents is None else tuple(int(p) for p in draft.parents.tolist())
    return tuple(int(t) for t in draft.tokens.tolist()), parents


_NOTHING: tuple[tuple[int, ...], tuple[int, ...] | None] = ((), None)


@dataclass(frozen=True)
class _Option:
    """One chain the greedy rule weighs, and its tokens per target-step time."""

    value: float
    tokens: list[int]


def _chains(
    tokens: Sequence[int], expected: Sequence[float], verify: VerifyCost, sunk: float
) -> list[_Option]:
    """The chain's prefixes of 1, 2, ... tokens (``expected[i]``: tokens kept of i + 1)."""
    return [
        _Option((1.0 + e) / (verify(i + 1) + sunk), list(tokens[: i + 1]))
        for i, e in enumerate(expected)
    ]


class HybridDrafter:
    """The suffix draft where it is worth more per cost than the model's (module doc)."""

    def __init__(
        self,
        suffix: SuffixDrafter,
        model: Drafter,
        stats: SourceStats | None = None,
        *,
        name: str | None = None,
        merge_greedy: bool = False,
        draft_cost: float | None = None,
        verify_cost: VerifyCost | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 <= (stats or SourceStats()).decay < 1:
            raise InvalidParameterError("the hybrid's decay must be in [0, 1)")
        if draft_cost is not None and draft_cost < 0:
            raise InvalidParameterError(f"draft_cost must be >= 0, got {draft_cost}")
        self.suffix = suffix
        self.model = model
        self.stats = stats or SourceStats()
        self.name = name or f"{suffix.name}+{model.name}"
        # The target takes tree masks: at T = 0 a suffix tree and the model's chain merge.
        self.merge_greedy = merge_greedy
        self.draft_cost = draft_cost  # a fixed c (None: measured)
        # v(d): verifying d draft tokens over a one-token step (None: flat, v = 1)
        self.verify_cost = verify_cost or flat_verify
        self.clock = clock
        self._pending: _Pending | None = None

    def fresh(self) -> HybridDrafter:
        """A copy for a new request: fresh copies of both sources, this one's statistics."""
        return self.with_sources(self.suffix.fresh(), fresh_drafter(self.model))

    def with_history(self, history: HistoryStore | None) -> HybridDrafter:
        """This hybrid with its suffix source over ``history`` (a server's store)."""
        return self.with_sources(suffix=self.suffix.with_history(history))

    def tree(self, shape: TreeShape) -> HybridDrafter:
        """The token-tree form: the suffix source drafts trees of ``shape`` (the model
        source stays a chain), with statistics of its own (a tree's acceptance is not the
        chain's it was made from)."""
        return self.with_sources(
            suffix=self.suffix.tree(shape), stats=SourceStats(self.stats.decay)
        )

    def describe(self) -> str:
        model = describe(self.model)
        return f"{self.name} (suffix lookup or {model}, per step; at T = 0 by situation)"

    def with_sources(
        self,
        suffix: SuffixDrafter | None = None,
        model: Drafter | None = None,
        *,
        stats: SourceStats | None = None,
    ) -> HybridDrafter:
        """A hybrid over other sources (a request's fresh copies, a suffix tree) with this
        one's settings, sharing its statistics unless given others."""
        default_name = self.name == f"{self.suffix.name}+{self.model.name}"
        return HybridDrafter(
            suffix or self.suffix,
            model or self.model,
            stats or self.stats,
            name=None if default_name else self.name,
            merge_greedy=self.merge_greedy,
            draft_cost=self.draft_cost,
            verify_cost=self.verify_cost,
            clock=self.clock,
        )

    def reset(self) -> None:
        self.suffix.reset()
        self.model.reset()
        self._pending = None

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        proposal = self.suffix.suggest(context, num_tokens)
        if params.greedy and proposal.parents is None:
            return self._propose_greedy(context, num_tokens, params, generator, proposal)
        suffix_draft = proposal.draft()
        model_seconds: float | None = None
        merge = params.greedy and self.merge_greedy
        choice, model_k = self.stats.choose(
            proposal.score,
            proposal.first_prob,
            num_tokens,
            self.draft_cost,
            merge=merge,
            suffix_nodes=len(suffix_draft),
            verify=self.verify_cost,
        )
        if proposal.tokens and choice == "suffix":
            draft, source = suffix_draft, "suffix"
            suffix_parts, model_parts = _parts(suffix_draft), _NOTHING
        else:
            start = self.clock()
            model_draft = self.model.propose(context, model_k, params, generator)
            if len(model_draft):
                model_seconds = (self.clock() - start) / len(model_draft)
            draft, source = model_draft, "model"
            suffix_parts, model_parts = _NOTHING, _parts(model_draft)
            if choice == "both" and proposal.tokens:
                suffix_parts = _parts(suffix_draft)
                tokens, parents = merge_trees(model_parts, suffix_parts)
                draft = Draft(
                    torch.tensor(tokens, dtype=torch.long),
                    None,
                    torch.tensor(parents, dtype=torch.long),
                )
                source = "both"
        self._pending = _Pending(
            source,
            len(context),
            suffix_parts,
            model_parts,
            proposal.score,
            model_seconds,
            self.clock(),
        )
        return draft

    def _propose_greedy(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        proposal: SuffixProposal,
    ) -> Draft:
        """Temperature 0 with a suffix chain: the greedy rule (module docstring)."""
        stats, rates, verify = self.stats, self.stats.rates, self.verify_cost
        suffix = proposal.tokens
        alone_keys = suffix_keys(proposal.probs, proposal.source, "suffix")
        learn = [(tuple(alone_keys), tuple(suffix))]
        options = _chains(suffix, rates.chain(alone_keys), verify, 0.0)
        alone = max(options, default=None, key=lambda o: o.value)
        if alone is not None and rates.rate(alone_keys[0]) >= SURE_ENOUGH:
            return self._greedy_draft(context, alone, "suffix", learn, proposal, None)
        start = self.clock()
        model_draft = self.model.propose(context, num_tokens, params, generator)
        head = [int(t) for t in model_draft.tokens.tolist()]
        if not head:  # the model has nothing: the suffix chain (or nothing) as it stands
            if alone is None:
                return model_draft
            return self._greedy_draft(context, alone, "suffix", learn, proposal, None)
        seconds = (self.clock() - start) / len(head)
        sure = model_draft.confidence
        confidence: list[float | None] = [None] * len(head) if sure is None else sure.tolist()
        agreement = "alone" if not suffix else "agree" if suffix[0] == head[0] else "differ"
        keys = model_keys(confidence, agreement)
        learn.append((tuple(keys), tuple(head)))
        sunk = len(head) * stats.cost(self.draft_cost)  # the model has drafted: paid
        model_expected = rates.chain(keys)
        options = _chains(head, model_expected, verify, sunk)
        if agreement == "agree" and len(suffix) > 1:  # the suffix's continuation, free
            first = rates.rate(keys[0])
            further = rates.chain(alone_keys[1:])
            expected = [first] + [first * (1.0 + e) for e in further]
            options += _chains(suffix, expected, verify, sunk)[1:]
        elif agreement == "differ":  # the suffix chain after all
            differ_keys = suffix_keys(proposal.probs, proposal.source, "differ")
            learn.append((tuple(differ_keys), tuple(suffix)))
            options += _chains(suffix, rates.chain(differ_keys), verify, sunk)
        best = max(options, key=lambda o: o.value)  # ties: the first listed
        source = "model" if best.tokens[: len(head)] == head[: len(best.tokens)] else "suffix"
        return self._greedy_draft(context, best, source, learn, proposal, seconds)

    def _greedy_draft(
        self,
        context: Sequence[int],
        option: _Option,
        source: str,
        learn: list[tuple[tuple[RateKey, ...], tuple[int, ...]]],
        proposal: SuffixProposal,
        model_seconds: float | None,
    ) -> Draft:
        parts: tuple[tuple[int, ...], tuple[int, ...] | None] = (tuple(option.tokens), None)
        self._pending = _Pending(
            source,
            len(context),
            parts if source == "suffix" else _NOTHING,
            parts if source == "model" else _NOTHING,
            proposal.score,
            model_seconds,
            self.clock(),
            tuple(learn),
        )
        return Draft(torch.tensor(option.tokens, dtype=torch.long), None)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.learn and len(context) > pending.start:
            self._learn_greedy(pending, context[pending.start :])
        elif pending is not None and len(context) > pending.start:
            self.stats.observe_times(
                pending.model_token_seconds, self.clock() - pending.proposed_at
            )
            kept = context[pending.start :]
            suffix_kept = kept_depth(*pending.suffix, kept)
            if pending.source in ("suffix", "both"):
                self.stats.observe_suffix(suffix_kept, pending.score)
            if pending.source in ("model", "both") and pending.model[0]:
                tokens, parents = pending.model
                depth = len(tokens) if parents is None else max(tree_depths(parents))
                model_kept = kept_depth(*pending.model, kept)
                if pending.source == "both" and suffix_kept == 0:
                    self.stats.observe_rescue(model_kept > 0)
                self.stats.observe_model(model_kept, depth)
            if pending.source == "both":
                self.stats.merged_steps += 1
        self.suffix.commit(context, features)
        self.model.commit(context, features)

    def _learn_greedy(self, pending: _Pending, kept: Sequence[int]) -> None:
        """A greedy-rule step: each situation it showed learns whether its token was
        right; the counts and, where the model ran, its time and the step's yield."""
        stats = self.stats
        for keys, tokens in pending.learn:
            for key, right in right_depths(keys, tokens, kept):
                stats.rates.observe(key, right)
        stats.observe_times(pending.model_token_seconds, self.clock() - pending.proposed_at)
        if pending.source == "suffix":
            stats.suffix_steps += 1
            stats.suffix_accepted_total += kept_depth(*pending.suffix, kept)
        else:
            stats.model_steps += 1
            stats.model_accepted_total += kept_depth(*pending.model, kept)
