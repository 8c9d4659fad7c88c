"""Suffix drafting: the index (longest match, frequency order), the proposal-length rule,
the bounded history, and the drafter end to end (greedy-equal and lossless)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from spectune.control.base import FixedK
from spectune.drafters.suffix import SuffixDrafter, SuffixSettings, propose_from
from spectune.drafters.suffix_index import (
    HistoryStore,
    SuffixIndex,
    continuation,
    scan_matches,
)
from spectune.engine import SpeculativeEngine
from spectune.errors import IncompatibleModelsError, InvalidParameterError, ModelLoadError
from spectune.models.llama import LlamaLM
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
    """An index over the target's own sampled continuations of short prompts."""
    engine = SpeculativeEngine(target)
    docs = []
    for i in range(24):
        params = SamplingParams(temperature=0.8, max_tokens=24, seed=seed + i)
        prompt = [1, 5 + i % 7, 9]
        docs.append(prompt + engine.run(prompt, params).tokens)
    return SuffixIndex.build(docs, vocab_size=target.info.vocab_size, tokenizer="toy")


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_equals_target_alone(toy_target: LlamaLM, k: int) -> None:
    drafter = SuffixDrafter(target_corpus(toy_target, 0))
    greedy = SamplingParams(max_tokens=24)
    accepted = 0
    for prompt in ([1, 5, 9], [1, 9, 9, 12, 30, 9, 9, 12], [3]):
        plain = SpeculativeEngine(toy_target).run(prompt, greedy).tokens
        result = SpeculativeEngine(toy_target, drafter).run(prompt, greedy, policy=FixedK(k))
        assert result.tokens == plain
        accepted += result.accepted
    assert accepted > 0


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
