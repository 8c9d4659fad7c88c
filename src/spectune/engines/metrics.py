"""Which engine's metrics dialect reads an exposition: by ``--engine``, else by its names.

Each engine's dialect lives with the engine (``vllm.metrics``, ``llamacpp.metrics``,
``sglang.metrics``); spectune's own is ``spectune.monitor.remote.read_spectune``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from spectune.engines.llamacpp.metrics import read_llamacpp
from spectune.engines.sglang.metrics import read_sglang
from spectune.engines.vllm.metrics import read_vllm
from spectune.monitor.remote import EndpointError, EngineReading, Exposition, read_spectune

__all__ = ["READERS", "detect_engine", "read_exposition"]

READERS: Mapping[str, Callable[[Exposition], EngineReading]] = {
    "vllm": read_vllm,
    "sglang": read_sglang,
    "llamacpp": read_llamacpp,
    "spectune": read_spectune,
}
_PREFIXES = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "llamacpp": "llamacpp:",
    "spectune": "spectune_spec_decode_",
}


def detect_engine(ex: Exposition) -> str:
    """The engine whose metric names the exposition holds."""
    for engine, prefix in _PREFIXES.items():
        if any(name.startswith(prefix) for name in ex.names()):
            return engine
    raise EndpointError(
        "no vLLM, SGLang, llama.cpp or spectune metrics there (give --engine if it is one)"
    )


def read_exposition(text: str, engine: str | None = None) -> EngineReading:
    """Parse ``text`` and read it as ``engine``'s (detected from the names when None)."""
    ex = Exposition.parse(text)
    return READERS[engine or detect_engine(ex)](ex)
