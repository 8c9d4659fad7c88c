"""Suffix drafting: the index (longest match, frequency order), the proposal-length rule,
the bounded history, and the drafter end to end (greedy-equal and lossless)."""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from spectune.cli import main
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import ModelDrafter, ScriptedDrafter, suffix_history, suffix_kernels
from spectune.drafters.base import Drafter, fresh_drafter
from spectune.drafters.hybrid import HybridDrafter, RateTable, SourceStats, band, right_depths
from spectune.drafters.pairing import Loaded, load_drafter
from spectune.drafters.suffix import SuffixDrafter, SuffixSettings, propose_from
from spectune.drafters.suffix_history import HistoryStore
from spectune.drafters.suffix_index import (
    MAX_OCCURRENCES,
    SuffixIndex,
    continuation,
    scan_matches,
)
from spectune.errors import IncompatibleModelsError, InvalidParameterError, ModelLoadError
from spectune.models.llama import LlamaLM
from spectune.models.shipped import DEFAULT_SUFFIX_INDEX, shipped_suffix_index
from spectune.models.toy import toy_model
from spectune.records import StepRecord
from spectune.sampling import SamplingParams

# Token 9 is followed by 1 three times, by 2 twice, by 3 once; "5 6 9" only by 2.
CORPUS = [
    [9, 1, 4],
    [7, 9, 1, 4, 4],
    [8, 9, 1, 5],
    [5, 6, 9, 2, 7, 7],
    [5, 6, 9, 2, 7, 8],
    [0, 9, 3],
]


def build(docs: list[list[int]], max_depth: int = 8) -> SuffixIndex:
    return SuffixIndex.build(docs, vocab_size=16, tokenizer="test", max_depth=max_depth)


def brute_force_longest(docs: list[list[int]], tail: list[int], max_depth: int) -> int:
    """The longest suffix of ``tail`` that occurs in a document with a token after it."""
    best = 0
    for length in range(1, min(max_depth, len(tail)) + 1):
        want = tail[-length:]
        if any(doc[i : i + length] == want for doc in docs for i in range(len(doc) - length)):
            best = length
    return best


def test_longest_match_and_its_occurrences() -> None:
    index = build(CORPUS)
    match = index.find([4, 4, 5, 6, 9])
    assert match is not None and match.length == 3
    assert sorted(match.tokens[match.ends + 1].tolist()) == [2, 2]
    short = index.find([3, 3, 9])
    assert short is not None and short.length == 1 and len(short.ends) == 6
    assert index.find([15]) is None


def test_index_agrees_with_brute_force_on_random_corpora() -> None:
    rng = np.random.default_rng(5)
    for trial in range(20):
        docs = [rng.integers(0, 4, rng.integers(1, 30)).tolist() for _ in range(12)]
        index = build(docs, max_depth=6)
        for _ in range(30):
            tail = rng.integers(0, 4, rng.integers(1, 10)).tolist()
            match = index.find(tail)
            want = brute_force_longest(docs, tail, 6)
            assert (match.length if match else 0) == want, (trial, tail)
            stream = index.tokens
            scanned = scan_matches(stream, tail, 6)
            assert (scanned.length if scanned else 0) == (match.length if match else 0)
            if match is not None and scanned is not None:
                assert sorted(match.ends.tolist()) == sorted(scanned.ends.tolist())


def test_continuation_follows_frequency() -> None:
    match = build(CORPUS).find([9])
    assert match is not None
    tokens, probs = continuation(match, 3, min_prob=0.0)
    # 9 -> 1 (3 of 6), then 1 -> 4 (2 of those 3), then 4 -> 4 (1 of 6; one doc ends)
    assert tokens == [1, 4, 4]
    assert probs == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    assert continuation(match, 3, min_prob=0.3)[0] == [1, 4]


def test_ties_go_to_the_smaller_token() -> None:
    match = build([[1, 7], [1, 3]]).find([1])
    assert match is not None
    assert continuation(match, 1, 0.0) == ([3], [0.5])


