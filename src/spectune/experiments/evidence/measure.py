"""The measuring stages that need no training: each takes a ``Setup`` and returns plain
JSON-able dicts (the stage files' ``data``).

- ``acceptance_by_temperature``: alpha (``spectune.select.alpha``) per temperature and per
  prompt category, over the target's greedy continuations (one teacher-forced pass of each
  model; no decoding loop). The contexts are the target's greedy ones at every temperature:
  what changes is the two distributions compared, not the text.
- ``acceptance_by_position``: decode at T = 0 with a fixed K and count drafted and accepted
  tokens per window of output positions (a step counts at the position where it starts).
- ``policies``: plain decoding, every fixed K, the seed's ``threshold`` controller, and
  the controller with the local pause (``checks = ["local"]``), per temperature.
- ``verify_memory``: ``StepRecord.verify_peak_bytes`` per step against chain K and tree
  nodes.
- ``costs``: the target's verification-cost curve and one draft token's time over one
  target step (decoding at K = 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from spectune.control.base import KPolicy
from spectune.control.costs import measure_forward_curve
from spectune.control.registry import make_policy
from spectune.decode.engine import Generation
from spectune.drafters.pairing import tree_drafter_for
from spectune.drafters.tree import TreeShape
from spectune.experiments.common import Setup, decode_prompts
from spectune.sampling import SamplingParams
from spectune.select.alpha import estimate_alpha, make_continuations

__all__ = [
    "acceptance_by_position",
    "acceptance_by_temperature",
    "costs",
    "labelled_prompts",
    "policies",
    "verify_memory",
]


def labelled_prompts(setup: Setup) -> list[tuple[str, str, list[int]]]:
    """(id, category, tokens) per prompt; a prompt of unknown category is ``all``."""
    categories = setup.categories or ("all",) * len(setup.prompts)
    return [
        (pid, cat, list(tokens))
        for (pid, tokens), cat in zip(setup.prompts, categories, strict=True)
    ]


def acceptance_by_temperature(
    setup: Setup, temperatures: Sequence[float], max_tokens: int
) -> dict[str, Any]:
    continuations = make_continuations(setup.target, labelled_prompts(setup), max_tokens)
    estimates = estimate_alpha(setup.fresh_drafter(), continuations, setup.target, temperatures)
    categories = sorted({c for e in estimates for c in e.per_category})
    return {
        "temperatures": [e.temperature for e in estimates],
        "alpha": [round(e.overall, 4) for e in estimates],
        "positions": estimates[0].positions if estimates else 0,
        "per_category": {
            c: [round(e.per_category.get(c, 0.0), 4) for e in estimates] for c in categories
        },
        "per_category_positions": dict(estimates[0].per_category_positions) if estimates else {},
        "continuation_tokens": max_tokens,
    }


def acceptance_by_position(
    setup: Setup, *, k: int, long_tokens: int, window: int
) -> dict[str, Any]:
    """Outputs are decoded up to ``long_tokens``; those that reach it are the long ones.
    The setup's long-form requests are decoded where it has them, else its prompts."""
    params = SamplingParams(temperature=0.0, max_tokens=long_tokens)
    windows = -(-long_tokens // window)
    drafted = np.zeros((2, windows), dtype=np.int64)  # [all | long outputs, window]
    accepted = np.zeros((2, windows), dtype=np.int64)
    lengths: list[int] = []

    def count(generation: Generation) -> None:
        lengths.append(len(generation.tokens))
        rows = [0, 1] if len(generation.tokens) >= long_tokens else [0]
        position = 0
        for step in generation.steps:
            slot = min(position // window, windows - 1)
            drafted[rows, slot] += step.positions
            accepted[rows, slot] += step.accepted
            position += len(step.emitted)

    if setup.long_prompts:
        setup = dataclasses.replace(setup, prompts=setup.long_prompts, categories=())
    decode_prompts(setup, f"K={k}", setup.fresh_drafter, params, k, on_generation=count)
    return {
        "prompts": [name for name, _ in setup.prompts],
        "k": k,
        "window": window,
        "long_tokens": long_tokens,
        "output_lengths": lengths,
        "long_outputs": sum(n >= long_tokens for n in lengths),
        "window_starts": [i * window for i in range(windows)],
        "drafted_all": drafted[0].tolist(),
        "accepted_all": accepted[0].tolist(),
        "drafted_long": drafted[1].tolist(),
        "accepted_long": accepted[1].tolist(),
    }


def policies(
    setup: Setup, *, temperatures: Sequence[float], ks: Sequence[int], max_tokens: int
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        configs: list[tuple[str, int, Any]] = [("plain", 0, None)]
        configs += [(f"K={k}", k, None) for k in ks]
        for name, checks in (("threshold", []), ("threshold+pause", ["local"])):
            configs.append((name, 0, _policy_factory(checks, params)))
        for label, k, factory in configs:
            generations: list[Generation] = []
            drafter = (lambda: None) if label == "plain" else setup.fresh_drafter
            stats = decode_prompts(
                setup,
                label,
                drafter,
                params,
                k,
                policy_factory=factory,
                on_generation=generations.append,
            )
            steps = [step for g in generations for step in g.steps]
            paused = sum(1 for step in steps if (step.fallback or "").startswith("local"))
            rows.append(
                {
                    "temperature": temperature,
                    "policy": label,
                    "fixed_k": k if factory is None else None,
                    "mean_k": round(float(np.mean([step.k for step in steps])), 3)
                    if steps
                    else 0.0,
                    "paused_steps": paused,
                    **stats.as_dict(),
                }
            )
    return {"rows": rows, "ks": list(ks), "temperatures": list(temperatures)}


def _policy_factory(checks: list[str], params: SamplingParams) -> Any:
    def factory() -> KPolicy:
        return make_policy("threshold", {"checks": checks}, params=params)

    return factory


def verify_memory(
    setup: Setup, *, ks: Sequence[int], tree_nodes: Sequence[int], max_tokens: int
) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    rows: list[dict[str, Any]] = []

    def measure(kind: str, size: int, factory: Any) -> None:
        peaks: list[int] = []

        def seen(generation: Generation) -> None:
            peaks.extend(
                s.verify_peak_bytes
                for s in generation.steps
                if s.verify_peak_bytes is not None and s.num_draft_tokens == size
            )

        decode_prompts(setup, f"{kind} {size}", factory, params, size, on_generation=seen)
        rows.append(
            {
                "kind": kind,
                "draft_tokens": size,
                "verified_tokens": size + 1,
                "steps": len(peaks),
                "mean_peak_bytes": round(float(np.mean(peaks))) if peaks else None,
                "max_peak_bytes": max(peaks) if peaks else None,
            }
        )

    for k in ks:
        measure("chain", k, setup.fresh_drafter)
    for nodes in tree_nodes:
        shape = TreeShape(width=2, nodes=nodes)
        measure(
            "tree",
            nodes,
            lambda shape=shape: tree_drafter_for(setup.fresh_drafter(), setup.target, shape),
        )
    return {"rows": rows, "device": str(_device(setup))}


def _device(setup: Setup) -> str:
    device = getattr(setup.target, "device", "cpu")
    return str(device)


def costs(setup: Setup, *, max_tokens: int) -> dict[str, Any]:
    curve = measure_forward_curve(setup.target, sizes=(1, 2, 3, 4, 5, 6, 7, 8, 9), repeats=3)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    stats = decode_prompts(setup, "K=1", setup.fresh_drafter, params, 1)
    return {
        "curve_sizes": list(curve.sizes),
        "curve_seconds": [round(s, 6) for s in curve.seconds],
        "draft_ms_per_token": round(stats.draft_ms_mean, 4),
        "target_ms_per_step": round(stats.target_ms_mean, 4),
        "draft_over_target": round(stats.draft_over_target, 4),
        "acceptance_k1": round(stats.acceptance, 4),
    }
