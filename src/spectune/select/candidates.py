"""Turning candidate specs (paths, GGUF files, HF folders, shipped names, ``ngram``) into
drafters, or into a reason why they cannot serve the target. Never raises for a bad
candidate: selection lists it with its reason and goes on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.drafters.base import Drafter
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.loading import (
    feature_drafter_from_folder,
    read_draft_meta,
)
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.pairing import (
    Loaded,
    draft_tokenizer,
    identity_problems,
    is_suffix_spec,
    load_drafter,
    paired_model_drafter,
    pairing_problems,
)
from spectune.errors import SpectuneError
from spectune.models.facts import model_facts
from spectune.models.loading import load_model, resolve_model_path
from spectune.models.quant import PRECISIONS, Precision

__all__ = ["Candidate", "SizeBand", "resolve_candidate", "size_band"]

# The seed's band for draft/target parameter ratios.
GOOD_RATIO = (1 / 10, 1 / 4)
SMALL_RATIO = 1 / 20


@dataclass(frozen=True)
class SizeBand:
    ratio: float | None
    verdict: str  # "good" | "small" | "very small" | "large" | "n/a"
    warning: str | None


def size_band(draft_parameters: int | None, target_parameters: int) -> SizeBand:
    if not draft_parameters:
        return SizeBand(None, "n/a", None)
    ratio = draft_parameters / target_parameters
    if ratio < SMALL_RATIO:
        return SizeBand(
            ratio, "very small", "under 1/20 of the target: acceptance usually drops below 50%"
        )
    if ratio < GOOD_RATIO[0]:
        return SizeBand(ratio, "small", None)
    if ratio > GOOD_RATIO[1]:
        return SizeBand(ratio, "large", "over 1/4 of the target: drafting cost tends to dominate")
    return SizeBand(ratio, "good", None)


@dataclass(frozen=True)
class Candidate:
    spec: str
    kind: str  # "ngram" | "suffix" | "model" | "distilled-lm" | "feature" | "unknown"
    drafter: Drafter | None  # None when incompatible or unloadable
    num_parameters: int | None  # parameters a draft step computes with
    problems: tuple[str, ...]  # why it cannot serve the target (empty: compatible)

    @property
    def compatible(self) -> bool:
        return self.drafter is not None and not self.problems


def _suffix_candidate(
    spec: str,
    target: Loaded,
    trust_draft_vocab: bool,
    precision: Precision,
    device: torch.device | str,
    runtime: str,
) -> Candidate:
    drafter = load_drafter(
        spec,
        target,
        trust_draft_vocab=trust_draft_vocab,
        dtype=precision.dtype,
        quantize=precision.quantize,
        device=device,
        runtime=runtime,
    )
    inner = drafter.model if isinstance(drafter, HybridDrafter) else None
    # What a draft step computes with: the hybrid's draft model (a lookup: nothing).
    count = inner.model.info.num_parameters if isinstance(inner, ModelDrafter) else None
    return Candidate(spec, "suffix", drafter, count, ())


def resolve_candidate(
    spec: str,
    target: Loaded,
    *,
    trust_draft_vocab: bool = False,
    precision: Precision = PRECISIONS["fp32"],
    device: torch.device | str = "cpu",
    runtime: str = "auto",
) -> Candidate:
    if spec == "ngram":
        return Candidate(spec, "ngram", NgramDrafter(), None, ())
    try:
        if is_suffix_spec(spec):
            return _suffix_candidate(spec, target, trust_draft_vocab, precision, device, runtime)
        path = resolve_model_path(spec)
        meta = read_draft_meta(path)
        if meta is not None and meta.kind == "feature":
            drafter = feature_drafter_from_folder(path, target.model)
            # What a draft step multiplies with: its own weights plus the output rows it uses.
            subset = meta.data.get("vocab_subset_size") or target.model.info.vocab_size
            params = int(meta.data.get("trainable_parameters", 0)) + int(subset) * int(
                drafter.head.cfg.hidden_size
            )
            return Candidate(spec, "feature", drafter, params, ())
        if meta is None:  # what the metadata refuses is refused before the weights load
            early = identity_problems(target.model.info, model_facts(path, runtime))
            if early:
                return Candidate(spec, "model", None, None, tuple(early))
        model = load_model(
            path,
            dtype=precision.dtype,
            quantize=precision.quantize,
            device=device,
            runtime=runtime,
        )
        problems = pairing_problems(
            model, draft_tokenizer(path), meta, target, trust_draft_vocab=trust_draft_vocab
        )
        if problems:
            return Candidate(spec, "model", None, model.info.num_parameters, tuple(problems))
        return Candidate(
            spec,
            "model" if meta is None else "distilled-lm",
            paired_model_drafter(path, model, meta, target.model),
            model.info.num_parameters,
            (),
        )
    except SpectuneError as exc:
        return Candidate(spec, "unknown", None, None, (str(exc),))
