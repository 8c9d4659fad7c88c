"""Where models run: ``--device auto|cpu|cuda``.

The contract: a model's forwards run on its device (weights, KV cache, masks, rotary
tables); ``LanguageModel.forward`` takes token ids anywhere and returns logits and hidden
states on the CPU. The decode loop (drafting bookkeeping, verification, sampling with its
seeded CPU ``torch.Generator``) stays on the CPU, so a seed draws the same random numbers
on every device. Feature-head drafts run on the CPU.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from spectune.errors import InvalidParameterError
from spectune.models.names import DEVICES

__all__ = [
    "DEVICES",
    "VerifyMemory",
    "cpu_name",
    "machine_of",
    "model_device",
    "resolve_device",
]


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


def model_device(model: object) -> torch.device:
    """Where ``model``'s forwards run: its ``device`` attribute (the native runtime and the
    transformers adapter have one), else the CPU."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_of(model: object) -> str:
    """What a timing of ``model``'s forwards depends on beyond the model and its runtime:
    the GPU's name on CUDA, else the CPU's name, its cores and torch's thread count."""
    device = model_device(model)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count() or 0} cores, {torch.get_num_threads()} threads"


class VerifyMemory:
    """The peak memory of one verification pass, the monitored figure ``verify_peak_bytes``.

    Start one just before the target's verification forward and read ``peak_bytes`` right
    after it (before the drafter runs again). What it measures depends on the device:

    - CUDA: the caching allocator's peak during the pass above what was allocated when it
      began (``torch.cuda.reset_peak_memory_stats`` at the start, then
      ``max_memory_allocated - memory_allocated``). Weights and the preallocated KV cache
      were resident before and are not counted: the figure is the extra room the pass
      needs, activations, attention masks and logits on the device included. The logits
      copied back to the CPU (``spectune.models.devices``' contract) are not counted. Resetting the
      peak is process-wide, so anything else allocating on the same GPU at the same time
      (a draft-deadline thread) adds to it.
    - CPU: torch keeps no allocator statistics for the CPU, and the process's RSS
      high-water mark (``getrusage``) only moves when a step sets a record for the whole
      process, so it reads 0 on almost every step. The figure is computed from shapes
      instead: the tensors the verification creates and holds at once, the logits
      ``[rows, vocab]`` (fp32), at temperature > 0 the target probabilities ``[rows, vocab]``
      (fp32), and the attention mask ``[rows, context]`` (bool). It is a lower bound: the
      forward's transient activations are not seen. It grows linearly with the tokens
      verified (K + 1 for a chain, the node count + 1 for a tree, summed over a batch).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._resident = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            self._resident = torch.cuda.memory_allocated(device)

    def peak_bytes(self, *, rows: int, context: int, vocab: int, sampled: bool) -> int:
        """rows: tokens verified in the pass (all sequences of a batch); context: attention
        columns (cache length after the pass); sampled: temperature > 0 for some row."""
        if self.cuda:
            return max(0, torch.cuda.max_memory_allocated(self.device) - self._resident)
        fp32 = 4
        logits = rows * vocab * fp32 * (2 if sampled else 1)
        return logits + rows * context
