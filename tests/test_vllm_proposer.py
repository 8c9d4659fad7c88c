"""spectune's vLLM proposer: the row-to-request bookkeeping and the controller against a
simulated vLLM batch (fast), and a real vLLM serving with it (slow).

The simulation keeps vLLM's batch rules (``vllm/v1/worker/gpu_input_batch.py``): a
finished request leaves a hole, a new request takes the lowest hole, ``condense`` moves
the last rows into the remaining holes, an attention backend may swap rows. It verifies
drafts greedily against each request's scripted continuation and counts them as vLLM's
scheduler does.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from _vllm import chat, live
from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.engines.vllm.controller import DraftShareCheck, RowController
from spectune.engines.vllm.options import DraftShareConfig, parse_settings
from spectune.engines.vllm.proposer import NoDraftProposer, SpectuneProposer, cost_curve_of
from spectune.engines.vllm.rows import RequestTable, row_steps
from spectune.errors import InvalidParameterError
from spectune.monitor.hub import Monitor
from spectune.monitor.report import analyse_trace
from spectune.monitor.trace import TraceWriter, read_trace
from spectune.sampling import SamplingParams

WRONG = 10_000  # a token no scripted continuation holds


class OracleDrafter:
    """Drafts each request's true continuation (known by its prompt's first token), right
    for its first ``good[first]`` tokens and wrong after; ``clock`` advances ``cost`` per
    call (a fake clock, for the draft-share check)."""

    def __init__(
        self,
        truths: dict[int, list[int]],
        good: dict[int, int],
        clock: FakeClock | None = None,
    ) -> None:
        self.truths, self.good, self.clock = truths, good, clock
        self.name = "oracle"
        self.model_free = True
        self.cost = 0.0

    def fresh(self) -> OracleDrafter:
        return self

    def reset(self) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        if self.clock is not None:
            self.clock.now += self.cost
        first, n = int(context[0]), len(context)
        truth = self.truths[first][n : n + num_tokens]
        good = self.good[first]
        tokens = [t if i < good else WRONG for i, t in enumerate(truth)]
        return Draft(torch.tensor(tokens, dtype=torch.long), None)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        pass


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeBatch:
    """vLLM's InputBatch, the fields a proposer reads, with its row rules."""

    rows: int = 8
    width: int = 512
    slots: list[str | None] = field(default_factory=list)
    spec_token_ids: list[list[int]] = field(default_factory=list)
    num_tokens_no_spec: np.ndarray = field(init=False)
    token_ids_cpu: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.num_tokens_no_spec = np.zeros(self.rows, dtype=np.int32)
        self.token_ids_cpu = np.zeros((self.rows, self.width), dtype=np.int32)

    @property
    def req_ids(self) -> list[str]:
        assert None not in self.slots  # condensed
        return [s for s in self.slots if s is not None]

    def row(self, request: str) -> int:
        return self.slots.index(request)

    def add(self, request: str, prompt: list[int]) -> None:
        holes = [i for i, s in enumerate(self.slots) if s is None]
        if holes:
            index = holes[0]  # the lowest hole first, as vLLM
            self.slots[index] = request
        else:
            index = len(self.slots)
            self.slots.append(request)
            self.spec_token_ids.append([])
        self.token_ids_cpu[index, : len(prompt)] = prompt
        self.num_tokens_no_spec[index] = len(prompt)
        self.spec_token_ids[index] = []

    def remove(self, request: str) -> None:
        self.slots[self.row(request)] = None

    def swap(self, i: int, j: int) -> None:
        for array in (self.num_tokens_no_spec, self.token_ids_cpu):
            array[[i, j]] = array[[j, i]]
        self.slots[i], self.slots[j] = self.slots[j], self.slots[i]
        self.spec_token_ids[i], self.spec_token_ids[j] = (
            self.spec_token_ids[j],
            self.spec_token_ids[i],
        )

    def condense(self) -> None:
        """The last rows move into the holes (vLLM's InputBatch.condense)."""

        def trim() -> None:
            while self.slots and self.slots[-1] is None:
                self.slots.pop()
                self.spec_token_ids.pop()

        trim()
        while None in self.slots:
            self.swap(self.slots.index(None), len(self.slots) - 1)
            trim()


