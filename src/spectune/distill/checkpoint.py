"""Resumable training checkpoints and the state they hold (``TrainState``, its learning curve
of ``CurvePoint``s): weights and optimizer moments as safetensors, counters
and the learning curve as JSON (no pickles). Written to a temporary folder and renamed,
so an interrupted save never leaves a half checkpoint behind."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["CurvePoint", "TrainState", "load_checkpoint", "save_checkpoint"]


@dataclass(frozen=True)
class CurvePoint:
    step: int
    tokens: int
    seconds: float
    train_loss: float
    heldout_kl: float
    heldout_top1: float  # teacher-forced greedy acceptance of a first draft token
    # The same for draft tokens 1, 2, ... when the head is trained unrolled (its own
    # features fed back): index 0 repeats heldout_top1.
    heldout_top1_by_position: tuple[float, ...] = ()


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    curve: list[CurvePoint] = field(default_factory=list)


def save_checkpoint(
    folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState
) -> None:
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # Tied weights (an LM draft's embedding and output layer) are stored once.
    weights: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in module.state_dict().items():
        if value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        weights[key] = value.detach().to("cpu").contiguous()
    save_file(weights, str(tmp / "model.safetensors"))
    names = {id(p): n for n, p in module.named_parameters()}
    moments: dict[str, torch.Tensor] = {}
    steps: dict[str, float] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            slot = optimizer.state.get(param)
            if not slot:
                continue
            name = names[id(param)]
            moments[f"{name}::exp_avg"] = slot["exp_avg"].to("cpu").contiguous()
            moments[f"{name}::exp_avg_sq"] = slot["exp_avg_sq"].to("cpu").contiguous()
            steps[name] = float(slot["step"])
    if moments:
        save_file(moments, str(tmp / "optimizer.safetensors"))
    meta: dict[str, Any] = {
        "step": state.step,
        "tokens": state.tokens,
        "seconds": state.seconds,
        "adam_steps": steps,
        "curve": [asdict(p) for p in state.curve],
    }
    (tmp / "state.json").write_text(json.dumps(meta))
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(
    folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer
) -> TrainState:
    from safetensors.torch import load_file

    meta = json.loads((folder / "state.json").read_text())
    module.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    if (folder / "optimizer.safetensors").is_file():
        moments = load_file(str(folder / "optimizer.safetensors"))
        params = dict(module.named_parameters())
        for name, step in meta["adam_steps"].items():
            param = params[name]
            optimizer.state[param] = {
                "step": torch.tensor(step),
                "exp_avg": moments[f"{name}::exp_avg"].to(param.device),
                "exp_avg_sq": moments[f"{name}::exp_avg_sq"].to(param.device),
            }
    curve = [CurvePoint(**p) for p in meta["curve"]]
    return TrainState(meta["step"], meta["tokens"], meta["seconds"], curve)
