"""The draft deadline: a drafter that hangs does not stall the batch; the step goes on
without drafts, the batch decodes plainly (exactly), and drafting resumes for requests
that join after the late pass returned."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from spectune.decode.batch import BatchEngine
from spectune.decode.deadline import DeadlineCall, DeadlineExceeded
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.batched import PerRow
from spectune.drafters.scripted import ScriptedDrafter
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.sampling import SamplingParams

DEADLINE = 0.2  # seconds


def hanging_drafter(release: threading.Event, hang_at: int | None) -> ScriptedDrafter:
    """Proposes repeats of the last token; its ``hang_at``-th proposal blocks until
    ``release`` is set (a hung drafter); ``hang_at`` None: never hangs."""
    calls = 0

    def script(context: Sequence[int], k: int) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == hang_at:
            release.wait(30)
        return [context[-1]] * k

    return ScriptedDrafter(script, vocab_size=64, with_probs=False, name="hanging")


def test_deadline_call() -> None:
    call = DeadlineCall(0.05)
    assert call.run(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        call.run(lambda: 1 // 0)
    gate = threading.Event()
    with pytest.raises(DeadlineExceeded):
        call.run(lambda: gate.wait(10))
    assert call.busy
    with pytest.raises(DeadlineExceeded, match="still running"):
        call.run(lambda: 1)
    gate.set()
    deadline = time.monotonic() + 5
    while call.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert call.run(lambda: 2) == 2
    with pytest.raises(InvalidParameterError):
        DeadlineCall(0)


def test_hung_drafter_falls_back_without_stalling(toy_target: LlamaLM) -> None:
    release = threading.Event()
    made: list[ScriptedDrafter] = []

    def factory() -> ScriptedDrafter:
        # The first drafter the engine makes is only asked its name; the second (the first
        # request's) hangs on its third proposal.
        drafter = hanging_drafter(release, hang_at=3 if len(made) == 1 else None)
        made.append(drafter)
        return drafter

    params = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = {"a": [5, 9, 3], "b": [7, 7, 2, 11]}
    engine = BatchEngine(toy_target, PerRow(factory), max_batch=4, draft_deadline=DEADLINE)
    for request_id, prompt in prompts.items():
        engine.add(request_id, prompt, params)
    outputs: dict[str, list[int]] = {r: [] for r in prompts}
    fallbacks: dict[str, list[str | None]] = {r: [] for r in prompts}
    slowest = 0.0
    try:
        while engine.active:
            start = time.perf_counter()
            updates = engine.step()
            slowest = max(slowest, time.perf_counter() - start)
            for update in updates:
                outputs[update.request_id] += update.record.emitted
                fallbacks[update.request_id].append(update.record.fallback)
        # A request that joins while the late pass still runs decodes plainly too.
        engine.add("c", [4, 4, 8], params)
        first = engine.step()
        assert (first[0].record.fallback or "").startswith("draft_deadline")
    finally:
        release.set()
    assert slowest < DEADLINE + 2.0  # the hang cost one deadline, not 30 s
    for request_id, prompt in prompts.items():
        plain = SpeculativeEngine(toy_target).run(prompt, params).tokens
        assert outputs[request_id] == plain  # exact despite the fallback
        kinds = [f for f in fallbacks[request_id] if f]
        assert kinds and all(f.startswith("draft_deadline") for f in kinds)
    engine.cancel("c")
    # Once the late pass has returned, new requests draft again.
    deadline = time.monotonic() + 5
    while engine.draft_deadline is not None and engine.draft_deadline.busy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    engine.add("d", [4, 4, 8], params)
    records = [u.record for u in engine.step()]
    assert records[0].num_draft_tokens > 0 and records[0].fallback is None