def test_proposal_length_follows_match_length_and_frequency() -> None:
    index = build(CORPUS)
    settings = SuffixSettings(factor=1.0, offset=0.0, min_prob=0.1)
    # one matched token: at most one proposed, whatever K asks
    one = propose_from(index.find([9]), 8, settings, "corpus")
    assert one.tokens == [1] and one.score == pytest.approx(0.5)
    # three matched tokens allow three; the path "2 7" then splits 7/8 -> p = 1/2
    three = propose_from(index.find([5, 6, 9]), 8, settings, "corpus")
    assert three.tokens == [2, 7, 7] and three.probs == pytest.approx([1, 1, 0.5])
    assert propose_from(index.find([5, 6, 9]), 2, settings, "corpus").tokens == [2, 7]
    strict = SuffixSettings(min_prob=0.6)
    assert propose_from(index.find([5, 6, 9]), 8, strict, "corpus").tokens == [2, 7]
    generous = SuffixSettings(factor=0.5, offset=2.0)
    assert len(propose_from(index.find([9]), 8, generous, "corpus").tokens) == 2


def test_drafter_prefers_the_best_scored_source() -> None:
    drafter = SuffixDrafter(build(CORPUS))
    # the context repeats "5 6 9 4": its own match (length 3, p = 1) beats the corpus's "2"
    assert drafter.suggest([5, 6, 9, 4, 0, 5, 6, 9], 3).tokens == [4, 0, 5]
    drafter.reset()
    proposal = drafter.suggest([11, 5, 6, 9], 3)
    assert proposal.source == "corpus" and proposal.tokens == [2, 7, 7]


def test_history_evicts_the_oldest_outputs() -> None:
    history = HistoryStore(max_tokens=10)
    history.add(0, [1, 2, 3, 4])
    history.add(1, [5, 6, 7, 8])
    match = history.find([2], 4)
    assert match is not None and match.tokens[match.ends[0] + 1] == 3
    history.add(2, [9, 10, 11])  # 11 tokens held: the oldest goes
    assert len(history) == 2 and history.num_tokens == 7
    assert history.find([2], 4) is None
    assert history.find([6], 4) is not None


def reference_continuation(
    docs: list[list[int]], tail: list[int], length: int, max_tokens: int, min_prob: float
) -> tuple[list[int], list[float]]:
    """``continuation`` by counting, document by document (no index, no kernel)."""
    want = tail[-length:]
    paths = [
        doc[i + length :]
        for doc in docs
        for i in range(len(doc) - length)
        if doc[i : i + length] == want
    ]
    total, tokens, probs = len(paths), [], []
    for step in range(max_tokens):
        counts: dict[int, int] = {}
        for path in paths:
            if len(path) > step:
                counts[path[step]] = counts.get(path[step], 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda token: (-counts[token], token))
        if counts[best] / total < min_prob:
            break
        tokens.append(best)
        probs.append(counts[best] / total)
        paths = [path for path in paths if len(path) > step and path[step] == best]
    return tokens, probs


def test_continuation_agrees_with_counting_on_random_corpora() -> None:
    rng = np.random.default_rng(11)
    for trial in range(20):
        docs = [rng.integers(0, 3, rng.integers(1, 25)).tolist() for _ in range(10)]
        index = build(docs, max_depth=5)
        for _ in range(20):
            tail = rng.integers(0, 3, rng.integers(1, 8)).tolist()
            match = index.find(tail)
            if match is None:
                continue
            min_prob = float(rng.choice([0.0, 0.2]))
            want = reference_continuation(docs, tail, match.length, 4, min_prob)
            got = continuation(match, 4, min_prob)
            assert got[0] == want[0], (trial, tail)
            assert got[1] == pytest.approx(want[1])


def test_compiled_chain_lookups_equal_match_then_continuation() -> None:
    """The drafter's one-call chain lookups (``scan_chain``, ``SuffixIndex.chain``) propose
    what ``propose_from`` does from the match, including thinned very common tails."""
    rng = np.random.default_rng(8)
    for trial in range(30):
        docs = [rng.integers(0, 3, rng.integers(1, 400)).tolist() for _ in range(8)]
        index = build(docs, max_depth=6)
        settings = SuffixSettings(
            max_depth=6, factor=float(rng.choice([0.5, 1.0])), min_prob=float(rng.choice([0, 0.2]))
        )
        for _ in range(10):
            tail = np.asarray(rng.integers(0, 3, rng.integers(1, 9)), dtype=np.int32)
            k = int(rng.integers(1, 6))
            caps = settings.caps(k)
            for source, chain, match in (
                ("corpus", index.chain(tail, caps, settings.min_prob), index.find(tail)),
                (
                    "context",
                    suffix_kernels.scan_chain(
                        index.tokens,
                        tail,
                        6,
                        len(index.tokens) - 1,
                        caps,
                        settings.min_prob,
                        MAX_OCCURRENCES,
                    ),
                    scan_matches(index.tokens, tail, 6),
                ),
            ):
                want = propose_from(match, k, settings, source)
                length, tokens, probs, _ = chain
                assert tokens == want.tokens, (trial, source)
                assert probs == pytest.approx(want.probs)
                if tokens:
                    assert length == want.match_length


