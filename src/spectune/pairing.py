"""Pairing a draft with a target: compatibility checks and drafter construction.

Checks follow llama.cpp's speculative example: vocabulary sizes at most 128 apart,
identical special-token ids, and identical token strings over the shared range (the
first and last ids beyond the special ones are where mismatches show first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spectune.drafters.base import Drafter
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.feature_tree import FeatureTreeDrafter
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.loading import (
    feature_drafter_from_folder,
    lm_drafter_from_folder,
    read_draft_meta,
)
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.suffix import SuffixDrafter
from spectune.drafters.suffix_index import HistoryStore, SuffixIndex, tokenizer_fingerprint
from spectune.drafters.tree import TreeDrafter, TreeGrower, TreeShape
from spectune.errors import IncompatibleModelsError, InvalidParameterError, ModelLoadError
from spectune.models.base import LanguageModel, ModelInfo, takes_tree_masks
from spectune.models.loading import load_model, resolve_model_path
from spectune.shipped import DEFAULT_SUFFIX_INDEX, shipped_drafts, shipped_suffix_index
from spectune.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "MAX_VOCAB_DIFFERENCE",
    "Loaded",
    "check_compatible",
    "compatibility_problems",
    "draft_tokenizer",
    "fresh_drafter",
    "is_suffix_spec",
    "load_drafter",
    "load_suffix_drafter",
    "load_target",
    "tree_drafter_for",
    "with_history",
]

MAX_VOCAB_DIFFERENCE = 128


@dataclass(frozen=True)
class Loaded:
    model: LanguageModel
    tokenizer: Tokenizer
    path: Path


def load_target(ref: str, *, dtype: torch.dtype = torch.float32, runtime: str = "auto") -> Loaded:
    """Load a target model and its tokenizer (``default``, a .gguf file or an HF folder)."""
    path = resolve_model_path(ref)
    model = load_model(path, dtype=dtype, runtime=runtime)
    return Loaded(model, load_tokenizer(path), path)


def compatibility_problems(
    target: ModelInfo,
    target_tokenizer: Tokenizer,
    draft: ModelInfo,
    draft_tokenizer: Tokenizer | None,
) -> list[str]:
    """Every reason the draft cannot serve the target (empty: compatible)."""
    problems: list[str] = []
    if target.family != draft.family:
        problems.append(
            f"architecture families differ (target {target.family}, draft {draft.family})"
        )
    if abs(target.vocab_size - draft.vocab_size) > MAX_VOCAB_DIFFERENCE:
        problems.append(
            f"vocabulary sizes differ by {abs(target.vocab_size - draft.vocab_size)} "
            f"(target {target.vocab_size}, draft {draft.vocab_size}; at most "
            f"{MAX_VOCAB_DIFFERENCE} allowed)"
        )
    for label, t_id, d_id in (
        ("BOS", target.bos_token_id, draft.bos_token_id),
        ("pad", target.pad_token_id, draft.pad_token_id),
    ):
        if t_id is not None and d_id is not None and t_id != d_id:
            problems.append(f"{label} token ids differ (target {t_id}, draft {d_id})")
    if target.eos_token_ids and draft.eos_token_ids:
        if not set(target.eos_token_ids) & set(draft.eos_token_ids):
            problems.append(
                f"EOS token ids differ (target {list(target.eos_token_ids)}, "
                f"draft {list(draft.eos_token_ids)})"
            )
    if draft_tokenizer is not None and draft_tokenizer.kind != target_tokenizer.kind:
        problems.append(
            f"tokenizer types differ (target {target_tokenizer.kind}, draft {draft_tokenizer.kind})"
        )
    if draft_tokenizer is not None:
        t_strings = target_tokenizer.token_strings()
        d_strings = draft_tokenizer.token_strings()
        shared = min(len(t_strings), len(d_strings))
        for idx in range(shared):
            if t_strings[idx] != d_strings[idx]:
                problems.append(
                    f"token {idx} differs (target {t_strings[idx]!r}, draft {d_strings[idx]!r})"
                )
                break
    return problems


def check_compatible(
    target: ModelInfo,
    target_tokenizer: Tokenizer,
    draft: ModelInfo,
    draft_tokenizer: Tokenizer | None,
) -> None:
    problems = compatibility_problems(target, target_tokenizer, draft, draft_tokenizer)
    if problems:
        raise IncompatibleModelsError(
            f"draft '{draft.name}' cannot serve target '{target.name}': " + "; ".join(problems)
        )


def draft_tokenizer(path: Path) -> Tokenizer | None:
    """The draft's own tokenizer if it ships one (GGUF files always do)."""
    if path.is_file() or any(
        (path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")
    ):
        return load_tokenizer(path)
    return None


def load_drafter(
    spec: str | None,
    target: Loaded,
    *,
    dtype: torch.dtype = torch.float32,
    runtime: str = "auto",
) -> Drafter | None:
    """``None``/``none`` -> no drafter; ``ngram`` -> prompt lookup; ``suffix[:INDEX]`` ->
    suffix drafting (``load_suffix_drafter``); ``hybrid`` -> suffix and the shipped model
    draft, ``suffix[:INDEX]+DRAFT`` -> suffix and that draft (``HybridDrafter``); else a
    draft model path or shipped draft name, checked against the target before use."""
    if spec is None or spec == "none":
        return None
    if spec == "ngram":
        return NgramDrafter()
    if spec == "hybrid":
        drafts = shipped_drafts()
        if not drafts:
            raise InvalidParameterError("'hybrid' needs a shipped draft; use suffix+DRAFT")
        spec = f"suffix+{drafts[0]}"
    if is_suffix_spec(spec):
        suffix_spec, plus, model_spec = spec.partition("+")
        suffix = load_suffix_drafter(suffix_spec.partition(":")[2], target)
        if not plus:
            return suffix
        other = load_drafter(model_spec, target, dtype=dtype, runtime=runtime)
        if other is None or isinstance(other, SuffixDrafter | HybridDrafter):
            raise InvalidParameterError(f"'{spec}': after '+' comes a draft model or 'ngram'")
        return HybridDrafter(suffix, other)
    path = resolve_model_path(spec)
    meta = read_draft_meta(path)
    if meta is not None and meta.kind == "feature":
        # A feature head shares the target's embedding and output rows, hence its tokenizer.
        return feature_drafter_from_folder(path, target.model)
    model = load_model(path, dtype=dtype, runtime=runtime)
    check_compatible(target.model.info, target.tokenizer, model.info, draft_tokenizer(path))
    if meta is not None:
        return lm_drafter_from_folder(path, model)
    return ModelDrafter(model)


def is_suffix_spec(spec: str) -> bool:
    """``suffix``, ``suffix:INDEX``, ``suffix[:INDEX]+DRAFT`` or ``hybrid`` (not a path)."""
    return spec in ("suffix", "hybrid") or spec.startswith(("suffix:", "suffix+"))


def load_suffix_drafter(index: str, target: Loaded) -> SuffixDrafter:
    """A suffix drafter over ``index``: empty -> the shipped index of the default target,
    a shipped index name, a path to an index file, or ``none`` (this request's context
    only). The index must have been built with the target's vocabulary."""
    if index == "none":
        return SuffixDrafter(None, name="suffix:none")
    name = index or DEFAULT_SUFFIX_INDEX
    path = shipped_suffix_index(name) or Path(name)
    if not path.is_file():
        raise ModelLoadError(
            f"no suffix index '{name}' (not a shipped index name nor a file); build one "
            "with 'spectune suffix-index'"
        )
    loaded = SuffixIndex.load(path)
    loaded.check_vocabulary(
        target.model.info.vocab_size,
        tokenizer_fingerprint(target.tokenizer.token_strings()),
        target.model.info.name,
    )
    return SuffixDrafter(loaded, name="suffix" if not index else f"suffix:{path.stem}")


def with_history(drafter: Drafter | None, history: HistoryStore | None) -> Drafter | None:
    """A suffix or hybrid drafter that also drafts from (and files outputs in) ``history``,
    a server's store of earlier outputs; other drafters as they are."""
    if isinstance(drafter, SuffixDrafter):
        return drafter.with_history(history)
    if isinstance(drafter, HybridDrafter):
        suffix = drafter.suffix.with_history(history)
        return HybridDrafter(suffix, drafter.model, drafter.stats, name=drafter.name)
    return drafter


def tree_drafter_for(
    drafter: Drafter | None, target: LanguageModel, shape: TreeShape
) -> TreeGrower:
    """The tree-drafting form of a chain drafter: a draft model's or a feature head's.

    Target and draft model must take tree attention masks (``takes_tree_masks``: the native
    runtime, or a full-attention model through transformers); a feature head always does.
    """
    if not takes_tree_masks(target):
        raise InvalidParameterError(
            f"token trees: {target.info.name} cannot take a tree attention mask in this "
            "runtime (--runtime native can)"
        )
    if isinstance(drafter, FeatureDrafter):
        return FeatureTreeDrafter(drafter, shape)
    if isinstance(drafter, ModelDrafter):
        if not takes_tree_masks(drafter.model) or drafter.vocab_subset is not None:
            raise InvalidParameterError(
                "token trees need a full-vocabulary draft model that takes tree attention "
                "masks (--runtime native)"
            )
        return TreeDrafter(drafter.model, shape)
    raise InvalidParameterError("token trees need a draft model or a feature-head draft")


def fresh_drafter(drafter: Drafter) -> Drafter:
    """A drafter with the same weights and its own (empty) per-request state: model and
    feature drafters share their model or head, an n-gram drafter is new."""
    if isinstance(drafter, ModelDrafter):
        return ModelDrafter(drafter.model, name=drafter.name, vocab_subset=drafter.vocab_subset)
    if isinstance(drafter, FeatureDrafter):
        return FeatureDrafter(drafter.head, drafter.vocab_subset, name=drafter.name)
    if isinstance(drafter, NgramDrafter):
        return NgramDrafter()
    if isinstance(drafter, SuffixDrafter):
        return drafter.fresh()
    if isinstance(drafter, HybridDrafter):
        return HybridDrafter(
            drafter.suffix.fresh(), fresh_drafter(drafter.model), drafter.stats, name=drafter.name
        )
    raise InvalidParameterError(f"cannot copy a {type(drafter).__name__} drafter")
