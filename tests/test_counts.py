"""``SpecCounts``: the one set of counters, and the rates derived from it."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from spectune.cli.generate import summary
from spectune.control.replay import fake_record
from spectune.decode.engine import Generation
from spectune.models.tokenizer import Tokenizer
from spectune.monitor import Monitor
from spectune.records import SpecCounts, ratio
from spectune.sampling import SamplingParams
from spectune.server.output import TextAssembler
from spectune.server.routes import usage_of
from spectune.server.service import Prepared


def test_counts_add_up_records_and_derive_rates() -> None:
    records = [
        fake_record(4, 4, draft_time=0.1, target_time=0.3),  # 4 of 4, emits 5
        fake_record(4, 1, draft_time=0.1, target_time=0.3, fallback="local: low"),  # 1 of 4
        fake_record(2, 0, num_draft_tokens=0, target_time=0.1, emitted=1),  # nothing drafted
    ]
    counts = SpecCounts.of(records)
    assert (counts.steps, counts.num_draft_tokens, counts.positions) == (3, 8, 8)
    assert (counts.accepted, counts.emitted, counts.rejections) == (5, 8, 1)
    assert counts.fallback_steps == 1
    assert counts.acceptance_rate == pytest.approx(5 / 8)
    assert counts.accepted_length == pytest.approx((5 + 3) / 3)
    assert counts.tokens_per_step == pytest.approx(8 / 3)
    assert counts.draft_share == pytest.approx(0.2 / 0.9)
    assert counts.tokens_per_second == pytest.approx(8 / 0.9)
    assert counts.fallback_frequency == pytest.approx(1 / 3)
    assert counts.tested_at == [2, 2, 2, 2]
    assert counts.accepted_at == [2, 1, 1, 1]
    assert counts.acceptance_by_position == (1.0, 0.5, 0.5, 0.5)


def test_a_tree_step_counts_nodes_and_positions_apart() -> None:
    tree = dataclasses.replace(fake_record(3, 2, num_draft_tokens=8), tree_depth=3)
    counts = SpecCounts.of([tree])
    assert (counts.num_draft_tokens, counts.positions, counts.accepted) == (8, 3, 2)
    assert counts.acceptance_rate == pytest.approx(2 / 3)  # not 2 / 8: at most 3 can be kept
    assert counts.rejections == 1 and counts.tested_at == [1, 1, 1]


def test_merge_equals_counting_both_streams() -> None:
    first = [fake_record(2, 2), fake_record(6, 3, draft_time=0.2)]
    second = [fake_record(4, 0, fallback="cost: slow"), fake_record(1, 1)]
    merged = SpecCounts.of(first)
    merged.merge(SpecCounts.of(second))
    both = SpecCounts.of(first + second)
    times = ("draft_time", "target_time", "step_time")  # summed in another order
    for name in times:
        assert getattr(merged, name) == pytest.approx(getattr(both, name))
    untimed = dataclasses.replace(merged, draft_time=0.0, target_time=0.0, step_time=0.0)
    assert untimed == dataclasses.replace(both, draft_time=0.0, target_time=0.0, step_time=0.0)
    short = SpecCounts.of(second)  # shorter per-position lists grow too
    short.merge(SpecCounts.of(first))
    assert short.tested_at == merged.tested_at and short.accepted_at == merged.accepted_at


def test_rates_are_none_where_undefined() -> None:
    empty = SpecCounts()
    assert empty.acceptance_rate is None and empty.accepted_length is None
    assert empty.tokens_per_step is None and empty.tokens_per_second is None
    assert empty.draft_share is None and empty.fallback_frequency is None
    plain = SpecCounts.of([fake_record(0, 0, target_time=0.1)])
    assert plain.acceptance_rate is None and plain.tokens_per_step == 1.0
    assert ratio(1, 0) is None and ratio(0, 2) == 0.0


def test_drop_emitted_takes_back_cut_tokens() -> None:
    counts = SpecCounts.of([fake_record(4, 4)])
    counts.drop_emitted(2)
    assert counts.emitted == 3 and counts.tokens_per_step == 3.0
    assert counts.accepted_length == 5.0  # before truncation: unchanged
    with pytest.raises(ValueError, match="cannot drop"):
        counts.drop_emitted(4)


def test_generation_reports_its_counts() -> None:
    tree = dataclasses.replace(fake_record(3, 2, num_draft_tokens=8, draft_time=0.5), tree_depth=3)
    gen = Generation(prompt_tokens=[1])
    for record in (tree, fake_record(4, 1, target_time=0.5), fake_record(2, 2, emitted=1)):
        gen.add(record)
    assert gen.counts == SpecCounts.of(gen.steps)
    assert (gen.drafted, gen.accepted) == (14, 5)  # drafted: the tree's 8 nodes + 4 + 2
    assert gen.acceptance_rate == pytest.approx(5 / 9)  # over positions: 3 + 4 + 2
    assert gen.mean_accepted_length == pytest.approx(len(gen.tokens) / 3) == pytest.approx(6 / 3)
    assert gen.tokens_per_second == pytest.approx(6 / gen.decode_time)
    empty = Generation(prompt_tokens=[1])
    assert (empty.acceptance_rate, empty.mean_accepted_length, empty.tokens_per_second) == (0, 0, 0)


def test_every_report_publishes_the_same_figures() -> None:
    """One stream of steps (a chain, a tree, a plain fallback step, a truncated last step)
    read by the CLI's summary, the server's usage, the monitor and Prometheus: the same
    counts and rates under their published names, so none can drift from the others."""
    records = [
        fake_record(4, 2, draft_time=0.02, target_time=0.05, index=0),
        dataclasses.replace(fake_record(3, 3, num_draft_tokens=7, index=1), tree_depth=3),
        fake_record(0, 0, fallback="local: low acceptance", index=2),
        dataclasses.replace(fake_record(4, 4, emitted=2, index=3), finish_reason="length"),
    ]
    gen = Generation(prompt_tokens=[1])
    registry = CollectorRegistry()
    watch = Monitor(registry=registry).request()
    assembler = TextAssembler(Tokenizer(_Words()), ())
    for record in records:
        gen.add(record)
        watch.observe(record)
        assembler.push(record)
    counts = SpecCounts.of(records)
    cli = summary(gen, watch)
    prepared = Prepared((1, 2), SamplingParams(), None, False, False)
    usage = usage_of(prepared, assembler, speculation=True)
    snap = watch.snapshot()
    # Positions: 4 + 3 (the tree's depth) + 0 + 4; draft tokens: 4 + 7 nodes + 0 + 4.
    assert (counts.positions, counts.num_draft_tokens, counts.accepted) == (11, 15, 9)
    assert (cli["steps"], cli["drafted"], cli["positions"]) == (4, 15, 11)
    assert cli["accepted"] == usage["accepted"] == snap.accepted == 9
    assert usage["drafted"] == snap.drafted == 11  # positions, under the name "drafted"
    rate = round(9 / 11, 4)
    assert cli["acceptance_rate"] == usage["acceptance_rate"] == rate
    assert snap.total.acceptance_rate == pytest.approx(9 / 11)
    # Tokens per step after truncation (CLI, server) and accepted + 1 before it (monitor).
    assert cli["mean_accepted_length"] == round(usage["mean_accepted_length"], 3) == 2.5
    assert usage["completion_tokens"] == cli["tokens"] == 10
    assert snap.total.mean_accepted_length == pytest.approx((9 + 4) / 4)
    assert cli["rejections"] == snap.rejections == counts.rejections == 1
    assert usage["fallbacks"] == 1 and usage["steps"] == 4
    value = registry.get_sample_value
    assert value("spectune_spec_decode_num_draft_tokens_total") == 11
    assert value("spectune_spec_decode_num_accepted_tokens_total") == 9
    assert value("spectune_spec_decode_num_emitted_tokens_total") == 10
    assert value("spectune_spec_decode_acceptance_rate") == pytest.approx(9 / 11)
    # Without spec usage (serve --no-spec-usage) the block is OpenAI's alone, the counts intact.
    assert usage_of(prepared, assembler, speculation=False) == {
        key: usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    assert set(usage) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "steps",
        "fallbacks",
        "fallback_reasons",
    }


class _Words:
    """Token id n decodes to the word ``wn`` (all ``TextAssembler`` asks of a tokenizer)."""

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{t}" for t in tokens)
