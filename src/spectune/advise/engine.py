"""Which engine ``advise``'s figures come from, said in its output and ``advice.json``.

``advise`` measures with spectune's own speculation loop. For ``--engine llamacpp`` it runs
the target on llama.cpp's kernels (``--runtime llamacpp``, through llama-cpp-python) where it
can: a GGUF target, llama-cpp-python installed and ``--runtime`` left at ``auto``, so that
the verification costs it measures are llama.cpp's (they differ from spectune's fp32 and
int4 runtimes: four tokens can cost 2.6x one on llama.cpp against 1.0x on fp32).
For ``--engine vllm`` with vLLM installed, spectune's figures screen the candidates and
vLLM itself then runs the configuration they pick (``spectune.advise.on_vllm``): the
verdict is vLLM's. Otherwise, and for SGLang, the figures are spectune's runtime's, and
the statement says so plainly, with the command that measures the engine itself (or, for
vLLM, the command that installs it).

``stated`` puts that line into the advice (``settings.measured_on`` and the first note) and
gives a verdict not to speculate its next step: the command that serves the target on the
engine without speculation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from spectune.advise.schema import Advice
from spectune.advise.verdict import DO_NOT_SPECULATE, NEXT_STEP
from spectune.engines.names import LABELS
from spectune.engines.plan import plain_command
from spectune.engines.vllm.setup import INSTALL_COMMAND, VLLM_VERSION, vllm_missing
from spectune.errors import ModelLoadError
from spectune.models.llamacpp import LLAMACPP, llama_cpp_available
from spectune.models.loading import resolve_model_path

__all__ = ["MeasuredOn", "measured_on", "stated"]

_ENGINE_ITSELF = {
    "llamacpp": "spectune tune --engine llamacpp measures llama-server's own flags",
    "vllm": "spectune tune --engine vllm measures vLLM itself",
    "sglang": "spectune does not measure SGLang",
}


@dataclass(frozen=True)
class MeasuredOn:
    """The engine the advice is for, the runtime advise measures on, and one line saying
    what measured what (printed, and kept in ``advice.json``)."""

    engine: str
    runtime: str
    statement: str
    verdict_on: str = "spectune"  # whose figures decide the verdict: spectune's or "vllm"

    def as_json(self) -> dict[str, str]:
        return {
            "engine": self.engine,
            "runtime": self.runtime,
            "statement": self.statement,
            "verdict_on": self.verdict_on,
        }


def _is_gguf(target: str) -> bool:
    try:
        return resolve_model_path(target).suffix == ".gguf"
    except ModelLoadError:
        return False


def measured_on(
    engine: str, target: str, runtime: str, *, vllm_ready: bool | None = None
) -> MeasuredOn:
    """Where advise measures for ``engine`` (module docstring). ``vllm_ready``: whether
    vLLM's virtualenv is installed (None: look)."""
    if engine == "spectune":
        return MeasuredOn(
            engine,
            runtime,
            f"measured on spectune (--runtime {runtime}), the engine the advice is for",
        )
    label = LABELS[engine]
    if engine == "llamacpp":
        if runtime == "auto" and _is_gguf(target) and llama_cpp_available():
            runtime = LLAMACPP
        if runtime == LLAMACPP:
            return MeasuredOn(
                engine,
                runtime,
                "measured on llama.cpp's kernels (llama-cpp-python, --runtime llamacpp) "
                "driven by spectune's speculation loop: llama-server's own drafting and "
                f"scheduling are not measured ({_ENGINE_ITSELF[engine]})",
            )
    if vllm_ready is None:
        vllm_ready = engine == "vllm" and vllm_missing() is None
    if engine == "vllm" and vllm_ready:
        return MeasuredOn(
            engine,
            runtime,
            f"screened on spectune's runtime (--runtime {runtime}); the configuration it picks "
            f"is then run by vLLM {VLLM_VERSION} itself, without and with speculation, and the "
            "verdict is vLLM's",
            "vllm",
        )
    why = ""
    if engine == "llamacpp":
        why = (
            "llama-cpp-python is not installed"
            if not llama_cpp_available()
            else "the target is no GGUF file"
            if not _is_gguf(target)
            else f"--runtime {runtime} was given"
        )
        why = f" ({why})"
    statement = (
        f"the figures are spectune's runtime's (--runtime {runtime}), not {label}'s{why}: its "
        f"costs differ, so the verdict is spectune's and the export is not measured on "
        f"{label} ({_ENGINE_ITSELF[engine]})"
    )
    if engine == "vllm":
        statement += (
            f"; vLLM is not installed here: '{INSTALL_COMMAND}' installs it, and advise then "
            "checks its verdict on vLLM itself"
        )
    return MeasuredOn(engine, runtime, statement)


def stated(advice: Advice, measured: MeasuredOn, target: str) -> Advice:
    """``advice`` with ``measured``'s line in its settings and notes, and a verdict not to
    speculate followed by its next step."""
    verdict = advice.verdict
    if verdict.summary == DO_NOT_SPECULATE:
        step = NEXT_STEP + plain_command(measured.engine, target)
        verdict = dataclasses.replace(verdict, reasons=(*verdict.reasons, step))
    return dataclasses.replace(
        advice,
        settings={**advice.settings, "measured_on": measured.as_json()},
        notes=(measured.statement, *advice.notes),
        verdict=verdict,
    )
