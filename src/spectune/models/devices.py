"""Where models run: ``--device auto|cpu|cuda``.

The contract: a model's forwards run on its device (weights, KV cache, masks, rotary
tables); ``LanguageModel.forward`` takes token ids anywhere and returns logits and hidden
states on the CPU. The decode loop (drafting bookkeeping, verification, sampling with its
seeded CPU ``torch.Generator``) stays on the CPU, so a seed draws the same random numbers
on every device. Feature-head drafts run on the CPU.
"""

from __future__ import annotations

import torch

from spectune.errors import InvalidParameterError

__all__ = ["DEVICES", "resolve_device"]

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str, *, cpu_kernels: bool = False) -> torch.device:
    """``auto`` -> cuda when torch sees a GPU (and the model does not need CPU-only
    kernels: ``cpu_kernels``, the int8 / int4 precisions), else cpu; ``cuda`` without a GPU
    is an error."""
    if name not in DEVICES:
        raise InvalidParameterError(f"unknown device {name!r} ({', '.join(DEVICES)})")
    if name == "cpu" or (name == "auto" and (cpu_kernels or not torch.cuda.is_available())):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidParameterError(
            f"--device cuda: torch {torch.__version__} sees no CUDA GPU here (use --device cpu)"
        )
    return torch.device("cuda")