@dataclass
class Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0


class FakeEngine:
    """Steps a ``RowController`` the way vLLM's worker does (module docstring)."""

    def __init__(
        self,
        controller: RowController,
        truths: dict[int, list[int]],
        clock: FakeClock | None = None,
    ) -> None:
        self.controller = controller
        self.clock = clock
        self.engine_seconds = 0.01  # each step's target time on the fake clock
        self.truths = truths
        self.batch = FakeBatch()
        self.handles: dict[str, object] = {}
        self.prompts: dict[str, list[int]] = {}
        self.limits: dict[str, int] = {}  # request -> total length when it finishes
        self.pending: dict[str, list[int]] = {}
        self.prefilled: set[str] = set()
        self.finished: list[str] = []
        self.counters = Counters()
        self.per_request: dict[str, Counters] = {}

    def submit(self, request: str, first: int, prompt_len: int, max_tokens: int) -> None:
        prompt = self.truths[first][:prompt_len]
        self.prompts[request] = prompt
        self.limits[request] = prompt_len + max_tokens
        self.handles[request] = SimpleNamespace(
            sampling_params=SimpleNamespace(temperature=0.0), prompt_token_ids=prompt
        )
        self.per_request[request] = Counters()

    def step(self, swap: tuple[int, int] | None = None) -> None:
        batch = self.batch
        # _update_states: finished requests leave, new ones take rows, condense, reorder.
        for request in self.finished:
            batch.remove(request)
            del self.handles[request]
        self.finished = []
        for request in self.handles:
            if request not in batch.slots:
                batch.add(request, self.prompts[request])
        batch.condense()
        if swap is not None:
            batch.swap(*swap)
        for row, request in enumerate(batch.req_ids):
            batch.spec_token_ids[row] = self.pending.pop(request, [])
        # The forward pass and the rejection sampler, greedy against the truth.
        sampled: list[list[int]] = []
        for row, request in enumerate(batch.req_ids):
            n = int(batch.num_tokens_no_spec[row])
            truth = self.truths[int(batch.token_ids_cpu[row, 0])]
            drafts = batch.spec_token_ids[row]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == truth[n + accepted]:
                accepted += 1
            kept = truth[n : n + accepted + 1]
            if drafts:
                for counters in (self.counters, self.per_request[request]):
                    counters.drafts += 1
                    counters.draft_tokens += len(drafts)
                    counters.accepted += accepted
            batch.token_ids_cpu[row, n : n + len(kept)] = kept
            batch.num_tokens_no_spec[row] = n + len(kept)
            sampled.append(kept)
            if n + len(kept) >= self.limits[request]:
                self.finished.append(request)
        if self.clock is not None:
            self.clock.now += self.engine_seconds
        drafts_out = self.controller.step(batch, self.handles, sampled)
        assert len(drafts_out) == len(sampled)
        for request, draft in zip(batch.req_ids, drafts_out, strict=True):
            assert len(draft) <= self.controller.settings.max_k
            self.pending[request] = draft

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def truths() -> dict[int, list[int]]:
    """Five scripted sequences, told apart by their first token."""
    rng = np.random.default_rng(0)
    return {first: [first, *rng.integers(1, 500, size=400).tolist()] for first in range(1, 6)}


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[TraceWriter]:
    with TraceWriter(tmp_path / "trace.jsonl") as trace:
        yield trace