def test_history_index_agrees_with_the_outputs_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past REINDEX_MIN_TOKENS the history is an index plus a scan of the newest outputs;
    its match is the longest among the outputs still held (evicted and replaced ones
    skipped), and it re-indexes a bounded number of times while outputs come and go."""
    monkeypatch.setattr(suffix_history, "REINDEX_MIN_TOKENS", 40)
    rng = np.random.default_rng(3)
    history = HistoryStore(max_tokens=300, max_depth=6)
    held: dict[int, list[int]] = {}
    for key in range(400):
        doc = rng.integers(0, 4, rng.integers(1, 20)).tolist()
        key = int(rng.integers(0, key + 1)) if rng.random() < 0.1 else key  # a replacement
        history.add(key, doc)
        held.pop(key, None)  # a replaced output counts as the newest
        held[key] = doc
        while sum(len(d) for d in held.values()) > 300:
            held.pop(next(iter(held)))
        docs = [history_doc.tolist() for history_doc in history.documents()]
        assert sorted(map(tuple, docs)) == sorted(map(tuple, held.values()))
        tail = rng.integers(0, 4, rng.integers(1, 8)).tolist()
        match = history.find(tail, 6)
        want = brute_force_longest(docs, tail, 6)
        assert (match.length if match else 0) == want, (key, tail)
        # the drafter's one-call chain lookup picks the same match and continues it alike
        settings = SuffixSettings(max_depth=6, min_prob=0.1)
        chain = history.chain(np.asarray(tail, dtype=np.int32), 6, settings.caps(3), 0.1)
        expected = propose_from(match, 3, settings, "history")
        assert (chain[0] if chain else 0) == want
        assert (chain[1] if chain else []) == expected.tokens
        if match is None:
            continue
        for end in match.ends.tolist():  # every occurrence is in an output still held
            seen = match.tokens[end - want + 1 : end + 2].tolist()
            assert any(
                doc[i : i + want + 1] == seen for doc in docs for i in range(len(doc) - want)
            )
    assert 10 <= history.reindexed <= 60  # ~ one per quarter of the store's turnover


def test_server_drafters_file_their_outputs_in_the_shared_history() -> None:
    history = HistoryStore(max_tokens=100)
    first = SuffixDrafter(None, history)
    first.commit([1, 2], None)  # the prompt
    first.commit([1, 2, 7, 8, 9], None)
    own = first.suggest([1, 2, 7, 8, 9, 7], 2)
    assert own.source == "context" and own.tokens == [8]
    del first
    gc.collect()
    second = SuffixDrafter(None, history).fresh()
    second.commit([4, 7, 8], None)
    proposal = second.suggest([4, 7, 8], 4)
    assert proposal.source == "history" and proposal.tokens == [9, 7]
    assert history.documents()[0].tolist() == [7, 8, 9, 7]  # the output, not the prompt


def test_index_round_trip_and_vocabulary_check(tmp_path: Path) -> None:
    index = build(CORPUS)
    path = tmp_path / "index.npz"
    index.save(path)
    loaded = SuffixIndex.load(path)
    assert loaded.header == index.header
    assert loaded.find([5, 6, 9]) is not None
    loaded.check_vocabulary(16, "test", "toy")
    with pytest.raises(IncompatibleModelsError, match="cannot serve 'other'"):
        loaded.check_vocabulary(32, "test", "other")
    with pytest.raises(IncompatibleModelsError):
        loaded.check_vocabulary(16, "another", "other")
    (tmp_path / "bad.npz").write_bytes(b"not an index")
    with pytest.raises(ModelLoadError):
        SuffixIndex.load(tmp_path / "bad.npz")


def test_bad_corpora_are_rejected() -> None:
    with pytest.raises(InvalidParameterError):
        build([[1, -3]])
    with pytest.raises(InvalidParameterError):
        build([[1, 99]])


def target_corpus(target: LlamaLM, seed: int) -> SuffixIndex:
    """An index over the target's own sampled continuations of short prompts (half of them
    the prompt of the losslessness checks, so that their drafts come from the corpus)."""
    from tree_checks import PROMPT

    engine = SpeculativeEngine(target)
    docs = []
    for i in range(24):
        params = SamplingParams(temperature=1.0, max_tokens=24, seed=seed + i)
        prompt = PROMPT if i % 2 else [1, 5 + i % 7, 9]
        docs.append(prompt + engine.run(prompt, params).tokens)
    return SuffixIndex.build(docs, vocab_size=target.info.vocab_size, tokenizer="toy")


def greedy_steps(target: LlamaLM, drafter: Drafter, k: int) -> list[StepRecord]:
    """Assert that greedy decoding of a few prompts with ``drafter`` (K = ``k``) emits the
    target's own greedy tokens, without fallbacks; return the steps."""
    greedy = SamplingParams(max_tokens=24)
    steps: list[StepRecord] = []
    for prompt in ([1, 5, 9], [1, 9, 9, 12, 30, 9, 9, 12], [3]):
        plain = SpeculativeEngine(target).run(prompt, greedy).tokens
        result = SpeculativeEngine(target, drafter).run(prompt, greedy, policy=FixedK(k))
        assert result.tokens == plain
        assert all(step.fallback is None for step in result.steps)
        steps += result.steps
    return steps


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_equals_target_alone(toy_target: LlamaLM, k: int) -> None:
    steps = greedy_steps(toy_target, SuffixDrafter(target_corpus(toy_target, 0)), k)
    assert sum(step.accepted for step in steps) > 0


