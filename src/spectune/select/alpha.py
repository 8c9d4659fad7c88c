"""Expected acceptance without a decoding loop.

For a draft distribution q and the target's p at the same context, a draft token drawn
from q is accepted with probability sum_v min(p(v), q(v)) (Leviathan et al. 2023, section
3.3). Averaged over the positions of target-generated continuations of a prompt set it is
alpha, the acceptance rate that speculative decoding would see, at the cost of one
teacher-forced pass of each model over each continuation. At temperature 0 both
distributions are one-hot and alpha is the argmax agreement.

Caveat, stated where it applies: a feature drafter is scored with the target's real hidden
states at every position, i.e. as a *first* draft token; its later draft tokens read its
own predicted features and are accepted less often.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.base import Drafter, SequenceScorer, TargetFeatures
from spectune.models.base import LanguageModel
from spectune.sampling import SamplingParams, process_logits

__all__ = ["AlphaEstimate", "Continuation", "estimate_alpha", "make_continuations", "restate"]

TEMPERATURES = (0.0, 0.7, 1.0)


@dataclass(frozen=True)
class Continuation:
    """A prompt and the target's greedy continuation, with the target's states over it."""

    prompt_id: str
    category: str
    tokens: tuple[int, ...]  # prompt + continuation
    prompt_length: int
    hidden: Tensor  # [len(tokens) - 1, hidden] target state at each position but the last
    logits: Tensor  # [len(tokens) - prompt_length, vocab] fp16 target logits, continuation

    @property
    def scored(self) -> range:
        """Positions whose next token is the target's: prompt_length - 1 .. len - 2."""
        return range(self.prompt_length - 1, len(self.tokens) - 1)


@torch.inference_mode()
def restate(target: LanguageModel, continuations: Sequence[Continuation]) -> list[Continuation]:
    """The continuations with the states the target exposes now: a fused feature head
    (``LlamaLM.expose_layers``) loaded after they were made reads several layers."""
    result = []
    for item in continuations:
        cache = target.new_cache(capacity=len(item.tokens))
        out = target.forward(torch.tensor([list(item.tokens[:-1])]), cache)
        hidden = torch.zeros(len(item.tokens) - 1, 0) if out.hidden is None else out.hidden[0]
        result.append(dataclasses.replace(item, hidden=hidden.float()))
    return result


@torch.inference_mode()
def make_continuations(
    target: LanguageModel,
    prompts: Sequence[tuple[str, str, list[int]]],  # (id, category, prompt tokens)
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[Continuation]:
    """Target continuations (greedy by default; sampled at ``temperature`` with ``seed``),
    then one pass over each to record the target's states and logits."""
    engine = SpeculativeEngine(target, None)
    result: list[Continuation] = []
    for index, (prompt_id, category, tokens) in enumerate(prompts):
        params = SamplingParams(
            temperature=temperature, max_tokens=max_new_tokens, seed=seed + index
        )
        generation = engine.run(tokens, params)
        full = tuple(tokens) + tuple(generation.tokens)
        if len(full) - len(tokens) < 1:
            continue
        cache = target.new_cache(capacity=len(full))
        out = target.forward(torch.tensor([list(full[:-1])]), cache)
        if out.hidden is None:
            hidden = torch.zeros(len(full) - 1, 0)
        else:
            hidden = out.hidden[0].float()
        logits = out.logits[0, len(tokens) - 1 :].to(torch.float16)
        result.append(Continuation(prompt_id, category, full, len(tokens), hidden, logits))
    return result


@dataclass(frozen=True)
class AlphaEstimate:
    temperature: float
    overall: float
    positions: int  # positions with a proposal
    per_category: dict[str, float]
    per_category_positions: dict[str, int]
    coverage: float = 1.0  # fraction of positions where the drafter proposed anything


def _draft_rows(
    drafter: Drafter, item: Continuation, params: SamplingParams, vocab: int
) -> tuple[Tensor, Tensor]:
    """(draft distributions [n, vocab], mask [n] of positions with a proposal) over the
    scored positions of one continuation."""
    scored = item.scored
    if isinstance(drafter, SequenceScorer):
        hidden = item.hidden if item.hidden.shape[-1] else None
        rows = drafter.score_sequence(item.tokens, hidden, params)[scored.start : scored.stop]
        return rows, torch.ones(rows.shape[0], dtype=torch.bool)
    # Generic drafters: ask for one token after each prefix (cheap for lookup drafters); the
    # target's recorded states go with it, for a feature head inside (a hybrid's).
    rows = torch.zeros(len(scored), vocab)
    proposed = torch.zeros(len(scored), dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    for i, position in enumerate(scored):
        context = list(item.tokens[: position + 1])
        features = TargetFeatures(0, item.hidden[: position + 1]) if item.hidden.shape[-1] else None
        drafter.reset()
        drafter.commit(context, features)
        draft = drafter.propose(context, 1, params, generator)
        if len(draft) == 0:
            continue
        proposed[i] = True
        if draft.probs is None:
            rows[i, int(draft.tokens[0])] = 1.0
        else:
            rows[i] = draft.probs[0]
    return rows, proposed


def estimate_alpha(
    drafter: Drafter,
    continuations: Sequence[Continuation],
    target: LanguageModel,
    temperatures: Sequence[float] = TEMPERATURES,
) -> list[AlphaEstimate]:
    """alpha per temperature, overall and per category. Positions where a drafter proposes
    nothing (a lookup drafter without a match) are left out: speculation skips them."""
    vocab = target.info.vocab_size
    estimates: list[AlphaEstimate] = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=1)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        scored = 0
        for item in continuations:
            scored += len(item.scored)
            draft_probs, proposed = _draft_rows(drafter, item, params, vocab)
            target_probs = process_logits(item.logits.float(), params)  # [n, vocab]
            overlap = torch.minimum(draft_probs, target_probs).sum(-1)[proposed]  # [m]
            sums[item.category] = sums.get(item.category, 0.0) + float(overlap.sum())
            counts[item.category] = counts.get(item.category, 0) + int(overlap.numel())
        total = sum(counts.values())
        estimates.append(
            AlphaEstimate(
                temperature,
                sum(sums.values()) / total if total else 0.0,
                total,
                {c: sums[c] / counts[c] if counts[c] else 0.0 for c in sorted(sums)},
                dict(sorted(counts.items())),
                total / scored if scored else 0.0,
            )
        )
    return estimates