def simulated(
    writer: TraceWriter | None, good: dict[int, int], options: dict[str, Any] | None = None
) -> tuple[FakeEngine, OracleDrafter]:
    """A controller (K <= 4) on a fake clock, with an oracle drafter, in a fake engine."""
    clock = FakeClock()
    drafter = OracleDrafter(truths(), good, clock)
    ctrl = RowController(
        parse_settings(options or {}, 4),
        drafter,
        Monitor(trace=writer),
        max_model_len=4096,
        clock=clock,
    )
    return FakeEngine(ctrl, truths(), clock), drafter


def test_row_steps_credit_each_row_to_the_request_it_holds() -> None:
    batch = FakeBatch()
    batch.add("a", [1, 2])
    batch.add("b", [3, 4, 5])
    batch.spec_token_ids[0] = [7, 8, 9]
    batch.num_tokens_no_spec[:2] = [4, 3]
    steps = row_steps(batch, [[7, 6], []])
    assert steps[1] is None  # a prefill chunk kept nothing
    first = steps[0]
    assert first is not None
    assert (first.request, first.verified, first.accepted, first.kept) == ("a", 3, 1, (7, 6))
    with pytest.raises(ValueError, match="rows"):
        row_steps(batch, [[1]])


def test_request_table_follows_handles_not_rows() -> None:
    opened: list[str] = []
    closed: list[str] = []

    def open_(request: str, handle: object) -> str:
        opened.append(request)
        return f"{request}#{len(opened)}"

    table: RequestTable[str] = RequestTable(open_, lambda r, s: closed.append(s))
    one, two = object(), object()
    assert table.get("a", one) == "a#1"
    assert table.get("a", one) == "a#1"  # same handle: same state
    assert table.get("a", two) == "a#2"  # aborted and sent again under the same id
    assert closed == ["a#1"]
    table.get("b", one)
    assert table.retire({"a": two}) == ["b"]  # b left the worker
    assert table.retire({"a": two}) == []
    table.close_all()
    assert closed == ["a#1", "b#3", "a#2"]