@pytest.mark.parametrize("runs", [pytest.param(2_000, marks=pytest.mark.slow), 300])
def test_sampling_stays_lossless(toy_target: LlamaLM, runs: int) -> None:
    """First two tokens at T = 1 against the target's exact joint distribution (chi-square
    over the likely pairs, fixed seeds; each size fails by chance with probability 1e-4;
    the 300-run one has less power, not looser odds)."""
    from tree_checks import first_two_tokens_pvalue

    drafter = SuffixDrafter(target_corpus(toy_target, 100))
    pvalue, accepted = first_two_tokens_pvalue(toy_target, drafter, runs=runs, seed=3)
    assert accepted > 0  # drafts were proposed and verified
    assert pvalue > 1e-4, pvalue


def test_hybrid_rule_follows_measured_acceptance() -> None:
    stats = SourceStats(decay=0.5)
    # nothing measured: the corpus at its word, each model position kept half the time
    assert stats.prefers_suffix(0.5, k=1) and not stats.prefers_suffix(0.4, k=1)
    stats.observe_model(1, 1)  # a one-token model draft kept -> first rate 0.75
    assert not stats.prefers_suffix(0.7, k=1) and stats.prefers_suffix(0.75, k=1)
    # A suffix draft scored 2 kept nothing: with the prior (a step of score 1, one kept)
    # the means are 1.5 scored and 0.5 kept, a calibration of 1/3.
    stats.observe_suffix(0, 2.0)
    assert stats.suffix_calibration == pytest.approx(1 / 3)
    assert not stats.prefers_suffix(2.2, k=1) and stats.prefers_suffix(2.25, k=1)


def test_hybrid_calibration_is_a_ratio_of_means() -> None:
    """Low-score drafts kept now and then must not inflate what a unit of score is worth:
    the calibration is the running mean of accepted over the running mean of score (both
    starting at the prior step: score 1, one kept), not the running mean of their ratio."""
    steps = [(1, 0.2), (0, 2.0), (1, 0.2), (0, 2.0), (1, 2.0), (0, 0.2)]
    stats = SourceStats(decay=0.5)
    kept, scored, ratio = 1.0, 1.0, 1.0
    for accepted, score in steps:
        stats.observe_suffix(accepted, score)
        kept, scored = (kept + accepted) / 2, (scored + score) / 2
        ratio = (ratio + accepted / score) / 2
    assert stats.suffix_calibration == pytest.approx(kept / scored)
    assert kept / scored < 0.4 < 0.5 < ratio  # the mean of ratios: 0.53 against 0.36


