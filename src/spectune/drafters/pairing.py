"""Pairing a draft with a target: compatibility checks and drafter construction.

Checks follow llama.cpp's speculative example: vocabulary sizes at most 128 apart,
identical special-token ids, and identical token strings over the shared range (the
first and last ids beyond the special ones are where mismatches show first).

Policies:

- Vocabulary sizes that differ within the tolerance: the draft drafts over the shared
  range (``spectune.models.vocab.TargetVocabModel`` cuts or pads its logits to the
  target's width), which keeps verification lossless. A distilled draft (its own
  ``spectune_draft.json``) must match its target's vocabulary exactly.
- A draft without a tokenizer: its token strings cannot be compared, so it is refused
  unless the caller trusts its vocabulary (``trust_draft_vocab``, the CLI's
  ``--trust-draft-vocab``), which warns what was not checked. A distilled draft needs no
  tokenizer: it was trained on its target's token ids, and its folder names that target.

What metadata answers (families, vocabulary sizes, special-token ids: ``identity_problems``,
and the precision the draft must run at) is checked from the draft's header or config
before any of its weights load (``check_draft_before_loading``); token strings, once its
tokenizer is loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from spectune.control.crossover import verify_curve_of
from spectune.drafters.base import Drafter, TreeShape, TreeSource, describe, fresh_drafter
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.loading import (
    DraftMeta,
    feature_drafter_from_folder,
    lm_drafter_from_folder,
    not_distilled_for,
    read_draft_meta,
)
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.suffix import HistoryUser, SuffixDrafter
from spectune.drafters.suffix_history import HistoryStore
from spectune.drafters.suffix_index import SuffixIndex, tokenizer_fingerprint
from spectune.errors import (
    IncompatibleModelsError,
    InvalidParameterError,
    ModelLoadError,
    SpectuneWarning,
)
from spectune.models.base import LanguageModel, takes_tree_masks
from spectune.models.facts import ModelFacts, model_facts
from spectune.models.llama import COMPILED, LlamaLM
from spectune.models.llamacpp import LLAMACPP
from spectune.models.loading import load_model, resolve_model_path
from spectune.models.quant import PRECISIONS, Precision, QuantMode
from spectune.models.shipped import DEFAULT_SUFFIX_INDEX, shipped_drafts, shipped_suffix_index
from spectune.models.tokenizer import Tokenizer, load_tokenizer
from spectune.models.vocab import TargetVocabModel

__all__ = [
    "MAX_VOCAB_DIFFERENCE",
    "TARGET_PRECISIONS",
    "Loaded",
    "check_compatible",
    "check_draft_before_loading",
    "compatibility_problems",
    "draft_model_ref",
    "draft_tokenizer",
    "drafter_summary",
    "fresh_drafter",
    "identity_problems",
    "is_suffix_spec",
    "load_drafter",
    "load_drafter_at",
    "native_precision",
    "load_suffix_drafter",
    "shipped_suffix_serves",
    "suffix_drafter_for",
    "load_target",
    "compile_target",
    "load_target_at",
    "pairing_problems",
    "paired_model_drafter",
    "tree_drafter_for",
    "unchecked_vocabulary",
    "with_history",
]

MAX_VOCAB_DIFFERENCE = 128
# How a target can run, as experiments and the bench's --dtype name it: a precision of the
# native runtime (``PRECISIONS``) or the GGUF on llama.cpp's kernels.
# A native precision with ``COMPILED`` after it: the same, its forwards compiled.
TARGET_PRECISIONS: tuple[str, ...] = (*PRECISIONS, *(p + COMPILED for p in PRECISIONS), LLAMACPP)


@dataclass(frozen=True)
class Loaded:
    model: LanguageModel
    tokenizer: Tokenizer
    path: Path


def load_target(
    ref: str,
    *,
    dtype: torch.dtype = torch.float32,
    runtime: str = "auto",
    allow_missing_weights: bool = False,
    quantize: QuantMode = "none",
    device: torch.device | str = "cpu",
) -> Loaded:
    """Load a target model and its tokenizer (``default``, a .gguf file or an HF folder).

    ``allow_missing_weights``: see ``spectune.models.loading.load_model``."""
    path = resolve_model_path(ref)
    model = load_model(
        path,
        dtype=dtype,
        runtime=runtime,
        allow_missing_weights=allow_missing_weights,
        quantize=quantize,
        device=device,
    )
    return Loaded(model, load_tokenizer(path), path)


def load_target_at(ref: str, precision: str) -> Loaded:
    """``load_target`` at one of ``TARGET_PRECISIONS`` (``fp32``, ``bf16``, ``int8``,
    ``int4``, each also with ``+compile``, or ``llamacpp``)."""
    if precision == LLAMACPP:
        return load_target(ref, runtime=LLAMACPP)
    chosen = native_precision(precision)
    loaded = load_target(ref, dtype=chosen.dtype, quantize=chosen.quantize)
    if precision.endswith(COMPILED):
        compile_target(loaded.model)
    return loaded


def native_precision(name: str) -> Precision:
    """The native precision of a ``TARGET_PRECISIONS`` name other than ``llamacpp``."""
    base = name.removesuffix(COMPILED)
    if base not in PRECISIONS:
        raise InvalidParameterError(f"unknown precision {name!r} ({', '.join(TARGET_PRECISIONS)})")
    return PRECISIONS[base]


def compile_target(model: LanguageModel, on_compile: Callable[[int], None] | None = None) -> None:
    """``LlamaLM.compile_steps`` on ``model``, or a clear error on another runtime;
    ``on_compile`` hears each chunk size before its graph compiles."""
    if not isinstance(model, LlamaLM):
        raise InvalidParameterError(
            f"compiled steps (--compile, +compile) need the native runtime, not "
            f"{type(model).__name__}"
        )
    model.compile_steps(on_compile)


def load_drafter_at(spec: str | None, target: Loaded, precision: str) -> Drafter | None:
    """``load_drafter`` for a target loaded by ``load_target_at(..., precision)``: a draft
    model at the same precision (llama.cpp's runtime, or the same dtype and kernels)."""
    if precision == LLAMACPP:
        return load_drafter(spec, target, runtime=LLAMACPP)
    chosen = native_precision(precision)
    return load_drafter(spec, target, dtype=chosen.dtype, quantize=chosen.quantize)


class ModelIdentity(Protocol):
    """What pairing compares: a loaded model's ``ModelInfo`` or a file's ``ModelFacts``."""

    @property
    def name(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...
    @property
    def pad_token_id(self) -> int | None: ...


def identity_problems(target: ModelIdentity, draft: ModelIdentity) -> list[str]:
    """Every reason, among those metadata tells, that the draft cannot serve the target:
    architecture families, vocabulary sizes (within ``MAX_VOCAB_DIFFERENCE``), BOS, pad and
    EOS ids (empty: none)."""
    problems: list[str] = []
    if _language_family(target.family) != _language_family(draft.family):
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
    return problems


def _language_family(family: str) -> str:
    """A family as its language model: transformers names Gemma 3's text model
    ``gemma3_text`` where the GGUF header says ``gemma3``."""
    return family.removesuffix("_text")


def compatibility_problems(
    target: ModelIdentity,
    target_tokenizer: Tokenizer,
    draft: ModelIdentity,
    draft_tokenizer: Tokenizer | None,
) -> list[str]:
    """Every reason the draft cannot serve the target (empty: compatible)."""
    problems = identity_problems(target, draft)
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
    target: ModelIdentity,
    target_tokenizer: Tokenizer,
    draft: ModelIdentity,
    draft_tokenizer: Tokenizer | None,
) -> None:
    problems = compatibility_problems(target, target_tokenizer, draft, draft_tokenizer)
    if problems:
        raise _incompatible(draft.name, target.name, problems)


def _incompatible(draft: str, target: str, problems: list[str]) -> IncompatibleModelsError:
    return IncompatibleModelsError(
        f"draft '{draft}' cannot serve target '{target}': " + "; ".join(problems)
    )


def draft_model_ref(spec: str | None) -> str | None:
    """The draft model a ``--draft`` spec loads (``suffix+DRAFT``'s DRAFT; ``hybrid``: the
    shipped draft), or None for drafters without a model (none, ngram, suffix)."""
    if spec is None or spec in ("none", "ngram"):
        return None
    if spec == "hybrid":
        drafts = shipped_drafts()
        return drafts[0] if drafts else None
    if is_suffix_spec(spec):
        return draft_model_ref(spec.partition("+")[2] or None)
    return spec


def check_draft_before_loading(
    spec: str | None,
    target: ModelIdentity,
    *,
    runtime: str = "auto",
    quantize: QuantMode = "none",
) -> None:
    """Refuse, from metadata alone, the draft model of ``spec`` (``draft_model_ref``) that
    cannot serve ``target`` (a loaded model's ``ModelInfo`` or the target's ``ModelFacts``,
    so that this can run before either loads): ``identity_problems``, then a precision its
    runtime lacks (``quantize``, the target's). Distilled drafts and feature heads, which
    load in a moment and are checked against the loaded target, pass here."""
    ref = draft_model_ref(spec)
    if ref is not None:
        _check_draft_model(resolve_model_path(ref), target, runtime, quantize)


def _check_draft_model(
    path: Path, target: ModelIdentity, runtime: str, quantize: QuantMode
) -> None:
    if read_draft_meta(path) is not None:
        return
    draft: ModelFacts = model_facts(path, runtime)
    problems = identity_problems(target, draft)
    if problems:
        raise _incompatible(draft.name, target.name, problems)
    refusal = draft.precision_refusal(quantize)
    if refusal is not None:
        raise ModelLoadError(f"the draft: {refusal}")


def draft_tokenizer(path: Path) -> Tokenizer | None:
    """The draft's own tokenizer if it ships one (GGUF files always do)."""
    if path.is_file() or any(
        (path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")
    ):
        return load_tokenizer(path)
    return None


UNCHECKED_VOCAB = "the draft ships no tokenizer, so its token strings {} with the target's"


def unchecked_vocabulary(
    tokenizer: Tokenizer | None, meta: DraftMeta | None, target: LanguageModel
) -> str | None:
    """Why the draft's token strings cannot be checked against the target's, or None when
    they can (it ships a tokenizer) or need not be (distilled for this very target)."""
    if tokenizer is not None:
        return None
    unchecked = UNCHECKED_VOCAB.format("could not be compared")
    if meta is None:
        return unchecked
    reason = not_distilled_for(meta, target)
    return None if reason is None else f"{unchecked} and {reason}"


def pairing_problems(
    model: LanguageModel,
    tokenizer: Tokenizer | None,
    meta: DraftMeta | None,
    target: Loaded,
    *,
    trust_draft_vocab: bool = False,
) -> list[str]:
    """Every reason a draft model (its own tokenizer, its distillation record) cannot serve
    ``target`` (empty: it can).

    Beyond ``compatibility_problems``: an unchecked vocabulary (``unchecked_vocabulary``)
    unless ``trust_draft_vocab``; a distilled draft must have its target's vocabulary size
    exactly."""
    problems = compatibility_problems(target.model.info, target.tokenizer, model.info, tokenizer)
    if meta is not None and model.info.vocab_size != target.model.info.vocab_size:
        problems.append(
            f"a distilled draft needs its target's vocabulary exactly (target "
            f"{target.model.info.vocab_size}, draft {model.info.vocab_size})"
        )
    unchecked = unchecked_vocabulary(tokenizer, meta, target.model)
    if unchecked is not None and not trust_draft_vocab:
        problems.append(f"{unchecked} (--trust-draft-vocab pairs it anyway)")
    return problems


def paired_model_drafter(
    path: Path, model: LanguageModel, meta: DraftMeta | None, target: LanguageModel
) -> ModelDrafter:
    """The drafter of a draft model that passed ``pairing_problems``: a distilled draft as its
    folder says, a plain one over the shared vocabulary range (see the module docstring)."""
    if meta is not None:
        return lm_drafter_from_folder(path, model)
    if model.info.vocab_size != target.info.vocab_size:
        return ModelDrafter(TargetVocabModel(model, target.info.vocab_size))
    return ModelDrafter(model)


def load_drafter(
    spec: str | None,
    target: Loaded,
    *,
    dtype: torch.dtype = torch.float32,
    runtime: str = "auto",
    allow_missing_weights: bool = False,
    trust_draft_vocab: bool = False,
    quantize: QuantMode = "none",
    device: torch.device | str = "cpu",
) -> Drafter | None:
    """``None``/``none`` -> no drafter; ``ngram`` -> prompt lookup; ``suffix[:INDEX]`` ->
    suffix drafting (``load_suffix_drafter``); ``hybrid`` -> suffix and the shipped model
    draft, ``suffix[:INDEX]+DRAFT`` -> suffix and that draft (``HybridDrafter``); else a
    draft model path or shipped draft name, checked against the target before use. A draft
    model runs at the target's precision (``quantize``: the same kernels keep the draft step
    cheap relative to a quantised target) on the target's ``device``; a feature head on the
    CPU, on the target's kernels where the target is quantised.

    ``trust_draft_vocab`` pairs a draft without a tokenizer, warning (``SpectuneWarning``)
    that its token strings were not compared; ``allow_missing_weights``: see
    ``spectune.models.loading.load_model``."""
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
        if model_spec == "none" or is_suffix_spec(model_spec):
            raise InvalidParameterError(f"'{spec}': after '+' comes a draft model or 'ngram'")
        other = load_drafter(
            model_spec,
            target,
            dtype=dtype,
            runtime=runtime,
            allow_missing_weights=allow_missing_weights,
            trust_draft_vocab=trust_draft_vocab,
            quantize=quantize,
            device=device,
        )
        if other is None:
            raise InvalidParameterError(f"'{spec}': after '+' comes a draft model or 'ngram'")
        curve = verify_curve_of(target.model)  # what verifying more tokens costs here
        return HybridDrafter(
            suffix,
            other,
            merge_greedy=takes_tree_masks(target.model),
            verify_cost=None if curve is None else curve.relative,
        )
    path = resolve_model_path(spec)
    meta = read_draft_meta(path)
    if meta is not None and meta.kind == "feature":
        # A feature head shares the target's embedding and output rows, hence its tokenizer.
        return feature_drafter_from_folder(path, target.model)
    _check_draft_model(path, target.model.info, runtime, quantize)
    model = load_model(
        path,
        dtype=dtype,
        runtime=runtime,
        allow_missing_weights=allow_missing_weights,
        quantize=quantize,
        device=device,
    )
    tokenizer = draft_tokenizer(path)
    problems = pairing_problems(model, tokenizer, meta, target, trust_draft_vocab=trust_draft_vocab)
    if problems:
        raise _incompatible(model.info.name, target.model.info.name, problems)
    unchecked = unchecked_vocabulary(tokenizer, meta, target.model)
    if unchecked is not None:
        warnings.warn(
            "--trust-draft-vocab: "
            + unchecked.replace("could not be compared", "were not compared")
            + "; a mismatch would show only as near-zero acceptance",
            SpectuneWarning,
            stacklevel=2,
        )
    return paired_model_drafter(path, model, meta, target.model)


def is_suffix_spec(spec: str) -> bool:
    """``suffix``, ``suffix:INDEX``, ``suffix[:INDEX]+DRAFT`` or ``hybrid`` (not a path)."""
    return spec in ("suffix", "hybrid") or spec.startswith(("suffix:", "suffix+"))


def load_suffix_drafter(index: str, target: Loaded) -> SuffixDrafter:
    """A suffix drafter over ``index`` for ``target`` (``suffix_drafter_for``)."""
    return suffix_drafter_for(
        index,
        target.model.info.vocab_size,
        lambda: target.tokenizer.token_strings(),
        target.model.info.name,
    )


def suffix_drafter_for(
    index: str, vocab_size: int, token_strings: Callable[[], Sequence[str]], target: str
) -> SuffixDrafter:
    """A suffix drafter over ``index``: empty -> the shipped index of the default target,
    a shipped index name, a path to an index file, or ``none`` (this request's context
    only). The index must have been built with the target's vocabulary (``vocab_size``,
    ``token_strings()``: its string per token id, asked for only where an index is
    checked); ``target`` names it in the error."""
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
    loaded.check_vocabulary(vocab_size, tokenizer_fingerprint(token_strings()), target)
    return SuffixDrafter(loaded, name="suffix" if not index else f"suffix:{path.stem}")


def shipped_suffix_serves(target: Loaded) -> bool:
    """Whether the shipped default suffix index was built with ``target``'s vocabulary
    (only its header is read)."""
    path = shipped_suffix_index(DEFAULT_SUFFIX_INDEX)
    if path is None:
        return False
    fingerprint = tokenizer_fingerprint(target.tokenizer.token_strings())
    return SuffixIndex.read_header(path).serves(target.model.info.vocab_size, fingerprint)


def with_history(drafter: Drafter | None, history: HistoryStore | None) -> Drafter | None:
    """A drafter that also drafts from (and files outputs in) ``history``, a server's store
    of earlier outputs, where it can (suffix and hybrid drafting); others as they are."""
    return drafter.with_history(history) if isinstance(drafter, HistoryUser) else drafter


def tree_drafter_for(drafter: Drafter | None, target: LanguageModel, shape: TreeShape) -> Drafter:
    """The tree-drafting form of a chain drafter (its ``tree(shape)``: a draft model's, a
    feature head's, a suffix drafter's tree of its top continuations, alone or as the
    suffix source of a hybrid).

    The target must take tree attention masks (``takes_tree_masks``: the native runtime, or
    a full-attention model through transformers); the drafter checks its own side.
    """
    if getattr(target, "compiled_steps", False):
        raise InvalidParameterError(
            "token trees: a target with compiled steps takes no tree attention mask "
            "(drop --compile)"
        )
    if not takes_tree_masks(target):
        raise InvalidParameterError(
            f"token trees: {target.info.name} cannot take a tree attention mask in this "
            "runtime (--runtime native can)"
        )
    if isinstance(drafter, TreeSource):
        return drafter.tree(shape)
    raise InvalidParameterError(
        "token trees need a draft model, a feature-head draft, or suffix drafting"
    )


def drafter_summary(drafter: Drafter | None) -> str:
    """What really drafts, in words: kind, name, and how it covers the target's vocabulary
    (the start-up line of ``generate`` and ``serve``; ``spectune.drafters.base.describe``)."""
    return "none (plain decoding)" if drafter is None else describe(drafter)