def per_request_trace(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for request in read_trace(path):
        records = [s.record for s in request.steps]
        out[request.request] = {
            "drafts": sum(1 for r in records if r.num_draft_tokens),
            "draft_tokens": sum(r.num_draft_tokens for r in records),
            "accepted": sum(r.accepted for r in records),
            "k": [r.k for r in records],
            "fallbacks": [r.fallback for r in records],
            "ended": request.summary is not None,
        }
    return out


def test_requests_that_finish_out_of_order_and_new_ones_in_their_rows(
    tmp_path: Path, writer: TraceWriter
) -> None:
    # Request "a" (prompt token 1) gets perfect drafts, "b" (2) wrong ones, "c" (3) one
    # right token per draft; "d" and "e" arrive later and take the rows that "a" and "c"
    # free. Rows also swap once.
    engine, _ = simulated(writer, good={1: 99, 2: 0, 3: 1, 4: 99, 5: 0})
    ctrl = engine.controller
    engine.submit("a", 1, prompt_len=5, max_tokens=30)
    engine.submit("b", 2, prompt_len=7, max_tokens=120)
    engine.submit("c", 3, prompt_len=3, max_tokens=40)
    engine.run(3)
    engine.step(swap=(0, 2))
    engine.run(8)
    assert "a" not in engine.handles  # finished first, with the most drafts kept
    engine.submit("d", 4, prompt_len=4, max_tokens=40)
    engine.run(3)
    engine.submit("e", 5, prompt_len=6, max_tokens=20)
    for _ in range(150):
        if not engine.handles:
            break
        engine.step(swap=(0, 1) if len(engine.batch.slots) > 1 and _ % 7 == 0 else None)
    engine.step()  # the worker drops the last finished request
    assert not engine.handles
    ctrl.close()

    trace = per_request_trace(tmp_path / "trace.jsonl")
    assert set(trace) == {"a", "b", "c", "d", "e"}
    for request, counts in engine.per_request.items():
        mine = trace[request]
        assert (mine["drafts"], mine["draft_tokens"], mine["accepted"]) == (
            counts.drafts,
            counts.draft_tokens,
            counts.accepted,
        ), request
        assert mine["ended"]
    totals = engine.counters
    assert sum(t["draft_tokens"] for t in trace.values()) == totals.draft_tokens
    assert sum(t["accepted"] for t in trace.values()) == totals.accepted
    # Each request's policy heard its own steps: perfect drafts raise K to the bound,
    # wrong ones lower it and, after five bad steps, the local fallback holds it at 0.
    assert trace["a"]["accepted"] == trace["a"]["draft_tokens"] > 0
    assert max(trace["a"]["k"]) == 4 and trace["d"]["k"][-1] == 4
    assert trace["b"]["accepted"] == 0
    assert any(f and f.startswith("local:") for f in trace["b"]["fallbacks"])
    assert any(f and f.startswith("local:") for f in trace["e"]["fallbacks"])
    assert 0 < trace["c"]["accepted"] < trace["c"]["draft_tokens"]
    # spectune report reads the trace like one of its own engine's.
    report = analyse_trace(read_trace(tmp_path / "trace.jsonl"))
    assert report.requests == 5
    assert report.snapshot.accepted == totals.accepted


def test_draft_share_check_holds_every_request_and_probes_back(
    tmp_path: Path, writer: TraceWriter
) -> None:
    options = {"global": {"warmup_steps": 2, "probe_every": 4}}
    engine, drafter = simulated(writer, {1: 99, 2: 99}, options)
    ctrl = engine.controller
    engine.submit("a", 1, prompt_len=4, max_tokens=300)
    engine.submit("b", 2, prompt_len=4, max_tokens=300)

    def step(engine_seconds: float) -> list[list[int]]:
        engine.engine_seconds = engine_seconds  # the target's step, between two calls
        engine.step()
        return [engine.pending.get(r, []) for r in engine.batch.req_ids]

    drafter.cost = 0.001  # 2 ms of drafting per 10 ms step: pays
    for _ in range(6):
        assert all(step(0.010))
    assert ctrl.draft_share.held is None
    drafter.cost = 0.01  # 20 ms per 10 ms step
    held_at = None
    for i in range(12):
        drafts = step(0.010)
        if not any(drafts):
            held_at = i
            break
    assert held_at is not None and ctrl.draft_share.holds == 1
    # Held: nobody drafts, until the probe step (every 4th held step) drafts again.
    probes = [bool(any(step(0.010))) for _ in range(10)]
    assert probes.count(True) == 2 and not probes[0]
    assert ctrl.draft_share.held is not None  # each probe cost too much
    drafter.cost = 0.0005
    resumed = [bool(any(step(0.010))) for _ in range(12)]
    assert resumed[-1] and ctrl.draft_share.held is None
    ctrl.close()
    reasons = {
        f for r in per_request_trace(tmp_path / "trace.jsonl").values() for f in r["fallbacks"]
    }
    assert any(f and f.startswith("global: drafting takes") for f in reasons)


def test_draft_share_check_ignores_steps_without_drafts() -> None:
    check = DraftShareCheck(DraftShareConfig(warmup_steps=1))
    for _ in range(10):
        check.observe(5.0, 1.0, drafted=False)
    assert check.check() is None
    check.observe(5.0, 1.0, drafted=True)  # the first measured call: one-time work
    check.observe(0.1, 1.0, drafted=True)
    assert check.check() is None
    check.observe(5.0, 1.0, drafted=True)
    hold = check.check()
    assert hold is not None and hold.max_k == 0 and hold.reason.startswith("global:")


def test_k_stays_within_the_bound_and_the_room_left() -> None:
    settings = parse_settings({"policy": "fixed", "policy_options": {"k": 4}}, 3)
    ctrl = RowController(settings, OracleDrafter(truths(), {1: 99}), Monitor(), max_model_len=12)
    engine = FakeEngine(ctrl, truths())
    engine.submit("a", 1, prompt_len=4, max_tokens=8)  # ends at max_model_len
    lengths = []
    while "a" in engine.handles and not engine.finished:
        engine.step()
        n = int(engine.batch.num_tokens_no_spec[0])
        lengths.append(len(engine.pending["a"]))
        assert lengths[-1] <= max(0, min(3, 12 - n - 1))  # never past the last position
    assert lengths[0] == 3  # the bound, not the policy's k = 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"drafter": "eagle"}, "drafter must be"),
        ({"policy": "cost"}, "needs a cost profile"),
        ({"policy": "greedy"}, "policy must be one of"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"patch_sampler": "yes"}, "patch_sampler"),
        ({"trace_file": "x"}, "unknown spectune option"),
        ({"global": {"max_draft_ratio": 0}}, "max_draft_ratio"),
        ({"policy_options": 3}, "must be a table"),
        ([1], "table of options"),
    ],
)
def test_bad_options_are_one_line_errors(options: Any, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        parse_settings(options, 4)


def test_policy_defaults_follow_the_bound() -> None:
    settings = parse_settings(None, 3)
    assert settings.policy == "threshold" and settings.drafter == "suffix"
    assert settings.policy_options == {"max_k": 3, "initial_k": 3, "checks": ["local"]}
    tuned = parse_settings({"costs": "c.json", "policy_options": {"margin": 0.1}}, 6)
    assert tuned.policy == "cost"
    assert tuned.policy_options["checks"] == [] and tuned.policy_options["margin"] == 0.1


def vllm_config(options: dict[str, Any], k: int = 3) -> Any:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        additional_config={"spectune": options},
        model_config=SimpleNamespace(
            tokenizer="unused", get_vocab_size=lambda: 600, model="fake", max_model_len=1024
        ),
    )


