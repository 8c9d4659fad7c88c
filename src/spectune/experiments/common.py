"""What every experiment needs: a target, a draft model, prompts, and a timed decode.

``load_setup`` builds the real configuration (the default target, a draft given by path,
shipped name, or ``layers:N`` for the target's first N layers as a stand-in draft, and the
evaluation prompts); ``toy_setup`` builds a seconds-long one from the toy models, for
tests and for checking that a command runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from spectune.control.base import FixedK, KPolicy
from spectune.decode.engine import Generation, SpeculativeEngine
from spectune.drafters.base import Drafter, DraftSource
from spectune.drafters.batched import batch_source
from spectune.drafters.model import ModelDrafter
from spectune.drafters.pairing import fresh_drafter, load_drafter_at, load_target_at
from spectune.errors import InvalidParameterError
from spectune.models.base import (
    KVCache,
    LanguageModel,
    ModelInfo,
    ModelOutput,
    takes_tree_masks,
)
from spectune.models.llama import LlamaLM, LlamaTransformer
from spectune.models.shipped import shipped_drafts
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.prompts import load_prompts
from spectune.records import CountsReport, SpecCounts, ratio
from spectune.sampling import SamplingParams

__all__ = [
    "CountingModel",
    "DecodeStats",
    "Setup",
    "decode_prompts",
    "load_setup",
    "stand_in_draft",
    "toy_setup",
    "truncated_draft",
]


# Requests whose answers run long (the evidence report's "acceptance falls late in long
# outputs" needs outputs of 512+ tokens; the evaluation prompts' answers end sooner).
LONG_FORM_REQUESTS: tuple[tuple[str, str], ...] = (
    (
        "long-guide",
        "Write a detailed guide of at least 800 words on starting a vegetable garden: the "
        "site, the soil, choosing seeds, watering, pests and the harvest, one section each.",
    ),
    (
        "long-story",
        "Write a long story, at least 800 words, about a lighthouse keeper who finds a "
        "message in a bottle.",
    ),
    (
        "long-explain",
        "Explain thoroughly, step by step and in at least 800 words, how a computer runs a "
        "program, from the source code to the instructions the CPU executes.",
    ),
    (
        "long-code",
        "Write a complete Python module for a to-do list manager with functions to add, "
        "remove, list, save and load tasks, with docstrings, type hints and an example.",
    ),
    (
        "long-essay",
        "Write an essay of at least 800 words on the causes and the consequences of the "
        "Industrial Revolution.",
    ),
    (
        "long-math",
        "Solve these problems and show every step: (1) A train travels 240 km in 3 hours; "
        "what is its speed? (2) What is 15% of 360? (3) A rectangle is 12 m by 7 m; what "
        "are its area and perimeter? (4) If 3x + 7 = 31, what is x? (5) A shop sells pens "
        "at 3 for $2; how much do 27 pens cost?",
    ),
)


@dataclass(frozen=True)
class Setup:
    target: LanguageModel
    draft: Drafter  # the chain drafter (a draft model's or a feature head's); never shared:
    # experiments take a ``fresh_drafter`` copy per decode
    prompts: tuple[tuple[str, tuple[int, ...]], ...]  # (prompt id, token ids)
    description: str
    stand_in: bool = False  # toy models or an untrained stand-in draft: nothing to record
    categories: tuple[str, ...] = ()  # per prompt, in order; () where unknown
    # Requests for long answers (the evidence's long-output rule); () where none: the
    # experiments that need them use ``prompts`` instead.
    long_prompts: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def fresh_drafter(self) -> Drafter:
        """A drafter with the draft's weights and its own (empty) state."""
        return fresh_drafter(self.draft)

    def batch_draft(self) -> DraftSource:
        """What ``BatchEngine`` takes: the draft model or feature drafter itself (batched
        drafting), or per-sequence drafters (``batch_source``)."""
        return batch_source(self.draft)


