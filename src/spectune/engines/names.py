"""The engines' names: one spelling printed, every accepted spelling read.

``llamacpp`` is printed (in help, flags files and JSON); ``llama.cpp``, the project's own
name, is accepted wherever an engine is named (``--engine``, ``--to``). ``LABELS`` are the
names prose uses ("vLLM cannot load ...").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from spectune.errors import InvalidParameterError

__all__ = ["ENGINES", "LABELS", "SPELLINGS", "engine_arg", "engine_name"]

ENGINES = ("vllm", "sglang", "llamacpp")  # the engines spectune writes flags for
SPELLINGS = {"llama.cpp": "llamacpp"}  # other accepted spellings -> the printed one
LABELS = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "spectune": "spectune"}


def engine_name(name: str, allowed: Sequence[str] = ENGINES) -> str:
    """``name`` in its printed spelling, if it is one of ``allowed``."""
    canonical = SPELLINGS.get(name, name)
    if canonical not in allowed:
        also = " (or llama.cpp)" if "llamacpp" in allowed else ""
        raise InvalidParameterError(
            f"unknown engine {name!r}; choose one of {', '.join(allowed)}{also}"
        )
    return canonical


def engine_arg(allowed: Sequence[str] = ENGINES) -> Callable[[str], str]:
    """An argparse ``type`` reading an engine in any spelling as its printed one."""

    def read(name: str) -> str:
        try:
            return engine_name(name, allowed)
        except InvalidParameterError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = "engine"  # argparse names the type in its own messages
    return read