def test_hybrid_counts_what_the_target_kept(toy_target: LlamaLM) -> None:
    scripted = ScriptedDrafter(lambda context, k: [7, 7, 7], vocab_size=64, with_probs=False)
    hybrid = HybridDrafter(SuffixDrafter(), scripted)
    params = SamplingParams()
    # nothing to match in a context of distinct tokens: the model drafts
    draft = hybrid.propose([1, 2, 3], 3, params, None)
    assert draft.tokens.tolist() == [7, 7, 7]
    hybrid.commit([1, 2, 3, 7, 7, 5], None)  # two kept, then the target's own token
    assert hybrid.stats.model_steps == 1 and hybrid.stats.model_accepted_total == 2


@pytest.mark.parametrize("k", [2, 6])
def test_hybrid_greedy_equals_target_alone(toy_target: LlamaLM, toy_draft: LlamaLM, k: int) -> None:
    # draft_cost fixed: the choices (and so the test) do not depend on the machine's timing
    hybrid = HybridDrafter(
        SuffixDrafter(target_corpus(toy_target, 0)), ModelDrafter(toy_draft), draft_cost=0.0
    )
    greedy = SamplingParams(max_tokens=24)
    for prompt in ([1, 5, 9], [1, 9, 9, 12, 30, 9, 9, 12]):
        plain = SpeculativeEngine(toy_target).run(prompt, greedy).tokens
        result = SpeculativeEngine(toy_target, hybrid).run(prompt, greedy, policy=FixedK(k))
        assert result.tokens == plain
    assert hybrid.stats.suffix_steps > 0 and hybrid.stats.model_steps > 0  # both sources ran


def test_rate_table_learns_decayed_rates_from_a_prior() -> None:
    table = RateTable(decay=0.5)
    assert table.rate(("model", "agree", 3)) == 0.5  # the prior: one right in two
    table.observe(("model", "agree", 3), True)  # (0.5 + 1) / (1 + 1)
    assert table.rate(("model", "agree", 3)) == pytest.approx(0.75)
    table.observe(("model", "agree", 3), False)  # (0.75 + 0) / (1 + 1)
    assert table.rate(("model", "agree", 3)) == pytest.approx(0.375)
    assert table.rate(("model", "differ", 3)) == 0.5  # situations learn apart
    # a chain of two tokens at rates 0.375 then 0.5: 0.375 + 0.375 * 0.5 tokens kept
    chain = table.chain([("model", "agree", 3), ("model-next", 0)])
    assert chain == pytest.approx([0.375, 0.5625])


def test_greedy_rule_learns_each_token_the_committed_context_shows() -> None:
    keys = [("a",), ("b",), ("c",)]
    # two kept, then the target's own token: the third draft token is known wrong
    assert list(right_depths(keys, [7, 8, 9], [7, 8, 5])) == [
        (("a",), True),
        (("b",), True),
        (("c",), False),
    ]
    assert list(right_depths(keys, [7, 8, 9], [6])) == [(("a",), False)]  # nothing after
    assert list(right_depths(keys, [7, 8, 9], [7, 8])) == [(("a",), True), (("b",), True)]
    assert band(None) == -1 and band(0.0) == 0 and band(0.5) == 2 and band(1.0) == 4


def test_greedy_rule_takes_the_suffix_continuation_where_the_sources_agree() -> None:
    """The context repeats "4 5 6 9": after "4 5" the suffix source says "6 9", the model
    "6 1". Where the two agree on "6" and the suffix's continuations have been right, the
    suffix chain goes (its second token is free); the step teaches every situation the
    committed tokens show."""
    scripted = ScriptedDrafter(lambda context, k: [6, 1][:k], vocab_size=64, with_probs=False)
    stats = SourceStats()
    for _ in range(20):  # measured: the suffix's continuations right, the model's wrong
        stats.rates.observe(("suffix-next", 4), True)
        stats.rates.observe(("model-next", -1), False)
    hybrid = HybridDrafter(SuffixDrafter(), scripted, stats, draft_cost=0.0)
    context = [4, 5, 6, 9, 4, 5]
    draft = hybrid.propose(context, 2, SamplingParams(), None)
    assert draft.tokens.tolist() == [6, 9] and draft.parents is None and draft.probs is None
    hybrid.commit([*context, 6, 9, 4], None)
    assert stats.suffix_steps == 1 and stats.suffix_accepted_total == 2
    rates = stats.rates
    right = (1.0 * 0.98 + 1) / (2.0 * 0.98 + 1)  # the prior, decayed, and one right
    assert rates.rate(("model", "agree", -1)) == pytest.approx(right)
    assert ("suffix", "context", 4) in rates.counts  # the suffix alone, learned too
    # the model's "1" was wrong where the target said "9": learned although not drafted
    assert rates.rate(("model-next", -1)) < 0.1


