"""A tuned setup as an engine's own flags, or a refusal: which engine writes what.

Each engine's writer lives with the engine (``vllm.flags.to_vllm``, ``sglang.flags.to_sglang``,
``llamacpp.flags.to_llamacpp``) and first asks ``refusal``: a setup whose draft the engine
cannot load (its ``DRAFT_REFUSALS``: a feature head anywhere, suffix drafting on llama.cpp,
...) or whose target it cannot load (llama-server takes a GGUF file) is refused with one
line saying why and what to use instead; no plan names what the engine cannot load. What
an engine runs differently from spectune is said in the plan's ``notes``, never dropped
silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from spectune.engines.drafts import DraftKind, draft_refusal, resolve_draft
from spectune.engines.llamacpp import flags as llamacpp
from spectune.engines.names import ENGINES, LABELS, engine_name
from spectune.engines.plan import (
    TARGET_TEMPLATE,
    ExportPlan,
    TargetProblem,
    setup_refusal,
    target_path,
)
from spectune.engines.sglang import flags as sglang
from spectune.engines.tuned import Tuning
from spectune.engines.vllm import flags as vllm
from spectune.errors import InvalidParameterError

__all__ = [
    "ENGINES",
    "WRITERS",
    "EngineExport",
    "export",
    "export_best",
    "refusal",
    "refusal_of_draft",
    "target_refusal",
]


@dataclass(frozen=True)
class EngineExport:
    """What ``export`` needs of one engine: its writer and what it cannot load."""

    write: Callable[[Tuning], ExportPlan]
    draft_refusals: Mapping[DraftKind, str]
    target_problem: TargetProblem | None = None


WRITERS: Mapping[str, EngineExport] = {
    "vllm": EngineExport(vllm.to_vllm, vllm.DRAFT_REFUSALS),
    "sglang": EngineExport(sglang.to_sglang, sglang.DRAFT_REFUSALS),
    "llamacpp": EngineExport(
        llamacpp.to_llamacpp, llamacpp.DRAFT_REFUSALS, llamacpp.target_problem
    ),
}


def target_refusal(target: str | None, engine: str) -> str | None:
    """Why ``engine`` cannot load ``target`` (llama-server: anything but a GGUF file), or
    None."""
    problem = WRITERS[engine_name(engine)].target_problem
    path = target_path(target)
    return None if problem is None or path == TARGET_TEMPLATE else problem(path)


def refusal_of_draft(spec: str, engine: str) -> str | None:
    """Why ``engine`` cannot load the draft ``spec``, and what to use instead; or None."""
    engine = engine_name(engine)
    return draft_refusal(resolve_draft(spec), LABELS[engine], WRITERS[engine].draft_refusals)


def refusal(tuning: Tuning, engine: str) -> str | None:
    """Why ``engine`` cannot run ``tuning`` (no speculation, or a draft or target it cannot
    load), in one line saying what to use instead; None when it can."""
    engine = engine_name(engine)
    writer = WRITERS[engine]
    return setup_refusal(tuning, engine, writer.draft_refusals, writer.target_problem)


def export(tuning: Tuning, engine: str) -> ExportPlan:
    """``tuning`` as ``engine``'s flags; ``InvalidParameterError`` with ``refusal``'s line
    when the engine cannot run it."""
    return WRITERS[engine_name(engine)].write(tuning)


def export_best(tunings: Sequence[Tuning], engine: str) -> ExportPlan:
    """The first of ``tunings`` (best first, as ``read_tunings`` ranks a bench run) that
    ``engine`` can run, with a note for each better one it cannot; refused with the best
    one's reason when it can run none."""
    engine = engine_name(engine)
    skipped: list[str] = []
    for tuning in tunings:
        reason = refusal(tuning, engine)
        if reason is None:
            plan = export(tuning, engine)
            return replace(plan, notes=[*skipped, *plan.notes])
        skipped.append(f"skipped {tuning.label}, ranked above it in {tuning.source}: {reason}")
    if not tunings:
        raise InvalidParameterError("no tuned setup to export")
    first = refusal(tunings[0], engine)
    assert first is not None
    if len(tunings) > 1:
        first += f" (nor can {LABELS[engine]} run any other setup in {tunings[0].source})"
    raise InvalidParameterError(first)
