"""``advise --engine vllm``'s check on vLLM itself, without vLLM: the verdict from vLLM's
figures, the record of both engines' figures in advice.json, which configuration is run,
the interleaved replay's order and sums (on two scripted servers), and the statements of
what measured what. tests/test_advise_vllm_live.py runs it on a real vLLM."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from spectune.advise.engine import measured_on
from spectune.advise.measure import VerifiedRun
from spectune.advise.on_vllm import (
    check_on_vllm,
    draft_refusal,
    export_command,
    held_and_warmup,
    pick,
    speculative_config,
    with_check,
)
from spectune.advise.predict import ConfigPrediction
from spectune.advise.schema import SCHEMA_VERSION, Advice, ConfigResult
from spectune.advise.verdict import DO_NOT_SPECULATE, NEXT_STEP, NO_VERDICT, Verdict
from spectune.advise.vllm_check import DO_NOT_SPECULATE_ON_VLLM, VllmCheck, vllm_verdict
from spectune.engines.vllm import replay as replay_module
from spectune.engines.vllm.replay import (
    Replay,
    ReplayPlan,
    ServerFigures,
    keeps_answers,
    replay_off_and_on,
    schedule,
)
from spectune.engines.vllm.server import VllmSettings
from spectune.records import SpecCounts

FOLDER = Path("/models/smollm2-hf")
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


def _prediction(drafter: str = "ngram", k: int = 2) -> ConfigPrediction:
    return ConfigPrediction(drafter, k, 0.5, 1.0, 0.01, 1.2, 1.3, 1.3, {k: 0.3})


def _run(label: str, speedup: float, ratios: tuple[float, ...]) -> VerifiedRun:
    plain = SpecCounts(steps=100, emitted=100, step_time=1.0)
    mine = SpecCounts(steps=50, emitted=round(100 * speedup), step_time=1.0, positions=100)
    mine.accepted = 40
    return VerifiedRun(label, mine, plain, ratios)


def _replay(
    plain_rate: float, speculative_rate: float, ratios: tuple[float, ...], same: int | None = None
) -> Replay:
    counts = SpecCounts(
        steps=30, num_draft_tokens=60, positions=60, accepted=27, tested_at=[30, 30]
    )
    counts.accepted_at = [18, 9]
    return Replay(
        NGRAM,
        ServerFigures(len(ratios), round(10 * plain_rate), 10.0),
        ServerFigures(len(ratios), round(10 * speculative_rate), 10.0),
        ratios,
        counts,
        len(ratios) if same is None else same,
        1,
        (len(ratios),),
    )


def _check(replay: Replay | None, **fields: Any) -> VllmCheck:
    screened = _run("ngram K=2", 1.1, (1.0, 1.2, 1.1))
    return VllmCheck(_prediction(), screened, "auto", FOLDER, NGRAM, 24, replay, **fields)


# --- the verdict from vLLM's figures ------------------------------------------------------


def test_vllm_beyond_its_noise_speculates_with_the_configuration() -> None:
    check = _check(_replay(15.0, 18.0, (1.19, 1.21, 1.2, 1.2)))
    verdict = vllm_verdict(check)
    assert verdict is not None and verdict.speculate
    assert verdict.winner == "ngram K=2"  # the screened label: its prediction is found
    assert verdict.summary == "speculate with ngram K=2 on vLLM: 1.20x measured on vLLM"
    assert "against vLLM without speculation (15.0 -> 18.0 tokens/s" in verdict.reasons[0]
    assert verdict.reasons[1].startswith("vLLM's acceptance (/metrics): 45% of 60 draft tokens")
    assert "kept by position 60% 30%" in verdict.reasons[1]
    assert "spectune's runtime (--runtime auto) measured 1.10x" in verdict.reasons[2]


def test_vllm_within_its_noise_does_not_speculate_and_says_what_to_serve() -> None:
    check = _check(_replay(15.0, 18.0, (0.7, 1.8, 0.9, 1.6)))  # 1.2x, noise 0.5
    verdict = vllm_verdict(check)
    assert verdict is not None and not verdict.speculate and verdict.winner is None
    assert verdict.summary == DO_NOT_SPECULATE_ON_VLLM
    assert "not above it by more than the noise" in verdict.reasons[0]
    step = verdict.reasons[-1]
    assert step.startswith(NEXT_STEP)
    assert shlex.split(step.removeprefix(NEXT_STEP)) == ["vllm", "serve", str(FOLDER)]
    slower = vllm_verdict(_check(_replay(15.0, 12.0, (0.8, 0.8, 0.8))))
    assert slower is not None and slower.summary == DO_NOT_SPECULATE_ON_VLLM


def test_a_configuration_vllm_cannot_run_is_a_verdict_with_its_reason() -> None:
    check = _check(None, reason="vLLM did not start with it: exited (1)", refused=True)
    verdict = vllm_verdict(check)
    assert verdict is not None and verdict.summary == DO_NOT_SPECULATE_ON_VLLM
    assert verdict.reasons[0] == "vLLM cannot run ngram K=2: vLLM did not start with it: exited (1)"
    assert verdict.reasons[1].startswith(NEXT_STEP)


def test_nothing_measured_on_vllm_leaves_the_screening_verdict() -> None:
    assert vllm_verdict(_check(None, reason="vLLM without speculation did not start")) is None
    assert vllm_verdict(_check(_replay(15.0, 0.0, ()))) is None  # no prompt pair


# --- the record -----------------------------------------------------------------------


def _advice(verdict: Verdict, *runs: tuple[str, float, tuple[float, ...]]) -> Advice:
    results = tuple(
        ConfigResult(_prediction(label.split()[0], int(label[-1])), _run(label, s, r))
        for label, s, r in runs
    )
    results += (ConfigResult(_prediction("suffix", 3), None),)  # predicted, not verified
    return Advice("default", 1, {1: 1.1}, {}, (), results, verdict, (), ("a note",), {}, 1.0)


def test_advice_json_holds_both_engines_figures_and_both_verdicts(tmp_path: Path) -> None:
    screening = Verdict(False, None, DO_NOT_SPECULATE, ("best measured ngram K=2: 1.10x",))
    advice = _advice(screening, ("ngram K=2", 1.1, (1.0, 1.2, 1.1)))
    check = _check(_replay(15.0, 18.0, (1.19, 1.21, 1.2, 1.2), same=3))
    measured = measured_on("vllm", "default", "auto", vllm_ready=True)
    advice, stated = with_check(advice, check, measured)
    assert advice.verdict.summary.startswith("speculate with ngram K=2 on vLLM")
    assert stated.verdict_on == "vllm"
    assert "the verdict is vLLM's own" in stated.statement
    assert "screened on spectune's runtime (--runtime auto)" in stated.statement
    assert any("differed from without on 1 of 4" in note for note in advice.notes)
    advice.write(tmp_path / "advice.json")
    data = json.loads((tmp_path / "advice.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 5
    assert data["verdict"]["summary"] == advice.verdict.summary
    assert data["screening_verdict"]["summary"] == DO_NOT_SPECULATE  # spectune's, kept
    record = data["engine_check"]
    assert record["engine"] == "vllm" and record["measured"] is True
    assert record["speculative_config"] == NGRAM
    assert record["command"] == (
        f"vllm serve {FOLDER} --speculative-config "
        + shlex.quote(json.dumps(NGRAM, separators=(",", ":")))
    )
    assert record["spectune"]["runtime"] == "auto"
    assert record["spectune"]["measured_speedup"] == pytest.approx(1.1)
    vllm = record["vllm"]
    assert vllm["plain"]["tokens_per_second"] == 15.0
    assert vllm["speculative"]["tokens_per_second"] == 18.0
    assert vllm["speedup"] == pytest.approx(1.2)
    assert vllm["acceptance"]["draft_tokens"] == 60 and vllm["acceptance"]["accepted"] == 27
    assert vllm["acceptance"]["kept_by_position"] == [18, 9]
    assert vllm["same_output"] == 3 and len(vllm["per_prompt_speedup"]) == 4
    for key in ("target", "configurations", "checklist", "notes", "outputs", "machine"):
        assert key in data  # schema 4's fields are all still there
    assert export_command(advice) == record["command"]


def test_a_check_that_measured_nothing_keeps_spectunes_verdict_and_says_why() -> None:
    screening = Verdict(True, "ngram K=2", "speculate with ngram K=2", ("1.3x",))
    advice = _advice(screening, ("ngram K=2", 1.3, (1.3, 1.3)))
    check = _check(None, reason="vLLM without speculation did not start: exited (1)")
    measured = measured_on("vllm", "default", "auto", vllm_ready=True)
    advice, stated = with_check(advice, check, measured)
    assert advice.verdict is screening and stated.verdict_on == "spectune"
    assert "the verdict is spectune's" in stated.statement
    assert "did not start" in stated.statement
    assert advice.to_dict()["engine_check"]["vllm"] is None
    # The winner's vLLM command names the folder vLLM serves, not the GGUF.
    assert export_command(advice) == f"vllm serve {FOLDER} --speculative-config " + shlex.quote(
        json.dumps(NGRAM, separators=(",", ":"))
    )


def test_which_configuration_vllm_runs() -> None:
    runs = (("ngram K=2", 1.1, (0.6, 1.6)), ("suffix K=1", 1.05, (1.04, 1.06)))
    nothing = Verdict(False, None, DO_NOT_SPECULATE, ())
    # No winner: the best lower bound (suffix: 1.05 - 0.02 beats ngram: 1.1 - 1.0).
    chosen = pick(_advice(nothing, *runs))
    assert chosen is not None and chosen.prediction.label == "suffix K=1"
    winner = Verdict(True, "ngram K=2", "speculate with ngram K=2", ())
    chosen = pick(_advice(winner, *runs))
    assert chosen is not None and chosen.prediction.label == "ngram K=2"
    busy = Verdict(False, None, NO_VERDICT, ())
    assert pick(_advice(busy, *runs)) is None
    assert pick(_advice(nothing)) is None  # nothing verified
    advice, stated = with_check(
        _advice(busy, *runs), None, measured_on("vllm", "default", "auto", vllm_ready=True)
    )
    assert "nothing was run on vLLM (the screening ran on a busy machine)" in stated.statement


def test_held_apart_prompts_are_advises_and_the_warmup_is_not_one() -> None:
    prompts = [(f"p{i}", "ab"[i % 2], [i, i + 1]) for i in range(8)]
    held, warmup = held_and_warmup(prompts, 3)
    assert held == [[2, 3], [6, 7], [3, 4]]  # split_prompts' held-apart half, first three
    assert warmup not in held


def test_statements_name_the_engine_and_the_install_command() -> None:
    missing = measured_on("vllm", "default", "auto", vllm_ready=False)
    assert "not vLLM's" in missing.statement and "'make vllm'" in missing.statement
    assert missing.verdict_on == "spectune"
    ready = measured_on("vllm", "default", "auto", vllm_ready=True)
    assert ready.verdict_on == "vllm" and "the verdict is vLLM's" in ready.statement
    assert ready.as_json()["verdict_on"] == "vllm"


def test_vllm_loads_an_eagle3_head_and_its_own_methods_not_spectunes_head() -> None:
    assert draft_refusal("ngram") is None and draft_refusal("suffix") is None
    assert draft_refusal("tests/fixtures/smollm2-eagle3") is None  # converted by advise
    reason = draft_refusal("smollm2-draft")
    assert reason is not None and reason.startswith("vLLM cannot load draft smollm2-draft")
    assert draft_refusal("hybrid") is not None


# --- the replay, on two scripted servers ------------------------------------------------


def test_schedule_alternates_and_deals_out_prompts_a_cache_would_repeat() -> None:
    assert schedule(3, 2, False) == [
        [(0, True), (1, False), (2, True)],
        [(0, False), (1, True), (2, False)],
    ]
    assert schedule(5, 2, True) == [[(0, True), (2, False), (4, True)], [(1, False), (3, True)]]
    assert keeps_answers({"method": "suffix"}) and not keeps_answers(NGRAM)
    assert not keeps_answers({"method": "suffix", "suffix_decoding_max_cached_requests": 0})


def test_replay_interleaves_sums_and_reads_the_counters_around_the_measured_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sent: list[tuple[str, tuple[int, ...]]] = []
    started: list[Any] = []
    scrapes = iter(
        [
            SpecCounts(steps=2, num_draft_tokens=4, positions=4, accepted=1),  # after warm-up
            SpecCounts(steps=12, num_draft_tokens=24, positions=24, accepted=11),
        ]
    )

    @contextmanager
    def server(settings: VllmSettings, *, log: Path) -> Iterator[str]:
        started.append(settings.speculative_config)
        yield "http://on" if settings.speculative_config else "http://off"

    def complete(url: str, model: str, prompt: Any, max_tokens: int) -> tuple[int, str]:
        sent.append((url, tuple(prompt)))
        return (max_tokens if url == "http://on" else max_tokens - 1), "same text"

    monkeypatch.setattr(replay_module, "vllm_server", server)
    monkeypatch.setattr(replay_module, "_complete", complete)
    monkeypatch.setattr(replay_module, "_counters", lambda url: next(scrapes))
    plan = ReplayPlan(((1,), (2,)), max_tokens=10, rounds=2, warmup=(9,))
    result = replay_off_and_on(VllmSettings(FOLDER, NGRAM), plan, tmp_path)
    assert started == [None, NGRAM]  # off first, then the speculative config
    assert sent[:2] == [("http://off", (9,)), ("http://on", (9,))]  # warm-up, not counted
    off, on = "http://off", "http://on"
    # Prompt by prompt, the first server alternates; round 2 starts the other way round.
    assert [u for u, _ in sent[2:]] == [off, on, on, off] + [on, off, off, on]
    assert result.plain.tokens == 4 * 9 and result.speculative.tokens == 4 * 10
    assert result.plain.requests == result.speculative.requests == 4
    assert result.pairs == 4 and result.same_output == 4
    assert result.counts is not None
    assert (result.counts.steps, result.counts.num_draft_tokens, result.counts.accepted) == (
        10,
        20,
        10,
    )
    assert result.prompts_per_round == (2, 2)


def test_the_speculative_config_is_exports_and_a_refusal_starts_no_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from spectune.advise import on_vllm

    config, _ = speculative_config(_prediction("ngram", 2), FOLDER, tmp_path)
    assert config["method"] == "ngram" and config["num_speculative_tokens"] == 2
    config, notes = speculative_config(_prediction("suffix", 3), FOLDER, tmp_path)
    assert config == {"method": "suffix", "num_speculative_tokens": 3}
    assert any("suffix" in note for note in notes)

    def no_server(*args: Any, **kwargs: Any) -> Replay:
        raise AssertionError("no server starts for a configuration vLLM cannot load")

    monkeypatch.setattr(on_vllm, "vllm_target", lambda target: (FOLDER, False))
    monkeypatch.setattr(on_vllm, "replay_off_and_on", no_server)
    winner = Verdict(True, "smollm2-draft K=2", "speculate with smollm2-draft K=2", ())
    advice = _advice(winner, ("smollm2-draft K=2", 1.3, (1.3, 1.3)))
    check = check_on_vllm(
        advice, "default", [[1, 2]], [3], max_tokens=8, quick=True, out=tmp_path, runtime="auto"
    )
    assert check is not None and check.refused and check.speculative_config is None
    assert check.reason is not None and "vLLM cannot load draft smollm2-draft" in check.reason
    verdict = vllm_verdict(check)
    assert verdict is not None and verdict.summary == DO_NOT_SPECULATE_ON_VLLM
