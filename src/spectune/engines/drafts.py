"""What a draft is to the engines spectune exports to, and the line that refuses one.

spectune drafts in more ways than vLLM, SGLang and llama.cpp do, so a draft spec (as
``--draft`` takes it) is first sorted into a kind (``resolve_draft``):

- ``ngram``: prompt lookup over the request's own context (model-free);
- ``suffix`` (``suffix:INDEX``): suffix matching over the context and a corpus index
  (model-free);
- ``hybrid`` (``suffix[:INDEX]+DRAFT``): suffix matching and a draft model merged in one tree;
- ``feature-head``: an EAGLE-style head (``spectune distill --kind feature``, the shipped
  ``smollm2-draft``) that reads the target's hidden states. It is no model on its own, so
  no engine loads it as a draft model (a head of the EAGLE-3 layout goes to vLLM through
  ``spectune convert --draft`` instead);
- ``lm-folder``: a standalone causal LM as a Hugging Face folder (``distill --kind lm`` or
  ``gpt2``, or any transformers model folder);
- ``lm-gguf``: a standalone causal LM as a GGUF file;
- ``hub``: ``org/name`` that is no local path, taken as a hub id (vLLM and SGLang fetch it;
  what it holds is not checked here);
- ``template``: ``DRAFT_MODEL``, a standalone draft the caller fills in (watch's K advice);
- ``unloadable``: a name that resolves to nothing, or a file or folder that holds no model.

Names are resolved the way spectune resolves them (``default``, a shipped draft's name),
and local paths made absolute, so what an engine is handed is a path. Each engine's module
says which kinds it cannot load, why, and what to give it instead (its ``DRAFT_REFUSALS``);
``draft_refusal`` reads one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from spectune.drafters.loading import read_draft_meta
from spectune.drafters.pairing import is_suffix_spec
from spectune.errors import ModelLoadError
from spectune.models.loading import resolve_model_path

__all__ = [
    "DRAFT_TEMPLATE",
    "FEATURE_HEAD",
    "HYBRID",
    "LM_GGUF",
    "USE_LM_DRAFT",
    "DraftKind",
    "DraftRef",
    "draft_refusal",
    "resolve_draft",
]

DraftKind = Literal[
    "ngram",
    "suffix",
    "hybrid",
    "feature-head",
    "lm-folder",
    "lm-gguf",
    "hub",
    "template",
    "unloadable",
]
DRAFT_TEMPLATE = "DRAFT_MODEL"  # stands for a standalone draft model the caller names
# ``org/name`` as the Hugging Face hub spells a repository.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_FEATURE_HEAD_CONFIG = "spectune-feature-head"  # config.json's model_type in a head's folder

# Text the engines' refusals share ({draft}: the draft as given, {engine}: the engine's name).
USE_LM_DRAFT = "a standalone LM draft (spectune distill --kind lm)"
FEATURE_HEAD = (
    "{draft} is an EAGLE-style feature head: it reads the target's hidden states and is no "
    "model on its own"
)
HYBRID = "'{draft}' merges suffix matching and a draft model in one tree, which {engine} cannot"
LM_GGUF = (
    "{engine} loads a draft model as a Hugging Face folder or hub id, not the GGUF file {draft}: "
    "give the draft's original folder or hub id"
)


@dataclass(frozen=True)
class DraftRef:
    """A draft spec resolved to what an engine would load."""

    spec: str  # as given
    kind: DraftKind
    location: str | None = None  # the file, folder or hub id to load (None: model-free)
    problem: str | None = None  # why no engine loads it (kind "unloadable")


def _folder_kind(path: Path) -> DraftKind | None:
    meta = read_draft_meta(path)
    if meta is not None:
        return "feature-head" if meta.kind == "feature" else "lm-folder"
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ModelLoadError(f"cannot read {config}: {exc}") from exc
    return "feature-head" if model_type == _FEATURE_HEAD_CONFIG else "lm-folder"


def resolve_draft(spec: str) -> DraftRef:
    """``spec`` sorted into its kind (see the module docstring), names resolved to paths."""
    if spec == "ngram":
        return DraftRef(spec, "ngram")
    if spec == DRAFT_TEMPLATE:
        return DraftRef(spec, "template", spec)
    if is_suffix_spec(spec):
        return DraftRef(spec, "hybrid" if spec == "hybrid" or "+" in spec else "suffix")
    # A drafter's own name ("model:NAME", "feature:NAME") names a shipped draft at most.
    name = spec.split(":", 1)[1] if spec.startswith(("model:", "feature:")) else spec
    try:
        path = resolve_model_path(name)
    except ModelLoadError:
        if _HUB_ID.fullmatch(spec) and not spec.endswith(".gguf"):
            return DraftRef(spec, "hub", spec)
        problem = (
            f"draft {spec} is no file or folder here, no shipped draft and no hub id: export "
            "reads the draft to tell what the engine would load, so run it where the draft is"
        )
        return DraftRef(spec, "unloadable", problem=problem)
    path = path.resolve()  # the engine may run elsewhere: a relative path could name another
    if path.is_file():
        if path.suffix == ".gguf":
            return DraftRef(spec, "lm-gguf", str(path))
        problem = f"draft {spec} is a file but no GGUF model"
        return DraftRef(spec, "unloadable", problem=problem)
    kind = _folder_kind(path)
    if kind is None:
        problem = f"draft {spec} is a folder without a model (no config.json)"
        return DraftRef(spec, "unloadable", problem=problem)
    return DraftRef(spec, kind, str(path))


def draft_refusal(draft: DraftRef, label: str, refusals: Mapping[DraftKind, str]) -> str | None:
    """Why the engine named ``label``, which cannot load the kinds in ``refusals`` (its
    ``DRAFT_REFUSALS``), cannot load ``draft``, and what to use instead, in one line; None
    when it can."""
    if draft.problem is not None:
        return draft.problem
    reason = refusals.get(draft.kind)
    if reason is None:
        return None
    return f"{label} cannot load draft {draft.spec}: " + reason.format(
        draft=draft.spec, engine=label
    )
