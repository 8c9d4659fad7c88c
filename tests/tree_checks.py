"""Checks shared by the tests of trees drafted by a model and by a feature head: greedy
exactness, width-1 trees against chains, and end-to-end losslessness (decode the first two
tokens of a fixed prompt many times and compare their joint counts with the target's exact
p(t1) p(t2 | t1) by a chi-square test)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from scipy import stats

from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.base import Drafter
from spectune.drafters.tree import TreeShape
from spectune.models.llama import LlamaLM
from spectune.sampling import SamplingParams

PROMPT = [1, 5, 9, 13, 7]


def first_two_tokens_pvalue(
    target: LlamaLM, drafter: Drafter, *, runs: int, seed: int, k: int = 2
) -> tuple[float, int]:
    """(chi-square p-value over the likely (t1, t2) pairs, expected count >= 5 and the rest
    pooled; draft tokens accepted over all runs). Temperature 1, fixed seed."""
    params = SamplingParams(temperature=1.0, max_tokens=2)
    vocab = target.info.vocab_size
    # Exact target distributions: p(t1), and p(t2 | t1) for every t1 in one batch.
    cache = target.new_cache(capacity=16)
    first = target.forward(torch.tensor([PROMPT]), cache).logits[0, -1].softmax(-1).double()
    batch = torch.tensor([PROMPT + [t] for t in range(vocab)])
    second = target.forward(batch, target.new_cache(vocab, 16)).logits[:, -1]
    expected = first[:, None] * second.softmax(-1).double() * runs  # [vocab, vocab]
    engine = SpeculativeEngine(target, drafter)
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    accepted = 0
    for _ in range(runs):
        gen = engine.run(PROMPT, params, policy=FixedK(k), generator=generator)
        # A first token that ends the text (EOS) has no second: any cell of its row will
        # do, the row's expected counts (p(EOS) * runs in all) all fall in the pooled cell.
        second_token = gen.tokens[1] if len(gen.tokens) > 1 else 0
        counts[gen.tokens[0], second_token] += 1
        accepted += gen.accepted
    likely = expected >= 5
    observed = torch.cat((counts[likely], counts[~likely].sum().view(1)))
    wanted = torch.cat((expected[likely], expected[~likely].sum().view(1)))
    result = stats.chisquare(observed.numpy(), (wanted / wanted.sum() * runs).numpy())
    return float(result.pvalue), accepted


def greedy_tree_accepted(
    target: LlamaLM,
    make_tree: Callable[[], Drafter],
    shape: TreeShape,
    prompts: Sequence[list[int]],
) -> int:
    """Assert that tree speculation (depth 4) emits the target's greedy tokens for every
    prompt, without fallbacks and within the node budget; return the tokens accepted."""
    params = SamplingParams(max_tokens=40)
    accepted = 0
    for prompt in prompts:
        plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
        gen = SpeculativeEngine(target, make_tree()).run(prompt, params, policy=FixedK(4))
        assert gen.tokens == plain
        assert all(s.fallback is None for s in gen.steps)
        assert max(s.num_draft_tokens for s in gen.steps) <= shape.nodes
        accepted += gen.accepted
    return accepted


def assert_width_one_tree_is_the_chain(
    target: LlamaLM,
    make_chain: Callable[[], Drafter],
    make_tree: Callable[[], Drafter],
    temperature: float,
    prompts: Sequence[list[int]],
) -> None:
    """Same tokens and the same (num_draft_tokens, accepted) per step, with the same seeds
    (K = 3)."""
    params = SamplingParams(temperature=temperature, max_tokens=40)
    for seed, prompt in enumerate(prompts):
        runs = [
            SpeculativeEngine(target, make()).run(
                prompt, params, policy=FixedK(3), generator=torch.Generator().manual_seed(seed)
            )
            for make in (make_chain, make_tree)
        ]
        assert runs[1].tokens == runs[0].tokens
        assert [(s.num_draft_tokens, s.accepted) for s in runs[1].steps] == [
            (s.num_draft_tokens, s.accepted) for s in runs[0].steps
        ]