class FakeRunner:
    """Calls the proposer as vLLM's GPUModelRunner.propose_draft_token_ids does."""

    def __init__(self, proposer: SpectuneProposer, batch: FakeBatch) -> None:
        self.proposer, self.input_batch = proposer, batch
        self.requests: dict[str, object] = {}

    def propose_draft_token_ids(self, sampled: list[list[int]]) -> list[list[int]]:
        batch = self.input_batch
        return self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)


def test_the_proposer_reads_request_ids_from_the_runner_that_calls_it(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proposer = SpectuneProposer(vllm_config({"drafter": "ngram", "trace": str(trace)}))
    batch = FakeBatch()
    batch.add("a", [5, 6, 7, 5, 6])
    runner = FakeRunner(proposer, batch)
    runner.requests["a"] = SimpleNamespace(sampling_params=None, prompt_token_ids=[5, 6, 7, 5, 6])
    proposer.load_model(object())
    batch.token_ids_cpu[0, 5] = 7
    batch.num_tokens_no_spec[0] = 6
    assert runner.propose_draft_token_ids([[7]]) == [[5, 6, 7]]  # n-gram: 5 6 7 follows 6 7
    other = FakeBatch()  # a batch the caller does not hold: refused, not guessed
    with pytest.raises(RuntimeError, match="request id"):
        proposer.propose([[1]], other.num_tokens_no_spec, other.token_ids_cpu)
    proposer.close()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(e["event"], e["request"]) for e in events] == [("request", "a"), ("end", "a")]


def test_a_cost_profile_prices_k(tmp_path: Path) -> None:
    profile = tmp_path / "costs.json"
    profile.write_text(
        json.dumps(
            {
                "format": "spectune-step-costs",
                "version": 1,
                "draft_cost": 0.01,
                "verify": [1.0, 1.02, 1.04, 1.06, 1.08],
            }
        )
    )
    settings = parse_settings({"costs": str(profile)}, 4)
    curve = cost_curve_of(str(profile))
    assert curve.relative(2) == pytest.approx(1.04)
    clock = FakeClock()
    ctrl = RowController(
        settings,
        OracleDrafter(truths(), {1: 99}),
        Monitor(),
        max_model_len=4096,
        cost_curve=curve,
        clock=clock,
    )
    engine = FakeEngine(ctrl, truths(), clock)
    engine.submit("a", 1, prompt_len=4, max_tokens=60)
    engine.run(20)
    assert engine.per_request["a"].accepted > 0