def test_greedy_rule_leaves_the_model_out_where_the_suffix_is_sure() -> None:
    calls: list[int] = []

    def script(context: Sequence[int], k: int) -> list[int]:
        calls.append(k)
        return [6] * k

    stats = SourceStats()
    for _ in range(200):
        stats.rates.observe(("suffix", "context", 4), True)
    hybrid = HybridDrafter(SuffixDrafter(), ScriptedDrafter(script, vocab_size=64), stats)
    draft = hybrid.propose([4, 5, 6, 9, 4, 5], 2, SamplingParams(), None)
    assert draft.tokens.tolist()[0] == 6 and calls == []
    hybrid.propose([1, 2, 3], 2, SamplingParams(), None)  # no suffix draft: the model
    assert calls == [2]


def test_hybrid_with_a_feature_head_is_greedy_equal_and_learns_its_confidence(
    toy_target: LlamaLM, toy_feature_drafter: Drafter
) -> None:
    """The feature head reports its own probability of each greedy token (the greedy rule
    bands its rates by it); decoding stays token-for-token the target's."""
    head = fresh_drafter(toy_feature_drafter)
    prompt = [1, 9, 9, 12, 30, 9, 9, 12]
    hybrid = HybridDrafter(SuffixDrafter(target_corpus(toy_target, 0)), head, draft_cost=0.0)
    greedy = SamplingParams(max_tokens=24)
    for start in ([1, 5, 9], prompt):
        plain = SpeculativeEngine(toy_target).run(start, greedy).tokens
        result = SpeculativeEngine(toy_target, hybrid).run(start, greedy, policy=FixedK(2))
        assert result.tokens == plain
    banded = [key for key in hybrid.stats.rates.counts if key[0] in ("model", "model-next")]
    assert banded and all(key[-1] != -1 for key in banded)  # every one by a confidence


def test_hybrid_sampling_stays_lossless(toy_target: LlamaLM, toy_draft: LlamaLM) -> None:
    """As test_sampling_stays_lossless, with model drafts (with probabilities) and suffix
    drafts (one-hot) mixed: 300 runs, fails by chance with probability 1e-4."""
    from tree_checks import first_two_tokens_pvalue

    hybrid = HybridDrafter(
        SuffixDrafter(target_corpus(toy_target, 100)), ModelDrafter(toy_draft), draft_cost=0.0
    )
    pvalue, accepted = first_two_tokens_pvalue(toy_target, hybrid, runs=300, seed=4)
    assert accepted > 0 and hybrid.stats.suffix_steps > 0 and hybrid.stats.model_steps > 0
    assert pvalue > 1e-4, pvalue


def write_tokens(path: Path, docs: list[list[int]]) -> Path:
    path.write_text("\n".join(json.dumps(doc) for doc in docs) + "\n")
    return path


def test_shipped_index_is_for_the_default_target() -> None:
    path = shipped_suffix_index(DEFAULT_SUFFIX_INDEX)
    assert path is not None and path.stat().st_size < 8 * 2**20  # ships inside the package
    index = SuffixIndex.load(path)
    assert index.header.vocab_size == 49152 and index.header.documents > 0
    with pytest.raises(IncompatibleModelsError, match="cannot serve 'toy'"):
        index.check_vocabulary(64, index.header.tokenizer, "toy")


