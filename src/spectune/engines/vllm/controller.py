"""spectune's control over vLLM's batch: per request, what the last step kept, and how many
tokens to draft next.

vLLM calls its proposer once per engine step, after sampling, with what every row of its
batch kept (``spectune.engines.vllm.rows``). For each row ``RowController.step``:

1. credits the row's step to the request the row holds now (``RequestTable``), as a
   ``StepRecord``: K planned, draft tokens vLLM verified, accepted, kept tokens, this
   request's draft time, the engine's step time;
2. lets the request's K policy (``spectune.control``: ``threshold``, ``cost``, ``fixed``,
   behind the ``local`` check) and the monitor (trace, counters) hear the record;
3. asks the policy for the next K, capped by vLLM's ``num_speculative_tokens``, the room
   left before ``max_model_len``, and the engine-wide check below;
4. drafts up to K tokens with the request's own drafter (spectune's model-free drafters:
   suffix lookup, n-gram). An empty list tells vLLM not to speculate on that row.

The three fallbacks, from the finest:
- token     vLLM's rejection sampler replaces the first rejected draft token (recorded
            as a step that kept fewer tokens than it tested).
- local     ``LocalFallback``: five steps under 50% acceptance -> that request drafts
            nothing for a back-off, then probes at K = 1 (``policy_options.local``).
- global    ``DraftShareCheck``: the proposer's time per step (drafting and its own
            bookkeeping) over 50% of the engine's step -> no request drafts; every
            ``probe_every`` steps one step drafts again and measures, and drafting resumes
            when that step paid.

Time: vLLM runs the proposer inside its step, so the engine's step is the interval
between two calls: ``target_time`` is the time since the last call ended (the target's
forward, sampling, vLLM's bookkeeping), ``step_time`` the time since it began (that plus
the proposer). Every request in the batch waited both, so each record carries them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from spectune.control.base import KPolicy, StepPlan
from spectune.control.costs import CostCurve, ewma
from spectune.control.fallback import Hold
from spectune.control.registry import make_policy, shared_calibration
from spectune.drafters.base import Drafter, describe, fresh_drafter, guesses, shadow_guess
from spectune.engines.vllm.options import DraftShareConfig, ProposerSettings
from spectune.engines.vllm.rows import BatchRows, RequestTable, RowStep, row_steps
from spectune.monitor.hub import Monitor, RequestMonitor
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

__all__ = ["DraftShareCheck", "RowController"]

log = logging.getLogger("vllm.spectune")  # under vLLM's logger: its handler prints it


class DraftShareCheck:
    """Engine-wide fallback: the proposer costs more than ``max_draft_ratio`` of the
    engine's step -> no request drafts, until a probe step shows it pays again.

    ``observe(call_time, engine_time, drafted)`` hears each step: the proposer's last call
    and the engine's work since. Only calls that drafted something are measured, and not
    the first (one-time work: compiled lookups loading, first allocations). After
    ``warmup_steps`` measured steps, an EWMA of ``call_time / engine_time`` over the limit
    holds every request at K = 0. While held, every ``probe_every``-th step is a probe:
    ``check`` lets it draft, and the step that follows measures it; at or under the limit
    drafting resumes (the EWMA restarts from that measurement), else the hold goes on.
    """

    kind = "global"

    def __init__(self, config: DraftShareConfig | None = None) -> None:
        self.config = config or DraftShareConfig()
        self.seen = 0  # calls that drafted, the unmeasured first one included
        self.share: float | None = None  # EWMA of call_time / engine_time
        self.held: str | None = None  # the reason, while held
        self.held_steps = 0
        self.probing = False
        self.holds = 0  # times the check held drafting (for the log and tests)

    def observe(self, call_time: float, engine_time: float, drafted: bool) -> None:
        cfg = self.config
        if engine_time <= 0.0:
            return
        ratio = call_time / engine_time
        if self.held is not None:
            if self.probing:
                self.probing = False
                if drafted and ratio <= cfg.max_draft_ratio:
                    self.held, self.share = None, ratio
                    log.info("spectune: drafting resumed (a probe step took %.0f%%)", 100 * ratio)
                else:
                    self.held_steps = 0
            else:
                self.held_steps += 1
                self.probing = self.held_steps >= cfg.probe_every
            return
        if not drafted:
            return
        self.seen += 1
        if self.seen == 1:
            return  # one-time work, see the class docstring
        self.share = ewma(self.share, ratio, cfg.smoothing)
        if self.seen > cfg.warmup_steps and self.share > cfg.max_draft_ratio:
            self.held = (
                f"global: drafting takes {self.share:.0%} of a target step (limit "
                f"{cfg.max_draft_ratio:.0%}); no request drafts until a probe step pays"
            )
            self.held_steps, self.probing = 0, False
            self.holds += 1
            log.warning("spectune: %s", self.held)

    def check(self) -> Hold | None:
        """Hold every request at K = 0 while held, except on a probe step."""
        if self.held is None or self.probing:
            return None
        return Hold(0, self.held)


@dataclass
class _Request:
    """One request's controller state."""

    policy: KPolicy
    drafter: Drafter
    monitor: RequestMonitor
    params: SamplingParams
    guesses: bool  # whether a plain step may check the drafter's guess (``guesses``)
    steps: int = 0
    plan: StepPlan | None = None  # the plan of the step in flight (None: the prefill's)
    draft_time: float = 0.0  # seconds drafting the step in flight
    guess: int | None = None  # a plain step's checked one-token guess (StepPlan.shadow)
    failure: str | None = None  # the drafter raised: it drafts nothing more