class CountingStream(io.StringIO):
    """A text stream that counts its flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_step_puts_its_trace_on_disk_in_one_flush(tmp_path: Path) -> None:
    """Every row's step is on disk when ``step`` returns, written with one flush per
    engine step rather than one per row."""
    stream = CountingStream()
    engine, _ = simulated(TraceWriter(stream, autoflush=False), {1: 99, 2: 0, 3: 2})
    for first, request in enumerate("abc", 1):
        engine.submit(request, first, prompt_len=4, max_tokens=60)
    engine.run(12)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert sum(e["event"] == "step" for e in events) == 3 * 11  # the first step is prefill's
    assert stream.flushes == 12

    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, autoflush=False)
    engine, _ = simulated(writer, {1: 99, 2: 0, 3: 2})
    for first, request in enumerate("abc", 1):
        engine.submit(request, first, prompt_len=4, max_tokens=60)
    engine.run(12)
    on_disk = per_request_trace(path)  # read before the writer closes
    assert {r: len(t["k"]) for r, t in on_disk.items()} == {"a": 11, "b": 11, "c": 11}
    writer.close()


def test_the_proposer_keeps_counters_only_where_they_are_served() -> None:
    proposer = SpectuneProposer(vllm_config({"drafter": "ngram"}))
    assert proposer.controller.monitor.exporter is None
    assert proposer.controller.monitor.trace is None
    proposer.close()


def test_the_no_draft_proposer_drafts_nothing_for_every_row() -> None:
    proposer = NoDraftProposer(vllm_config({}))
    proposer.load_model(object())
    batch = FakeBatch()
    drafts = proposer.propose([[1], [], [2, 3]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert drafts == [[], [], []]


def bench_script() -> Any:
    """scripts/vllm-proposer-bench.py as a module."""
    path = Path(__file__).parents[1] / "scripts" / "vllm-proposer-bench.py"
    spec = importlib.util.spec_from_file_location("vllm_proposer_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "off,spectune-cost"], "spectune-cost needs --costs FILE"),
        (["--methods", "spectune-cost", "--costs", "missing.json"], "cannot read the cost"),
        (["--methods", "off,eagle"], "bad arguments (eagle)"),
        (["--concurrency", "1,x"], "invalid literal"),
        (["--per-cell", "9"], "needs more held-out prompts"),
    ],
)
def test_the_bench_refuses_bad_arguments_in_one_line(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = bench_script()
    monkeypatch.setattr(sys, "argv", ["vllm-proposer-bench.py", *argv])
    assert bench.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("spectune: error: ") and message in err and err.count("\n") == 1


def test_the_bench_runs_the_cost_policy_on_the_given_profile(tmp_path: Path) -> None:
    bench = bench_script()
    trace, costs = tmp_path / "t.jsonl", tmp_path / "costs.json"
    assert bench.proposer_options("off", trace, None) is None
    assert bench.proposer_options("spectune", trace, None) == {"trace": str(trace)}
    options = bench.proposer_options("spectune-cost", trace, costs)
    assert options == {"trace": str(trace), "policy": "cost", "costs": str(costs)}
    config = bench.speculative_config("spectune-cost", 4)
    assert config == bench.speculative_config("spectune", 4)
    assert config["method"] == "custom_class" and config["num_speculative_tokens"] == 4
    assert bench.speculative_config("suffix-default", 4) == {"method": "suffix"}
    empty = bench.speculative_config("empty", 4)
    module, name = empty["model"].rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is NoDraftProposer


# --- live: a real vLLM (make vllm) serving with the proposer -------------------------


# (prompt, max_tokens): sent together, they finish out of order; the last two arrive
# while the first are running and take the rows the short ones free.
LIVE_REQUESTS = (
    ("Count from 1 to 30, separated by commas.", 56),
    ("Name the days of the week, one per line.", 12),
    ("Write a Python function that returns the square of a number.", 40),
    ("Repeat after me: the quick brown fox jumps over the lazy dog.", 8),
    ("List the first ten letters of the alphabet, separated by spaces.", 24),
    ("What is the capital of France? Answer in one sentence.", 16),
)
LIVE_K = 4


@live
def test_vllm_serves_with_the_proposer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    import time

    import httpx

    from spectune.cli import main
    from spectune.engines.hf_folder import convert_target
    from spectune.engines.metrics import read_exposition
    from spectune.engines.process import free_port
    from spectune.engines.vllm import VllmSettings, vllm_server
    from spectune.engines.vllm.options import PROPOSER_CLASS

    target = tmp_path / "target"
    convert_target("default", target)
    with vllm_server(VllmSettings(target), log=tmp_path / "plain.log") as url:
        plain = [chat(url, target, p, n)["choices"][0] for p, n in LIVE_REQUESTS]

    trace, port = tmp_path / "trace.jsonl", free_port()
    spec = {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": LIVE_K}
    options = {"spectune": {"trace": str(trace), "metrics_port": port}}
    settings = VllmSettings(
        target,
        spec,
        extra_args=(
            "--additional-config",
            json.dumps(options),
            "--per-request-spec-decode-metrics",
            "summary",
        ),
    )
    answers: list[dict[str, Any] | None] = [None] * len(LIVE_REQUESTS)

    def send(i: int) -> None:
        prompt, max_tokens = LIVE_REQUESTS[i]
        answers[i] = chat(url, target, prompt, max_tokens)

    with vllm_server(settings, log=tmp_path / "proposer.log") as url:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(LIVE_REQUESTS))]
        for i, thread in enumerate(threads):
            thread.start()
            if i == 3:
                time.sleep(1.0)  # the rest arrive while the first four are decoding
        for thread in threads:
            thread.join()
        counters = read_exposition(httpx.get(url + "/metrics", timeout=30).text).counts
        log = (tmp_path / "proposer.log").read_text(errors="replace")
        assert "sampler skips its recovered-token noise on steps without drafts" in log
        assert main(["watch", f"http://127.0.0.1:{port}", "--once", "--json"]) == 0
        watched = json.loads(capsys.readouterr().out)

    done = [a for a in answers if a is not None]
    assert len(done) == len(LIVE_REQUESTS)
    # Greedy: the proposer changes the speed, never the text.
    assert [a["choices"][0]["message"]["content"] for a in done] == [
        c["message"]["content"] for c in plain
    ]
    assert [a["choices"][0]["finish_reason"] for a in done] == [c["finish_reason"] for c in plain]

    # Per request, the proposer's trace equals vLLM's own per-request counts; in all, its
    # counters equal vLLM's.
    mine = sorted(
        (
            sum(1 for s in r.steps if s.record.num_draft_tokens),
            sum(s.record.num_draft_tokens for s in r.steps),
            sum(s.record.accepted for s in r.steps),
        )
        for r in read_trace(trace)
    )
    metrics = [a["metrics"]["speculative_decoding"] for a in done]
    theirs = sorted(
        (m["num_spec_steps"], m["num_draft_tokens"], m["num_accepted_draft_tokens"])
        for m in metrics
    )
    assert mine == theirs
    assert counters is not None
    totals = tuple(map(sum, zip(*mine, strict=True)))
    assert (counters.steps, counters.num_draft_tokens, counters.accepted) == totals
    assert totals[2] > 0  # counting to 30 repeats itself: drafts get accepted
    assert watched["engine"] == "spectune"
    assert (watched["draft_tokens"], watched["accepted"]) == totals[1:]
