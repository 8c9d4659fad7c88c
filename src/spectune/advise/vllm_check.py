"""``advise --engine vllm``'s check on vLLM itself: the record of what vLLM measured for
the configuration advise's screening picked, and the verdict from vLLM's figures.

The rule is the screening's (``spectune.advise.verdict``), applied to vLLM's figures:
speculate only where vLLM with the speculative config beats vLLM without it by more than
the noise (twice the standard error of the per-prompt ratios, ``noise_of``). Otherwise
"do not speculate on vLLM", with the figures and the next step: the command that serves
the target on vLLM without speculation. A configuration vLLM cannot load, or a server
that does not start with it, is a verdict too (vLLM cannot run it), with its one-line
reason. Where vLLM measured nothing for another cause (its server without speculation did
not start, a request failed), there is no verdict from vLLM; the screening's stands and
the reason is said.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.advise.measure import VerifiedRun, noise_of
from spectune.advise.predict import ConfigPrediction
from spectune.advise.verdict import NEXT_STEP, Verdict
from spectune.engines.vllm.replay import Replay
from spectune.engines.vllm.setup import VLLM_VERSION

__all__ = ["DO_NOT_SPECULATE_ON_VLLM", "VllmCheck", "serve_command", "vllm_verdict"]

DO_NOT_SPECULATE_ON_VLLM = "do not speculate on vLLM"


def serve_command(folder: Path, speculative_config: Mapping[str, Any] | None) -> str:
    """``vllm serve FOLDER``, with ``--speculative-config`` where one is given."""
    command = ["vllm", "serve", str(folder)]
    if speculative_config is not None:
        config = json.dumps(dict(speculative_config), separators=(",", ":"))
        command += ["--speculative-config", config]
    return shlex.join(command)


@dataclass(frozen=True)
class VllmCheck:
    """One screened configuration, run by vLLM (or the line saying why not)."""

    prediction: ConfigPrediction  # the configuration as screened (a tuned one: its start K)
    screened: VerifiedRun | None  # spectune's verification run of it
    runtime: str  # the runtime spectune screened on
    target_folder: Path  # the Hugging Face folder vLLM served
    speculative_config: Mapping[str, Any] | None  # None: none could be written (``reason``)
    max_tokens: int
    replay: Replay | None = None  # None: vLLM measured nothing (``reason``)
    reason: str | None = None  # why vLLM did not measure it, one line
    refused: bool = False  # vLLM cannot load or start with the speculative config

    @property
    def configuration(self) -> str:
        """What vLLM runs: a fixed K (a tuned policy's starting K)."""
        return f"{self.prediction.drafter} K={self.prediction.k}"

    @property
    def noise(self) -> float:
        return 0.0 if self.replay is None else noise_of(self.replay.ratios)

    @property
    def measured(self) -> bool:
        return self.replay is not None and self.replay.pairs > 0

    def command(self) -> str:
        return serve_command(self.target_folder, self.speculative_config)

    def acceptance_line(self) -> str:
        counts = None if self.replay is None else self.replay.counts
        if counts is None or not counts.num_draft_tokens:
            return "vLLM's /metrics: no draft token over the measured requests"
        rate = counts.accepted / counts.num_draft_tokens
        positions = " ".join(f"{r:.0%}" for r in counts.acceptance_by_position)
        return (
            f"vLLM's acceptance (/metrics): {rate:.0%} of {counts.num_draft_tokens} draft "
            f"tokens in {counts.steps} drafts; kept by position {positions}"
        )

    def as_json(self) -> dict[str, Any]:
        """``advice.json``'s ``engine_check``: both engines' figures for the configuration."""
        screened = self.screened
        spectune: dict[str, Any] = {"runtime": self.runtime, "configuration": self.prediction.label}
        if screened is not None:
            spectune |= {
                "measured_speedup": screened.speedup,
                "noise": screened.noise,
                "acceptance_rate": screened.counts.acceptance_rate,
                "tokens_per_second": screened.counts.tokens_per_second,
                "plain_tokens_per_second": screened.plain.tokens_per_second,
                "prompts": len(screened.ratios),
            }
        out: dict[str, Any] = {
            "engine": "vllm",
            "version": VLLM_VERSION,
            "configuration": self.configuration,
            "target_folder": str(self.target_folder),
            "speculative_config": (
                None if self.speculative_config is None else dict(self.speculative_config)
            ),
            "command": self.command() if self.speculative_config is not None else None,
            "max_tokens": self.max_tokens,
            "measured": self.measured,
            "reason": self.reason,
            "spectune": spectune,
            "vllm": None,
        }
        replay = self.replay
        if replay is not None:
            counts = replay.counts
            out["vllm"] = {
                "plain": replay.plain.as_json(),
                "speculative": replay.speculative.as_json(),
                "speedup": replay.speedup,
                "noise": self.noise,
                "per_prompt_speedup": list(replay.ratios),
                "rounds": replay.rounds,
                "prompts_per_round": list(replay.prompts_per_round),
                "same_output": replay.same_output,
                "acceptance": None
                if counts is None
                else {
                    "drafts": counts.steps,
                    "draft_tokens": counts.num_draft_tokens,
                    "accepted": counts.accepted,
                    "rate": counts.acceptance_rate,
                    "kept_by_position": list(counts.accepted_at),
                },
                "logs": [str(p) for p in replay.logs],
            }
        return out


def vllm_verdict(check: VllmCheck) -> Verdict | None:
    """The verdict from vLLM's figures (module docstring); None where vLLM measured nothing
    and the screening's verdict stands."""
    plain_step = NEXT_STEP + serve_command(check.target_folder, None)
    label = check.configuration
    if check.refused:
        reason = f"vLLM cannot run {label}: {check.reason}"
        return Verdict(False, None, DO_NOT_SPECULATE_ON_VLLM, (reason, plain_step))
    replay = check.replay
    if replay is None or not check.measured:
        return None
    speedup, noise = replay.speedup, check.noise
    figures = (
        f"{replay.plain.tokens_per_second:.1f} -> {replay.speculative.tokens_per_second:.1f} "
        f"tokens/s over {replay.pairs} prompt pair(s)"
    )
    screened = ""
    if check.screened is not None:
        screened = (
            f"spectune's runtime (--runtime {check.runtime}) measured "
            f"{check.screened.speedup:.2f}x +-{check.screened.noise:.2f} for it in screening"
        )
    if speedup - noise > 1.0:
        reasons = [
            f"measured on vLLM {VLLM_VERSION}: {speedup:.2f}x +-{noise:.2f} against vLLM "
            f"without speculation ({figures}), beyond the noise",
            check.acceptance_line(),
        ]
        if screened:
            reasons.append(screened)
        winner = check.prediction.label
        summary = f"speculate with {label} on vLLM: {speedup:.2f}x measured on vLLM"
        return Verdict(True, winner, summary, tuple(reasons))
    reasons = [
        f"measured on vLLM {VLLM_VERSION}: {label} {speedup:.2f}x +-{noise:.2f} against vLLM "
        f"without speculation ({figures}), not above it by more than the noise",
        check.acceptance_line(),
    ]
    if screened:
        reasons.append(screened)
    reasons.append(plain_step)
    return Verdict(False, None, DO_NOT_SPECULATE_ON_VLLM, tuple(reasons))