def _temperature(handle: object) -> float:
    params = getattr(handle, "sampling_params", None)
    value = getattr(params, "temperature", 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def _prompt(handle: object) -> list[int]:
    prompt = getattr(handle, "prompt_token_ids", None)
    return [int(t) for t in prompt] if prompt is not None else []


class RowController:
    """The per-step core of the vLLM proposer (module docstring), free of vLLM itself:
    ``step(batch, requests, sampled)`` takes vLLM's input batch, its worker's table of live
    requests (id -> ``CachedRequestState``; only ``sampling_params.temperature`` and
    ``prompt_token_ids`` are read) and the sampled tokens per row.

    ``drafter`` is the prototype each request gets a fresh copy of; ``cost_curve`` the
    measured v(K) for ``cost``; ``info`` goes into every request's trace entry.
    """

    def __init__(
        self,
        settings: ProposerSettings,
        drafter: Drafter,
        monitor: Monitor,
        *,
        max_model_len: int,
        cost_curve: CostCurve | None = None,
        info: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.drafter = drafter
        self.monitor = monitor
        self.max_model_len = max_model_len
        self.cost_curve = cost_curve
        self.info = dict(info or {})
        self.clock = clock
        self.draft_share = DraftShareCheck(settings.draft_share)
        self.calibration = shared_calibration(settings.policy, settings.policy_options, cost_curve)
        self.requests: RequestTable[_Request] = RequestTable(self._open, self._close)
        self._policy(0.0)  # bad policy options fail here, at start-up, not on a request
        self._last_start: float | None = None
        self._last_end: float | None = None
        self._last_drafted = False

    def _policy(self, temperature: float) -> KPolicy:
        return make_policy(
            self.settings.policy,
            self.settings.policy_options,
            params=SamplingParams(temperature=temperature),
            cost_curve=self.cost_curve,
            calibration=self.calibration,
        )

    def _open(self, request: str, handle: object) -> _Request:
        temperature = _temperature(handle)
        policy = self._policy(temperature)
        info = {
            **self.info,
            "policy": self.settings.policy,
            "temperature": temperature,
            "drafter": describe(self.drafter),
            "max_k": self.settings.max_k,
            "prompt": _prompt(handle),
        }
        monitor = self.monitor.request(policy=policy, request_id=request, info=info)
        drafter = fresh_drafter(self.drafter)
        params = SamplingParams(temperature=temperature)
        return _Request(policy, drafter, monitor, params, guesses(drafter, params))

    def _close(self, request: str, state: _Request) -> None:
        state.monitor.finish()
        state.drafter.reset()  # a suffix drafter files the output in the shared history

    def close(self) -> None:
        """Close every request's record (the engine stops)."""
        self.requests.close_all()

    def step(
        self,
        batch: BatchRows,
        requests: Mapping[str, object],
        sampled: Sequence[Sequence[int]],
    ) -> list[list[int]]:
        """[rows] the draft for each row of ``batch`` (module docstring)."""
        start = self.clock()
        target_time = step_time = 0.0
        if self._last_start is not None and self._last_end is not None:
            target_time, step_time = start - self._last_end, start - self._last_start
            self.draft_share.observe(step_time - target_time, target_time, self._last_drafted)
        self.requests.retire(requests)
        hold = self.draft_share.check()
        drafts: list[list[int]] = []
        for row in row_steps(batch, sampled):
            handle = None if row is None else requests.get(row.request)
            if row is None or handle is None:
                drafts.append([])  # a prefill chunk (or a row the worker no longer holds)
                continue
            state = self.requests.get(row.request, handle)
            context = row.context(batch)
            if state.plan is not None:
                self._credit(state, row, context, target_time, step_time)
            drafts.append(self._draft(state, row, context, hold))
        self._last_drafted = any(drafts)
        self.monitor.flush()  # this step's trace events, in one write
        self._last_start, self._last_end = start, self.clock()
        return drafts

    def _credit(
        self,
        state: _Request,
        row: RowStep,
        context: Sequence[int],
        target_time: float,
        step_time: float,
    ) -> None:
        """Steps 1-2: the row's step as a record, heard by the policy and the monitor."""
        plan = state.plan
        assert plan is not None
        record = StepRecord(
            index=state.steps,
            k=plan.k,
            num_draft_tokens=row.verified,
            accepted=row.accepted,
            emitted=row.kept,
            draft_time=state.draft_time,
            target_time=target_time,
            step_time=step_time,
            # A plan's reason is the step's fallback when the step ended up plain.
            fallback=plan.reason if row.verified == 0 else None,
            shadow_hit=None if state.guess is None else row.kept[0] == state.guess,
        )
        state.steps += 1
        state.policy.observe(record)
        state.monitor.observe(record)
        state.drafter.commit(context, None)

    def _draft(
        self, state: _Request, row: RowStep, context: Sequence[int], hold: Hold | None
    ) -> list[int]:
        """Steps 3-4: the next K, and up to K draft tokens."""
        plan = state.policy.plan()
        for objection in (hold, None if state.failure is None else Hold(0, state.failure)):
            if objection is not None:
                plan = plan.capped(objection.max_k, objection.reason)
        room = max(0, self.max_model_len - row.num_tokens - 1)
        bound = min(self.settings.max_k, room)
        if plan.k > bound:
            plan = plan.capped(bound, plan.reason)
        state.plan, state.guess, state.draft_time = plan, None, 0.0
        began = self.clock()
        try:
            if plan.k == 0:
                if plan.shadow and state.guesses:
                    state.guess = shadow_guess(state.drafter, context, state.params, None)
                return []
            draft = state.drafter.propose(context, plan.k, state.params, None)
            return cast(list[int], draft.tokens[: plan.k].tolist())
        except Exception as exc:  # noqa: BLE001 - the request goes on without drafts
            state.failure = f"drafter_error: {type(exc).__name__}: {exc}"
            state.plan = plan.capped(0, state.failure)
            log.warning("spectune: request %s drafts nothing more: %s", row.request, exc)
            return []
        finally:
            state.draft_time = self.clock() - began
