"""A vLLM server (the CPU build) on a free loopback port, with the settings that work on a
small CPU machine.

Settings (``VllmSettings``; measured with the default target on 2 cores):
- ``--dtype float32 --enforce-eager``: eager starts in about 45 s; the compiled path
  recompiles on every start (170-210 s).
- ``VLLM_CPU_KVCACHE_SPACE=1``: 1 GiB of KV cache, plenty for ``--max-model-len 2048``.
- ``VLLM_CPU_OMP_THREADS_BIND=auto``: vLLM picks the cores (one OpenMP thread on 2 cores;
  forcing two was 3x slower).
- ``HF_HUB_OFFLINE=1``: the model is a local folder; nothing is fetched.
The server starts through ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
command looks up the distribution ``vllm``, and the CPU build's is ``vllm-cpu``.
Its health check is ``GET /health``; it is ready when that answers 200.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectune.engines.process import free_port, served_process
from spectune.engines.vllm.setup import find_vllm_python
from spectune.errors import ModelLoadError

__all__ = ["VllmSettings", "vllm_command", "vllm_environment", "vllm_server"]

ENTRY_POINT = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class VllmSettings:
    """One vLLM server: the model folder, its speculation (None: off) and the CPU settings."""

    model: Path  # a Hugging Face folder (``spectune convert`` writes one from a GGUF)
    speculative_config: Mapping[str, Any] | None = None  # --speculative-config, as JSON
    max_model_len: int = 2048
    dtype: str = "float32"
    enforce_eager: bool = True
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    threads_bind: str = "auto"  # VLLM_CPU_OMP_THREADS_BIND
    extra_args: tuple[str, ...] = ()  # more of vLLM's own flags, passed as given
    env: Mapping[str, str] = field(default_factory=dict)  # more environment, over the above


def vllm_command(python: Path, settings: VllmSettings, port: int) -> list[str]:
    """The server's command line on ``127.0.0.1:port``."""
    command = [
        str(python),
        "-m",
        ENTRY_POINT,
        "--model",
        str(settings.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        settings.dtype,
        "--max-model-len",
        str(settings.max_model_len),
    ]
    if settings.enforce_eager:
        command.append("--enforce-eager")
    if settings.speculative_config is not None:
        config = json.dumps(dict(settings.speculative_config), separators=(",", ":"))
        command += ["--speculative-config", config]
    return command + list(settings.extra_args)


def vllm_environment(
    settings: VllmSettings, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: this process's environment) with vLLM's CPU settings. PYTHONPATH
    and PYTHONHOME are dropped: the server runs in its own virtualenv."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(settings.kv_cache_gib),
        VLLM_CPU_OMP_THREADS_BIND=settings.threads_bind,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(settings.env)
    return env


@contextmanager
def vllm_server(
    settings: VllmSettings, *, log: Path | None = None, ready_within: float = 300.0
) -> Iterator[str]:
    """A vLLM server until the block ends; yields its URL (``http://127.0.0.1:PORT``) once
    ``/health`` answers. Its output goes to ``log`` (default: a new file in the temporary
    folder, named in any error). No vLLM venv: ``VllmMissingError`` naming ``make vllm``."""
    python = find_vllm_python()
    if not (settings.model / "config.json").is_file():
        raise ModelLoadError(
            f"{settings.model} is not a Hugging Face folder (no config.json): "
            "write one with 'spectune convert'"
        )
    if log is None:
        handle, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
        os.close(handle)
        log = Path(name)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with served_process(
        vllm_command(python, settings, port),
        health_url=url + "/health",
        log=log,
        name="vLLM",
        env=vllm_environment(settings),
        ready_within=ready_within,
    ):
        yield url
