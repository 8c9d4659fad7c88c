"""vLLM (``make vllm``) serving spectune's EAGLE-3-layout head for the default target, as
``spectune convert --draft`` writes it: greedy output equals vLLM's without speculation,
and vLLM's accepted draft tokens per position equal spectune's own for the same head on
the same prompt tokens (K = 3, T = 0, the head in fp32 on both sides).

The head (tests/fixtures/smollm2-eagle3) was distilled on two CPU cores in about half an
hour (docs/vllm.md, "spectune's head in vLLM"): it drafts well enough that acceptance is
far from 0 and 1, which is what the comparison needs. Two server starts, eager, short
answers: a few minutes on two cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _vllm import LIVE, chat
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.loading import load_feature_head
from spectune.engines.hf_folder import convert_target
from spectune.engines.metrics import read_exposition
from spectune.engines.vllm import VllmSettings, vllm_server
from spectune.engines.vllm.eagle3 import Eagle3Export, export_eagle3
from spectune.records import SpecCounts
from spectune.sampling import SamplingParams

pytestmark = LIVE

HEAD = Path(__file__).parent / "fixtures" / "smollm2-eagle3"
PROMPTS = (
    "Count from 1 to 30, separated by commas.",
    "Write a Python function that returns the square of a number.",
    "Name the days of the week, one per line.",
)
MAX_TOKENS = 48
K = 3


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vllm") / "target"
    convert_target("default", folder)  # checked against the runtime in tests/test_convert.py
    return folder


@pytest.fixture(scope="module")
def head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Eagle3Export:
    return export_eagle3(HEAD, target, tmp_path_factory.mktemp("vllm") / "head", k=K)


@pytest.fixture(scope="module")
def plain(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    log = tmp_path_factory.mktemp("logs") / "vllm-plain.log"
    with vllm_server(VllmSettings(target), log=log) as url:
        yield [chat(url, target, p, MAX_TOKENS, return_token_ids=True) for p in PROMPTS]


def spectune_counts(smollm2: Any, prompt: list[int], expected: list[int]) -> SpecCounts:
    """spectune's own engine, fp32 target and fp32 head, K fixed, greedy: its counters."""
    model = smollm2.model
    head, subset = load_feature_head(HEAD, model.net)
    before = model.feature_layers  # the fixture is shared: another head may be exposed
    model.expose_layers(())
    model.expose_layers(head.cfg.feature_layers)
    try:
        drafter = FeatureDrafter(head, subset, name="feature:smollm2-eagle3")
        run = SpeculativeEngine(model, drafter).run(
            prompt, SamplingParams(max_tokens=MAX_TOKENS), policy=FixedK(K)
        )
    finally:
        model.expose_layers(())
        model.expose_layers(before)
    assert run.tokens[: len(expected)] == expected  # the same text as vLLM's
    return run.counts


def test_vllm_serves_the_head_losslessly_with_spectunes_acceptance(
    target: Path, head: Eagle3Export, plain: list[dict[str, Any]], smollm2: Any, tmp_path: Path
) -> None:
    settings = VllmSettings(
        target,
        head.speculative_config(K),
        extra_args=("--per-request-spec-decode-metrics", "summary"),
    )
    with vllm_server(settings, log=tmp_path / "vllm-eagle3.log") as url:
        answers = [chat(url, target, p, MAX_TOKENS, return_token_ids=True) for p in PROMPTS]
        counters = read_exposition(httpx.get(url + "/metrics", timeout=30).text).counts
    log = (tmp_path / "vllm-eagle3.log").read_text()
    assert "eagle3" in log.lower()
    # Greedy: speculation changes the speed, not the tokens.
    assert [a["choices"][0]["token_ids"] for a in answers] == [
        a["choices"][0]["token_ids"] for a in plain
    ]

    vllm_steps = vllm_drafted = 0
    vllm_kept = [0] * K
    ours = SpecCounts()
    for answer in answers:
        m = answer["metrics"]["speculative_decoding"]
        vllm_steps += m["num_spec_steps"]
        vllm_drafted += m["num_draft_tokens"]
        # acceptance_histogram[j]: steps that accepted exactly j draft tokens.
        for j in range(K):
            vllm_kept[j] += sum(m["acceptance_histogram"][j + 1 :])
        counts = spectune_counts(
            smollm2, answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
        )
        ours.merge(counts)
    # vLLM's /metrics counters are the per-request sums (tests/test_vllm_live.py).
    assert counters is not None
    assert (counters.steps, counters.accepted_at) == (vllm_steps, vllm_kept)
    vllm_rates = [k / vllm_steps for k in vllm_kept]
    our_rates = [k / n for k, n in zip(ours.accepted_at, ours.tested_at, strict=False)][:K]
    print(f"vLLM: {vllm_steps} drafts, kept by position {vllm_kept} ({vllm_rates})")
    print(f"spectune: {ours.steps} steps, tested {ours.tested_at} kept {ours.accepted_at}")
    assert vllm_kept[0] > 0.1 * vllm_steps  # the head drafts: the comparison means something
    # The same drafts from the same states, so the same tokens kept at each position, up
    # to argmax near-ties between two fp32 implementations (none in the recorded run). The
    # denominators differ by a step or two: near the end spectune drafts only the tokens
    # left (a last step may draft none) where vLLM drafts K.
    slack = max(1, round(0.02 * vllm_steps))
    for j in range(K):
        assert abs(vllm_kept[j] - ours.accepted_at[j]) <= slack
        assert abs(vllm_rates[j] - our_rates[j]) <= 0.03