@pytest.mark.slow
def test_shipped_index_loads_by_name_and_rejects_another_vocabulary(smollm2) -> None:  # type: ignore[no-untyped-def]
    drafter = load_drafter("suffix", smollm2)
    assert isinstance(drafter, SuffixDrafter) and drafter.index is not None
    assert drafter.index.header.documents > 0
    hybrid = load_drafter("hybrid", smollm2)
    assert isinstance(hybrid, HybridDrafter) and hybrid.model.name == "feature:smollm2-draft"
    toy = Loaded(toy_model(0), smollm2.tokenizer, smollm2.path)
    with pytest.raises(IncompatibleModelsError, match="suffix index .* cannot serve"):
        load_drafter("suffix", toy)


@pytest.mark.slow
def test_cli_builds_an_index_and_decoding_with_it_is_greedy_exact(  # type: ignore[no-untyped-def]
    smollm2, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the real model: index the target's own greedy answer, then suffix and hybrid
    decoding of the same prompt reproduce plain decoding token for token (and the suffix
    drafts are accepted: the answer is in the corpus)."""
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "Name three colors."}])
    greedy = SamplingParams(max_tokens=24)
    plain = SpeculativeEngine(smollm2.model).run(prompt, greedy).tokens
    source = write_tokens(tmp_path / "answers.jsonl", [plain])
    out = tmp_path / "index.npz"
    assert main(["suffix-index", str(source), "-o", str(out)]) == 0
    assert "indexed 1 answers" in capsys.readouterr().out
    for spec in (f"suffix:{out}", f"suffix:{out}+smollm2-draft"):
        drafter = load_drafter(spec, smollm2)
        result = SpeculativeEngine(smollm2.model, drafter).run(prompt, greedy, policy=FixedK(4))
        assert result.tokens == plain
        assert result.accepted > 0


def test_cli_rejects_a_bad_corpus_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": "abc"}\n')
    assert main(["suffix-index", str(bad), "-o", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectune: error:") and err.count("\n") == 1
    assert main(["suffix-index", str(tmp_path / "missing"), "-o", str(tmp_path / "x.npz")]) == 2


def test_served_requests_draft_from_earlier_outputs() -> None:
    """The history experiment on toy models: repeated greedy requests are drafted from the
    first round's outputs, so the second window accepts more than the first, and more
    than the same run without history."""
    from spectune.experiments.common import toy_setup
    from spectune.experiments.history import history_acceptance

    setup = dataclasses.replace(toy_setup(num_prompts=3), draft=SuffixDrafter())
    kwargs = {"requests": 6, "window": 3, "max_tokens": 16}
    first, second = history_acceptance(setup, history_tokens=10_000, **kwargs)
    _, control = history_acceptance(setup, history_tokens=0, **kwargs)
    assert second.accepted > first.accepted and second.accepted > control.accepted
    assert second.mean_accepted_length > control.mean_accepted_length
    assert second.label == "requests 4-6"
    # the lookup cost per drafting step is measured and reported with the window
    assert second.draft_ms_mean > 0 and second.draft_ms_p99 > 0 and second.target_ms_mean > 0
    assert second.as_dict()["draft_over_target"] == round(second.draft_over_target, 5)


def test_server_drafts_from_earlier_requests(toy_target: LlamaLM, tmp_path: Path) -> None:
    """Through the HTTP server (batched engine, one drafter per request): the first
    request's output is filed in the history when it ends, and a repeat of the request is
    drafted from it, greedy-exact, with more accepted tokens."""
    import openai

    from spectune.server import create_app
    from spectune.server.engines import DraftSource, EngineSettings
    from spectune.server.testing import running_server, toy_service, toy_tokenizer

    tokenizer = toy_tokenizer(tmp_path / "tokenizer")
    history = HistoryStore(max_tokens=4096)
    service = toy_service(
        toy_target,
        tokenizer,
        draft=DraftSource(SuffixDrafter(None, history)),
        engine=EngineSettings(capacity=256),
    )
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        first, second = (
            client.completions.create(model="toy", prompt="w1 w7 w3", max_tokens=24, temperature=0)
            for _ in range(2)
        )
    assert first.choices[0].text == second.choices[0].text
    plain = SpeculativeEngine(toy_target).run(
        tokenizer.encode("w1 w7 w3"), SamplingParams(max_tokens=24)
    )
    assert first.choices[0].text == tokenizer.decode(plain.tokens)
    assert history.added >= 1
    accepted = [(r.usage.model_extra or {})["accepted"] for r in (first, second) if r.usage]
    assert accepted[1] > accepted[0]
