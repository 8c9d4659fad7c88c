"""What every engine's flag writer shares: the plan it returns and the checked setup it
starts from.

``prepare`` turns a ``Tuning`` into a ``Setup`` an engine can run, or raises the engine's
one-line refusal: no speculation to export, a target the engine cannot load
(``target_problem``), or a draft kind it cannot load (its ``DRAFT_REFUSALS``). Names are
written as paths (``default`` and a shipped draft's name are no file an engine can open),
and what the engine will load differently from spectune goes into ``notes``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spectune.engines.drafts import DraftKind, DraftRef, draft_refusal, resolve_draft
from spectune.engines.names import LABELS
from spectune.engines.tuned import Tuning
from spectune.errors import InvalidParameterError, ModelLoadError
from spectune.models.loading import resolve_model_path
from spectune.records import validate_k

__all__ = [
    "TARGET_TEMPLATE",
    "ExportPlan",
    "Setup",
    "TargetProblem",
    "prepare",
    "plain_command",
    "setup_refusal",
    "target_path",
]

TARGET_TEMPLATE = "TARGET_MODEL"  # the target, where the setup does not name one
TargetProblem = Callable[[str], str | None]  # a target path -> why the engine cannot load it


@dataclass(frozen=True)
class ExportPlan:
    engine: str
    args: list[str]  # flags for the engine's server command
    command: str  # a ready-to-run command line
    speculative_config: dict[str, Any] = field(default_factory=dict)  # vLLM's JSON
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "args": self.args,
            "command": self.command,
            "speculative_config": self.speculative_config,
            "notes": self.notes,
        }


def target_path(target: str | None) -> str:
    """The target as an engine opens it: ``default`` or a shipped name as its file's
    absolute path, a local path made absolute, anything else (a hub id) as given."""
    if target is None:
        return TARGET_TEMPLATE
    try:
        return str(resolve_model_path(target).resolve())
    except ModelLoadError:
        return target


def plain_command(engine: str, target: str | None) -> str:
    """The command that serves ``target`` on ``engine`` without speculation: the next step
    of a verdict not to speculate."""
    path = target_path(target)
    return shlex.join(
        {
            "spectune": ["spectune", "serve", "--target", target or path, "--draft", "none"],
            "vllm": ["vllm", "serve", path],
            "sglang": ["python", "-m", "sglang.launch_server", "--model-path", path],
            "llamacpp": ["llama-server", "--model", path],
        }[engine]
    )


def setup_refusal(
    tuning: Tuning,
    engine: str,
    draft_refusals: Mapping[DraftKind, str],
    target_problem: TargetProblem | None = None,
) -> str | None:
    """Why ``engine`` cannot run ``tuning`` (no speculation, or a target or draft it cannot
    load), in one line saying what to use instead; None when it can."""
    if tuning.draft in (None, "none") or tuning.k == 0:
        return "the result recommends no speculation (no draft or K = 0): nothing to export"
    assert tuning.draft is not None
    path = target_path(tuning.target)
    problem = None if target_problem is None or path == TARGET_TEMPLATE else target_problem(path)
    return problem or draft_refusal(resolve_draft(tuning.draft), LABELS[engine], draft_refusals)


@dataclass(frozen=True)
class Setup:
    """A tuning an engine can run: its draft and target resolved."""

    draft: DraftRef
    target: str
    k: int
    speculate_max_batch: int | None
    notes: list[str]


def prepare(
    tuning: Tuning,
    engine: str,
    draft_refusals: Mapping[DraftKind, str],
    target_problem: TargetProblem | None = None,
) -> Setup:
    """``tuning`` checked for ``engine`` (``setup_refusal``) and resolved, with the notes
    every engine shares: a placeholder to fill in, a GGUF target where the engine prefers
    a Hugging Face folder, a hub id it will fetch unchecked."""
    reason = setup_refusal(tuning, engine, draft_refusals, target_problem)
    if reason is not None:
        raise InvalidParameterError(reason)
    validate_k(tuning.k)
    if tuning.speculate_max_batch is not None and tuning.speculate_max_batch < 0:
        raise InvalidParameterError("speculate_max_batch must be >= 0")
    assert tuning.draft is not None
    draft = resolve_draft(tuning.draft)
    target = target_path(tuning.target)
    label = LABELS[engine]
    notes = []
    if target == TARGET_TEMPLATE:
        kind = "GGUF file" if engine == "llamacpp" else "folder or hub id"
        notes.append(f"replace {TARGET_TEMPLATE} with the target's {kind}")
    elif target.endswith(".gguf") and engine != "llamacpp":
        notes.append(
            f"the target is a GGUF file; {label} serves a Hugging Face checkpoint best (its GGUF "
            "loading is experimental): give the target's original folder or hub id with --target"
        )
    if draft.kind == "hub":
        notes.append(
            f"draft {draft.spec} is no path here, so it goes to {label} as a hub id, unchecked: "
            "it must be a causal LM with the target's tokenizer"
        )
    if draft.kind == "template":
        notes.append(f"replace {draft.spec} with the draft model's folder, hub id or GGUF file")
    return Setup(draft, target, tuning.k, tuning.speculate_max_batch, notes)
