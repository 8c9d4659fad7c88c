"""``advice.json``: the typed record ``spectune advise`` writes (``SCHEMA_VERSION``).

Top-level keys: ``schema_version``, ``target``, ``machine`` (the verification curve v(K)),
``settings``, ``candidates`` (checks and measured acceptance and cost per draft),
``configurations`` (predicted and, where verified, measured speedup with its noise and the
prediction error), ``verdict``, ``checklist``, ``notes``, ``outputs``, ``seconds``; with
``--engine vllm`` where vLLM is installed, ``engine_check`` (the configuration run by vLLM
without and with speculation: both engines' figures, ``spectune.advise.vllm_check``) and
``screening_verdict`` (what spectune's own measurements said; ``verdict`` is then vLLM's
where vLLM measured).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.advise.measure import VerifiedRun
from spectune.advise.predict import ConfigPrediction
from spectune.advise.verdict import CheckRow, Verdict
from spectune.advise.vllm_check import VllmCheck

__all__ = ["SCHEMA_VERSION", "Advice", "CandidateCheck", "ConfigResult"]

# 2: position_acceptance per temperature and category; 3: machine.load over the run;
# 4: settings.measured_on (which engine measured what); 5: engine_check and
# screening_verdict (the verdict measured on vLLM), settings.measured_on.verdict_on
SCHEMA_VERSION = 5


@dataclass(frozen=True)
class CandidateCheck:
    spec: str
    kind: str
    compatible: bool
    problems: tuple[str, ...]
    size_ratio: float | None  # draft parameters / target parameters
    size_verdict: str  # against the 1/10 - 1/4 rule
    acceptance: dict[str, float]  # temperature -> alpha
    acceptance_by_category: dict[str, dict[str, float]]  # temperature -> category -> alpha
    first_token_acceptance: float | None  # the first draft token, decision temperature
    # Probe runs, temperature -> [j]: position j+1 kept, given 1..j were; pooled, and
    # temperature -> category -> the same.
    position_acceptance: dict[str, tuple[float, ...]]
    position_acceptance_by_category: dict[str, dict[str, tuple[float, ...]]]
    draft_cost: float | None
    probe_step_cost: float | None  # probe run: a step's time over a plain step's


@dataclass(frozen=True)
class ConfigResult:
    prediction: ConfigPrediction
    run: VerifiedRun | None  # None: not among the verified top configurations

    @property
    def measured(self) -> float | None:
        return None if self.run is None else self.run.speedup

    @property
    def error(self) -> float | None:
        """(measured - predicted) / predicted."""
        if self.run is None:
            return None
        return (self.run.speedup - self.prediction.predicted_speedup) / (
            self.prediction.predicted_speedup
        )

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        out: dict[str, Any] = {
            "label": p.label,
            "drafter": p.drafter,
            "policy": "fixed" if p.policy is None else p.policy.name,
            "policy_options": {} if p.policy is None else dict(p.policy.options),
            "k": p.k,
            "alpha": p.alpha,
            "coverage": p.coverage,
            "draft_cost": p.draft_cost,
            "verify_cost": p.verify_cost,
            "predicted_speedup": p.predicted_speedup,
            "iid_speedup": p.iid_speedup,
            "break_even_acceptance": {str(k): v for k, v in p.break_even.items()},
            "measured_speedup": self.measured,
            "noise": None if self.run is None else self.run.noise,
            "prediction_error": self.error,
        }
        if self.run is not None:
            c = self.run.counts
            out["live"] = {
                "acceptance_rate": c.acceptance_rate,
                "draft_share": c.draft_share,
                "fallback_frequency": c.fallback_frequency,
                "tokens_per_second": c.tokens_per_second,
                "plain_tokens_per_second": self.run.plain.tokens_per_second,
                "prompts": len(self.run.ratios),
                "per_prompt_speedup": list(self.run.ratios),
            }
        return out


@dataclass(frozen=True)
class Advice:
    target: str
    target_parameters: int
    verify_curve: dict[int, float]  # K -> v(K)
    settings: dict[str, Any]
    candidates: tuple[CandidateCheck, ...]
    configurations: tuple[ConfigResult, ...]  # by predicted speedup, best first
    verdict: Verdict
    checklist: tuple[CheckRow, ...]
    notes: tuple[str, ...]
    outputs: dict[str, str]  # what was written: role -> file name in the report folder
    seconds: float
    machine_load: dict[str, Any] | None = None  # LoadRecord.as_json over the whole run
    engine_check: VllmCheck | None = None  # the configuration run by vLLM itself
    screening_verdict: Verdict | None = None  # spectune's, where ``verdict`` is vLLM's

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "target_parameters": self.target_parameters,
            "machine": {
                "verify_curve": {str(k): v for k, v in self.verify_curve.items()},
                "load": self.machine_load,
            },
            "settings": self.settings,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
            "configurations": [c.to_dict() for c in self.configurations],
            "verdict": dataclasses.asdict(self.verdict),
            "screening_verdict": (
                None
                if self.screening_verdict is None
                else dataclasses.asdict(self.screening_verdict)
            ),
            "engine_check": None if self.engine_check is None else self.engine_check.as_json(),
            "checklist": [
                {"rule": r.rule, "band": r.band, "value": r.value, "met": r.met}
                for r in self.checklist
            ],
            "notes": list(self.notes),
            "outputs": self.outputs,
            "seconds": self.seconds,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
