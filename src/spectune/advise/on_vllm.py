"""``advise --engine vllm``: the configuration advise's screening picked, run by vLLM itself,
so that the verdict is about the engine that will serve.

After ``advise`` has screened and verified the candidates on spectune's runtime:

1. **Pick** (``pick``): spectune's winner, else the verified configuration with the best
   lower bound (speedup - noise): vLLM's costs are not spectune's, so a configuration that
   did not pay on spectune's runtime may pay on vLLM, and the other way round. Nothing is
   checked when nothing was verified, or when the screening's verdict was withheld because
   the machine was busy (vLLM's figures would carry the same load).
2. **Its vLLM form** (``speculative_config``): ngram, suffix or a draft model as
   ``spectune export --to vllm`` writes it (``spectune.engines.vllm.flags``); a head of the
   EAGLE-3 layout written as vLLM's EAGLE-3 folder in the report folder
   (``spectune.engines.vllm.eagle3``). vLLM takes a fixed K: a tuned policy runs at its
   starting K. What vLLM cannot load is refused in one line.
3. **The target** as a Hugging Face folder (``spectune.engines.hf_folder.served_folder``:
   a GGUF converted once into spectune's cache).
4. **vLLM without and with speculation** on the held-apart prompts, interleaved
   (``spectune.engines.vllm.replay``): every held-apart prompt, ``ROUNDS`` rounds, advise's
   ``--max-tokens``; with ``--quick``, ``QUICK_PROMPTS`` prompts and one round.
5. **The verdict** from vLLM's figures (``spectune.advise.vllm_check``), and the statement
   of which engine measured what.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from spectune.advise.engine import MeasuredOn
from spectune.advise.predict import ConfigPrediction
from spectune.advise.schema import Advice, ConfigResult
from spectune.advise.verdict import NO_VERDICT
from spectune.advise.vllm_check import VllmCheck, vllm_verdict
from spectune.engines.drafts import resolve_draft
from spectune.engines.export import export, refusal_of_draft
from spectune.engines.hf_folder import convert_target, served_folder
from spectune.engines.process import EngineStartError
from spectune.engines.tuned import Tuning
from spectune.engines.vllm.replay import ReplayPlan, SpeculationRefused, replay_off_and_on
from spectune.engines.vllm.server import VllmSettings
from spectune.engines.vllm.setup import VLLM_VERSION
from spectune.errors import InvalidParameterError, SpectuneError
from spectune.monitor.remote import excerpt

__all__ = [
    "QUICK_PROMPTS",
    "ROUNDS",
    "check_on_vllm",
    "draft_refusal",
    "export_command",
    "held_and_warmup",
    "pick",
    "speculative_config",
    "vllm_target",
    "with_check",
]

ROUNDS = 2  # each held-apart prompt twice per server (suffix: once, dealt over the rounds)
QUICK_PROMPTS = 3  # --quick: this many held-apart prompts, one round
HEAD_FOLDER = "vllm-eagle3"  # in the report folder: the EAGLE-3 head vLLM loads

Step = Callable[[str, int, int], None]  # (what, done, total)


def _eagle3_head(spec: str) -> bool:
    """Whether ``spec`` is a feature head of the EAGLE-3 layout (vLLM's eagle3 method)."""
    from spectune.drafters.loading import read_draft_meta

    draft = resolve_draft(spec)
    if draft.kind != "feature-head" or draft.location is None:
        return False
    meta = read_draft_meta(Path(draft.location))
    head = {} if meta is None else meta.data.get("head", {})
    return isinstance(head, dict) and head.get("layout") == "eagle3"


def draft_refusal(spec: str) -> str | None:
    """Why vLLM cannot load draft ``spec`` as advise checks it, or None: what ``export``
    refuses, except a head of the EAGLE-3 layout, which advise converts for vLLM."""
    return None if _eagle3_head(spec) else refusal_of_draft(spec, "vllm")


def vllm_target(target: str) -> tuple[Path, bool]:
    """The folder vLLM serves for ``target`` and whether it must be converted first; a
    target vLLM cannot be given is a one-line error, before anything loads."""
    return served_folder(target)


def pick(advice: Advice) -> ConfigResult | None:
    """The configuration to run on vLLM (module docstring, step 1), or None."""
    if advice.verdict.summary == NO_VERDICT:
        return None
    verified = [r for r in advice.configurations if r.run is not None]
    if advice.verdict.winner is not None:
        return next(r for r in verified if r.prediction.label == advice.verdict.winner)
    if not verified:
        return None
    return max(verified, key=lambda r: r.run.speedup - r.run.noise if r.run else 0.0)


def speculative_config(
    prediction: ConfigPrediction, folder: Path, out: Path
) -> tuple[dict[str, Any], list[str]]:
    """vLLM's ``--speculative-config`` for ``prediction`` on the target ``folder``, and the
    notes on what vLLM runs differently; ``InvalidParameterError`` with the line that
    refuses it. An EAGLE-3 head is written to ``out / HEAD_FOLDER``."""
    if _eagle3_head(prediction.drafter):
        from spectune.engines.vllm.eagle3 import export_eagle3

        head = export_eagle3(prediction.drafter, folder, out / HEAD_FOLDER, k=prediction.k)
        return head.speculative_config(prediction.k), []
    plan = export(Tuning(prediction.drafter, prediction.k, target=str(folder)), "vllm")
    return dict(plan.speculative_config), list(plan.notes)


def _plan(
    held: Sequence[Sequence[int]], warmup: Sequence[int], max_tokens: int, quick: bool
) -> ReplayPlan:
    prompts = tuple(tuple(p) for p in held)
    if quick:
        prompts = prompts[:QUICK_PROMPTS]
    return ReplayPlan(prompts, max_tokens, 1 if quick else ROUNDS, tuple(warmup))


def check_on_vllm(
    advice: Advice,
    target: str,
    held: Sequence[Sequence[int]],
    warmup: Sequence[int],
    *,
    max_tokens: int,
    quick: bool,
    out: Path,
    runtime: str,
    on_step: Step | None = None,
    say: Callable[[str], None] = print,
) -> VllmCheck | None:
    """Steps 1-4 of the module docstring; None where nothing is picked. ``held``: the
    held-apart prompts' token ids; ``warmup``: a prompt outside them."""
    chosen = pick(advice)
    if chosen is None:
        return None
    prediction = chosen.prediction
    folder, convert = vllm_target(target)
    base = VllmCheck(prediction, chosen.run, runtime, folder, None, max_tokens)
    if convert:
        say(f"converting {target} for vLLM into {folder} (once)")
        convert_target(target, folder)
    try:
        config, notes = speculative_config(prediction, folder, out)
    except InvalidParameterError as exc:
        return dataclasses.replace(base, reason=str(exc), refused=True)
    for note in notes:
        say(f"  note: {note}")
    check = dataclasses.replace(base, speculative_config=config)
    logs = Path(tempfile.mkdtemp(prefix="spectune-advise-vllm-"))
    plan = _plan(held, warmup, max_tokens, quick)
    say(
        f"vLLM {VLLM_VERSION}: off and {check.configuration} on {len(plan.prompts)} held-apart "
        f"prompt(s), {plan.rounds} round(s), {max_tokens} tokens each; server logs in {logs}"
    )
    settings = VllmSettings(folder, config)
    try:
        replay = replay_off_and_on(settings, plan, logs, on_step=on_step)
    except SpeculationRefused as exc:
        return dataclasses.replace(check, reason=f"vLLM did not start with it: {exc}", refused=True)
    except EngineStartError as exc:
        return dataclasses.replace(check, reason=f"vLLM without speculation did not start: {exc}")
    except httpx.HTTPStatusError as exc:
        answer = excerpt(exc.response.text, 200)
        status = exc.response.status_code
        return dataclasses.replace(check, reason=f"vLLM answered {status}: {answer}")
    except (httpx.HTTPError, SpectuneError) as exc:
        return dataclasses.replace(check, reason=f"vLLM's run failed: {excerpt(str(exc), 200)}")
    if not replay.pairs:
        return dataclasses.replace(check, replay=replay, reason="vLLM returned no tokens")
    return dataclasses.replace(check, replay=replay)


def _statement(check: VllmCheck, decided: bool) -> str:
    screened = f"screened on spectune's runtime (--runtime {check.runtime})"
    if decided and check.replay is not None:
        replay = check.replay
        return (
            f"{screened}; the verdict is vLLM's own: vLLM {VLLM_VERSION} served "
            f"{check.target_folder.name} without speculation and with {check.configuration} "
            f"on {sum(replay.prompts_per_round)} held-apart request(s) each "
            f"({replay.rounds} round(s), interleaved, {check.max_tokens} tokens), its tokens/s "
            "timed per request and its acceptance from /metrics"
        )
    if decided:  # refused: vLLM cannot run the configuration
        return f"{screened}; the verdict is vLLM's: it cannot run {check.configuration}"
    return (
        f"{screened}, and the verdict is spectune's: vLLM {VLLM_VERSION} did not measure "
        f"{check.configuration} ({check.reason})"
    )


def with_check(
    advice: Advice, check: VllmCheck | None, measured: MeasuredOn
) -> tuple[Advice, MeasuredOn]:
    """``advice`` with vLLM's verdict where vLLM gave one (spectune's kept as the screening
    verdict) and the record of both engines' figures; the statement of what measured what."""
    if check is None:
        why = (
            "the screening ran on a busy machine"
            if advice.verdict.summary == NO_VERDICT
            else "no configuration was verified"
        )
        statement = (
            f"screened on spectune's runtime (--runtime {measured.runtime}), and the verdict is "
            f"spectune's: nothing was run on vLLM ({why})"
        )
        return advice, dataclasses.replace(measured, statement=statement, verdict_on="spectune")
    verdict = vllm_verdict(check)
    decided = verdict is not None
    stated = dataclasses.replace(
        measured,
        statement=_statement(check, decided),
        verdict_on="vllm" if decided else "spectune",
    )
    notes: tuple[str, ...] = advice.notes
    if check.replay is not None and check.replay.same_output < check.replay.pairs:
        notes = (
            *notes,
            f"vLLM's greedy text with speculation differed from without on "
            f"{check.replay.pairs - check.replay.same_output} of {check.replay.pairs} "
            "prompt(s) (near-ties in fp32 can do this; the tokens/s compare unequal texts there)",
        )
    advice = dataclasses.replace(
        advice,
        verdict=advice.verdict if verdict is None else verdict,
        screening_verdict=advice.verdict,
        engine_check=check,
        notes=notes,
    )
    return advice, stated


def export_command(advice: Advice) -> str | None:
    """The vLLM command for a verdict to speculate with the configuration vLLM was given:
    the target folder it served and the speculative config (also where vLLM measured
    nothing and spectune's verdict stands: vLLM cannot serve the GGUF itself); None
    otherwise."""
    check = advice.engine_check
    verdict = advice.verdict
    if check is None or check.speculative_config is None or not verdict.speculate:
        return None
    return check.command() if verdict.winner == check.prediction.label else None


def held_and_warmup(
    prompts: Sequence[tuple[str, str, list[int]]], verify_prompts: int
) -> tuple[list[list[int]], list[int]]:
    """The held-apart prompts advise verified on (``split_prompts``, the first
    ``verify_prompts``), and a warm-up prompt from the fitting half."""
    from spectune.advise.advisor import split_prompts

    fit, held = split_prompts(prompts)
    held = held[:verify_prompts]
    outside = [row for row in fit if row not in held] or fit
    return [row[2] for row in held], outside[0][2]
