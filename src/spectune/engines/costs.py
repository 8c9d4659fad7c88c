"""A deployment's measured step costs: what a speedup prediction needs beyond acceptance.

A step that drafts K tokens and verifies them costs ``K * draft_cost + verify[K]`` plain
target steps (``spectune.control.costs``' c and v(K), measured on the deployment itself).
Acceptance alone predicts no speedup: the same acceptance pays on a machine where
verifying 4 tokens costs 1.1 plain steps and loses where it costs 4. So ``watch`` predicts
only from costs someone measured: a cost profile file (``load_costs``; ``tune --engine``
writes one with ``save_costs``), with the draft cost measured live where the engine times
its drafts (``spectune serve``).

The file, JSON::

    {"format": "spectune-step-costs", "version": 1,
     "draft_cost": 0.02,             # one draft token, in plain target steps
     "verify": [1.0, 1.04, 1.09],    # [K]: verifying K draft tokens, in plain steps; [0] = 1
     "engine": "vllm",               # optional: who served the measurement
     "measured_by": "..."}           # optional: the command or run that measured it

Predictions stop at the last measured K (``max_k``): nothing is extrapolated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError

__all__ = ["COSTS_FORMAT", "StepCosts", "load_costs", "save_costs"]

COSTS_FORMAT = "spectune-step-costs"
COSTS_VERSION = 1


@dataclass(frozen=True)
class StepCosts:
    """Measured costs, in units of one plain target step."""

    draft_cost: float  # one draft token
    verify: tuple[float, ...]  # [k]: v(k), verifying k draft tokens; [0] = 1 (plain)
    source: str  # where the figures come from (a file, the engine's timing), for the report
    engine: str | None = None

    def __post_init__(self) -> None:
        finite = all(math.isfinite(v) and v > 0 for v in self.verify)
        if not self.verify or not finite or not math.isfinite(self.draft_cost):
            raise InvalidParameterError(f"{self.source}: costs must be finite, verify[] > 0")
        if self.draft_cost < 0:
            raise InvalidParameterError(f"{self.source}: draft_cost must be >= 0")

    @property
    def max_k(self) -> int:
        """The largest K whose verification was measured."""
        return len(self.verify) - 1

    def step(self, k: int) -> float:
        """A step drafting ``k`` tokens over a plain step: ``k * draft_cost + verify[k]``."""
        return k * self.draft_cost + self.verify[k]

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "draft_cost": round(self.draft_cost, 4),
            "verify": [round(v, 4) for v in self.verify],
        }


def load_costs(path: Path) -> StepCosts:
    """A cost profile file (see the module); a one-line ``InvalidParameterError`` when it
    is missing or malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        message = f"cannot read the cost profile {path}: {exc.strerror}"
        raise InvalidParameterError(message) from None
    except UnicodeDecodeError:
        raise InvalidParameterError(f"{path} is not a cost profile (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise InvalidParameterError(f"{path} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != COSTS_FORMAT:
        raise InvalidParameterError(f"{path} is not a cost profile (format {COSTS_FORMAT!r})")
    if data.get("version") != COSTS_VERSION:
        raise InvalidParameterError(f"{path}: cost profile version {data.get('version')!r}")
    draft, verify = data.get("draft_cost"), data.get("verify")
    numbers = isinstance(verify, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in verify
    )
    if not isinstance(draft, int | float) or isinstance(draft, bool) or not numbers:
        raise InvalidParameterError(f"{path}: needs a number draft_cost and a list verify")
    assert isinstance(verify, list)
    if len(verify) < 2 or verify[0] != 1:
        raise InvalidParameterError(f"{path}: verify must start at 1.0 (K = 0) and go on to K = 1")
    engine = data.get("engine")
    return StepCosts(
        float(draft),
        tuple(float(v) for v in verify),
        str(path),
        engine if isinstance(engine, str) else None,
    )


def save_costs(costs: StepCosts, path: Path, measured_by: str | None = None) -> None:
    """Write ``costs`` as a cost profile file that ``load_costs`` reads."""
    data: dict[str, Any] = {
        "format": COSTS_FORMAT,
        "version": COSTS_VERSION,
        "draft_cost": costs.draft_cost,
        "verify": list(costs.verify),
    }
    if costs.engine is not None:
        data["engine"] = costs.engine
    if measured_by is not None:
        data["measured_by"] = measured_by
    path.write_text(json.dumps(data, indent=2) + "\n")
