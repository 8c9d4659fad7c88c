"""The same prompts on two vLLM servers, one without speculation and one with, interleaved:
vLLM's own tokens/s for each, and its acceptance from ``/metrics``.

Both servers run at once (``vllm_server``, the same ``VllmSettings`` but for
``--speculative-config``), and only one is ever answering: each prompt goes to one and
then to the other, greedy, one request at a time, so a shared machine's drift falls on
both alike. Which server goes first alternates from one prompt to the next and from one
round to the next. Prompts are token ids (``/v1/completions`` with a list of ids), so vLLM
decodes the very prompts spectune measured, chat template and all.

A request's figure is its output tokens (``usage.completion_tokens``) over its wall time,
prefill included; a server's is its tokens over its seconds, pooled. Each prompt pair
gives one ratio (speculative over plain). vLLM's counters (``vllm:spec_decode_*``) are read
before the first measured request and after the last; their difference is the acceptance
over exactly the measured requests.

Rounds replay every prompt, except where the method keeps earlier answers across requests
(``suffix``'s global cache, on by default): a second round would draft a prompt's answer
from its own first answer, so there the prompts are dealt out over the rounds instead,
each sent once. One warm-up request per server, not counted, comes first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spectune.engines.process import EngineStartError
from spectune.engines.vllm.metrics import read_vllm
from spectune.engines.vllm.server import VllmSettings, vllm_server
from spectune.monitor.remote import Exposition
from spectune.records import SpecCounts

__all__ = [
    "Replay",
    "ReplayPlan",
    "ServerFigures",
    "SpeculationRefused",
    "keeps_answers",
    "replay_off_and_on",
    "schedule",
]

REQUEST_TIMEOUT = 900.0  # seconds for one request; a loaded 2-core machine is slow
WARMUP_TOKENS = 8


class SpeculationRefused(EngineStartError):
    """vLLM started without speculation but not with the speculative config."""


@dataclass(frozen=True)
class ReplayPlan:
    prompts: tuple[tuple[int, ...], ...]  # [prompt]: token ids, as the target encodes them
    max_tokens: int
    rounds: int
    warmup: tuple[int, ...]  # token ids of a prompt outside ``prompts``


@dataclass(frozen=True)
class ServerFigures:
    """One server's measured requests, pooled."""

    requests: int
    tokens: int  # output tokens (usage)
    seconds: float  # wall, request by request, summed

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 3),
        }


@dataclass(frozen=True)
class Replay:
    """What vLLM measured: both servers' figures, the per-prompt ratios, its counters."""

    speculative_config: Mapping[str, Any]
    plain: ServerFigures
    speculative: ServerFigures
    ratios: tuple[float, ...]  # [pair]: speculative tokens/s over plain's, same prompt
    counts: SpecCounts | None  # vLLM's spec_decode counters over the measured requests
    # (None: a counter went down, the server restarted underneath)
    same_output: int  # pairs whose texts were equal (greedy: all, bar fp32 near-ties)
    rounds: int
    prompts_per_round: tuple[int, ...]
    logs: tuple[Path, Path] = field(default=(Path(), Path()))  # plain, speculative

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    @property
    def speedup(self) -> float:
        """Pooled: the speculative server's tokens/s over the plain server's."""
        plain = self.plain.tokens_per_second
        return self.speculative.tokens_per_second / plain if plain > 0 else 0.0


def keeps_answers(config: Mapping[str, Any]) -> bool:
    """Whether the method drafts from earlier requests' answers (suffix's global cache)."""
    return (
        config.get("method") == "suffix"
        and int(config.get("suffix_decoding_max_cached_requests", 1)) != 0
    )


def schedule(count: int, rounds: int, keeps: bool) -> list[list[tuple[int, bool]]]:
    """[round]: (prompt index, plain first) in sending order. Every prompt each round, or,
    where the method ``keeps`` answers, each prompt once, dealt out over the rounds. Which
    server goes first alternates over prompts and over rounds."""
    if keeps:
        dealt = [list(range(r, count, rounds)) for r in range(rounds)]
    else:
        dealt = [list(range(count)) for _ in range(rounds)]
    return [[(i, (r + n) % 2 == 0) for n, i in enumerate(round_)] for r, round_ in enumerate(dealt)]


def _complete(url: str, model: str, prompt: Sequence[int], max_tokens: int) -> tuple[int, str]:
    """One greedy completion of token ids: (output tokens, text)."""
    body = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT)
    response.raise_for_status()
    answer = response.json()
    return int(answer["usage"]["completion_tokens"]), str(answer["choices"][0]["text"])


def _counters(url: str) -> SpecCounts:
    text = httpx.get(url + "/metrics", timeout=30).text
    counts = read_vllm(Exposition.parse(text)).counts
    assert counts is not None  # vLLM's dialect always reads counters
    return counts


def replay_off_and_on(
    settings: VllmSettings,
    plan: ReplayPlan,
    log_dir: Path,
    *,
    on_step: Callable[[str, int, int], None] | None = None,
) -> Replay:
    """Start vLLM on ``settings.model`` without speculation and with
    ``settings.speculative_config``, replay ``plan`` on both (module docstring), stop them.
    ``on_step(what, done, total)`` follows the progress. A server that does not start
    raises ``EngineStartError`` (its log's last lines in one line), ``SpeculationRefused``
    where only the speculative one failed."""
    assert settings.speculative_config is not None
    config = dict(settings.speculative_config)
    model = str(settings.model)
    order = schedule(len(plan.prompts), plan.rounds, keeps_answers(config))
    total = sum(len(r) for r in order)
    logs = (log_dir / "vllm-off.log", log_dir / "vllm-speculative.log")

    def step(what: str, done: int) -> None:
        if on_step is not None:
            on_step(what, done, total)

    with ExitStack() as servers:
        step("starting vLLM without speculation", 0)
        off_settings = dataclasses.replace(settings, speculative_config=None)
        off = servers.enter_context(vllm_server(off_settings, log=logs[0]))
        step("starting vLLM with speculation", 0)
        try:
            on = servers.enter_context(vllm_server(settings, log=logs[1]))
        except EngineStartError as exc:
            raise SpeculationRefused(str(exc)) from None
        for url in (off, on):
            _complete(url, model, plan.warmup, WARMUP_TOKENS)
        before = _counters(on)
        tokens = {off: 0, on: 0}
        seconds = {off: 0.0, on: 0.0}
        ratios: list[float] = []
        same = done = 0
        for round_ in order:
            for index, plain_first in round_:
                texts: dict[str, str] = {}
                rates: dict[str, float] = {}
                for url in (off, on) if plain_first else (on, off):
                    start = time.perf_counter()
                    count, texts[url] = _complete(url, model, plan.prompts[index], plan.max_tokens)
                    wall = time.perf_counter() - start
                    tokens[url] += count
                    seconds[url] += wall
                    rates[url] = count / wall if wall > 0 else 0.0
                if rates[off] > 0 and rates[on] > 0:
                    ratios.append(rates[on] / rates[off])
                same += texts[off] == texts[on]
                done += 1
                step("replaying the held-apart prompts on vLLM (off, on)", done)
        counts = _counters(on).since(before)
    return Replay(
        config,
        ServerFigures(total, tokens[off], seconds[off]),
        ServerFigures(total, tokens[on], seconds[on]),
        tuple(ratios),
        counts,
        same,
        plan.rounds,
        tuple(len(r) for r in order),
        logs,
    )