@dataclass(frozen=True)
class DecodeStats(CountsReport):
    """Totals over a prompt set for one decoding configuration: the counters of every
    step (``SpecCounts``), from which every rate here is derived, plus draft timings."""

    label: str
    counts: SpecCounts
    # Per drafting step (k > 0): the drafter's time (for suffix drafting, the lookup), mean
    # and 99th percentile in ms, and the mean target time of a step in ms (0: no steps).
    draft_ms_mean: float = 0.0
    draft_ms_p99: float = 0.0
    target_ms_mean: float = 0.0

    @property
    def tokens(self) -> int:
        return self.counts.emitted

    @property
    def steps(self) -> int:
        return self.counts.steps

    @property
    def target_tokens(self) -> int:
        """Tokens the target forwarded in decode steps (its verification work): each step
        the pending token and every draft token (a tree: every node)."""
        return self.counts.num_draft_tokens + self.counts.steps

    @property
    def decode_seconds(self) -> float:
        return self.counts.step_time

    @property
    def draft_over_target(self) -> float:
        """Mean draft time per drafting step over the mean target time per step."""
        return self.draft_ms_mean / self.target_ms_mean if self.target_ms_mean > 0 else 0.0

    @property
    def acceptance(self) -> float:
        """``acceptance_rate``, under the name the experiments publish."""
        return self.acceptance_rate

    @property
    def target_tokens_per_step(self) -> float:
        return ratio(self.target_tokens, self.steps) or 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "label": self.label,
            "tokens": self.tokens,
            "steps": self.steps,
            "drafted": self.drafted,
            "positions": self.counts.positions,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "target_tokens_per_step": round(self.target_tokens_per_step, 3),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "decode_seconds": round(self.decode_seconds, 4),
            "draft_ms_mean": round(self.draft_ms_mean, 4),
            "draft_ms_p99": round(self.draft_ms_p99, 4),
            "target_ms_mean": round(self.target_ms_mean, 3),
            "draft_over_target": round(self.draft_over_target, 5),
        }


class CountingModel:
    """A ``LanguageModel`` wrapper that counts the tokens its forwards process."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.tokens_forwarded = 0

    @property
    def info(self) -> ModelInfo:
        return self.model.info

    @property
    def tree_masks(self) -> bool:
        return takes_tree_masks(self.model)

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> KVCache:
        return self.model.new_cache(batch_size, capacity)

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk]
        cache: KVCache,
        *,
        positions: Tensor | None = None,
        chunk_mask: Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        self.tokens_forwarded += int(tokens.numel())
        return self.model.forward(
            tokens, cache, positions=positions, chunk_mask=chunk_mask, last_only=last_only
        )


def truncated_draft(model: LlamaLM, num_layers: int) -> LlamaLM:
    """The target's first ``num_layers`` blocks with its final norm and head: a draft that
    needs no training and shares the vocabulary (a stand-in until a trained draft exists)."""
    cfg = model.net.cfg
    if not 1 <= num_layers < cfg.num_layers:
        raise InvalidParameterError(f"layers:N needs 1 <= N < {cfg.num_layers}, got {num_layers}")
    small = dataclasses.replace(cfg, num_layers=num_layers, name=f"{cfg.name}-first{num_layers}")
    net = LlamaTransformer(small)
    state = {
        k: v
        for k, v in model.net.state_dict().items()
        if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers
    }
    net.load_state_dict(state)
    net.to(model.dtype)
    return LlamaLM(net, name=small.name)


def stand_in_draft(target: LanguageModel, ref: str) -> LanguageModel:
    """Drafts that need no training, for when no trained draft exists yet:
    ``layers:N`` (the target's first N blocks; agrees rarely without training) and
    ``noise:X`` (the target with relative noise X on every weight; agrees often but costs
    as much as the target, so only its acceptance figures mean anything)."""
    if not isinstance(target, LlamaLM):
        raise InvalidParameterError(f"{ref} drafts need the native runtime")
    kind, _, value = ref.partition(":")
    try:
        if kind == "layers":
            return truncated_draft(target, int(value))
        if kind == "noise":
            return perturbed(target, float(value))
    except ValueError as exc:
        raise InvalidParameterError(f"bad stand-in draft {ref!r}: {exc}") from exc
    raise InvalidParameterError(f"unknown stand-in draft {ref!r} (layers:N or noise:X)")


def load_setup(
    target_ref: str = "default",
    draft_ref: str = "auto",
    *,
    per_category: int = 1,
    split: str | None = "dev",
    any_drafter: bool = False,
    precision: str = "fp32",
) -> Setup:
    """The real configuration: target, draft model, and the evaluation prompts (chat
    template applied), ``per_category`` prompts of each category. ``draft_ref``: a path or
    shipped draft name, ``auto`` (the first shipped draft), or a stand-in (``layers:N``,
    ``noise:X``); with ``any_drafter`` also ``ngram``, ``suffix``, ``hybrid``.
    ``precision``: how the target runs (``TARGET_PRECISIONS``)."""
    target = load_target_at(target_ref, precision)
    if draft_ref == "auto":
        shipped = shipped_drafts()
        if not shipped:
            raise InvalidParameterError(
                "no shipped draft yet: pass --draft PATH, or a stand-in (noise:0.05, layers:N)"
            )
        draft_ref = shipped[0]
    draft: Drafter | None
    if draft_ref.startswith(("layers:", "noise:")):
        draft = ModelDrafter(stand_in_draft(target.model, draft_ref))
    else:
        draft = load_drafter_at(draft_ref, target, precision)
        # Learned drafters (a draft model, a feature head) are the drafters that are sources.
        if draft is None or not (any_drafter or isinstance(draft, DraftSource)):
            raise InvalidParameterError(
                "experiments need a draft model or feature head, not 'ngram' or 'none'"
            )
    prompts = load_prompts(split=split, limit_per_category=per_category)
    encoded = tuple((p.id, tuple(p.tokens(target.tokenizer))) for p in prompts)
    long_prompts = tuple(
        (name, tuple(target.tokenizer.encode_chat([{"role": "user", "content": text}])))
        for name, text in LONG_FORM_REQUESTS
    )
    description = f"{target.model.info.name} + {draft.name}"
    if precision != "fp32":
        description += f" ({precision})"
    return Setup(
        target.model,
        draft,
        encoded,
        description,
        stand_in=draft_ref.startswith(("layers:", "noise:")),
        categories=tuple(p.category for p in prompts),
        long_prompts=long_prompts,
    )


def toy_setup(num_prompts: int = 4) -> Setup:
    """Toy target and perturbed draft (no EOS, so runs have a fixed length). The prompts
    alternate between two made-up categories, ``chat`` and ``code``, so per-category
    reports have something to split."""
    config = dataclasses.replace(toy_config(), eos_token_ids=())
    target = toy_model(0, config=config, scale=3.0)
    draft = perturbed(target, 0.3)
    generator = torch.Generator().manual_seed(0)
    prompts = tuple(
        (f"toy-{i}", tuple(torch.randint(3, 64, (3 + 2 * i,), generator=generator).tolist()))
        for i in range(num_prompts)
    )
    return Setup(
        target,
        ModelDrafter(draft),
        prompts,
        "toy target + perturbed draft",
        stand_in=True,
        categories=tuple(("chat", "code")[i % 2] for i in range(num_prompts)),
    )


def decode_prompts(
    setup: Setup,
    label: str,
    drafter_factory: Callable[[], Drafter | None],
    params: SamplingParams,
    k: int,
    *,
    verify_groups: int = 1,
    seed: int = 0,
    policy_factory: Callable[[], KPolicy] | None = None,
    on_generation: Callable[[Generation], None] | None = None,
) -> DecodeStats:
    """Decode every prompt (fresh drafter each, seeded generator each) and add up. K is
    ``k`` on every step unless ``policy_factory`` gives each prompt its own policy;
    ``on_generation`` sees every finished generation (its per-step records)."""
    counts = SpecCounts()
    draft_times: list[float] = []  # seconds, per drafting step
    target_times: list[float] = []  # seconds, per step
    for index, (_, prompt) in enumerate(setup.prompts):
        engine = SpeculativeEngine(setup.target, drafter_factory(), verify_groups=verify_groups)
        generator = torch.Generator().manual_seed(seed + index)
        policy = FixedK(k) if policy_factory is None else policy_factory()
        gen = engine.run(list(prompt), params, policy=policy, generator=generator)
        if on_generation is not None:
            on_generation(gen)
        counts.merge(gen.counts)
        draft_times.extend(s.draft_time for s in gen.steps if s.k > 0)
        target_times.extend(s.target_time for s in gen.steps)
    draft_ms = np.asarray(draft_times) * 1e3
    return DecodeStats(
        label,
        counts,
        draft_ms_mean=float(draft_ms.mean()) if draft_ms.size else 0.0,
        draft_ms_p99=float(np.percentile(draft_ms, 99)) if draft_ms.size else 0.0,
        target_ms_mean=float(np.mean(target_times)) * 1e3 if target_times else 0.0,
    )
