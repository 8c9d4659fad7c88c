"""``spectune tune --engine vllm``: measure vLLM's speculation configurations on a real
vLLM server each, and write the ``--speculative-config`` that measured best, with a
batch-size schedule, and the cost profile the measurements give.

The run, in three steps:

1. **Screen** (development prompts, one pass): one server per candidate (``tune_grid``),
   off first; at each level (concurrency) the clients send a batch of prompts of its own,
   so a server never sees a prompt twice (suffix decoding's global cache would draft
   from its own earlier answer). Every candidate gets the same batches.
2. **Pick**: per family (a configuration without its K), the K that screened best at
   each level, 0 where none beat off; the family whose best Ks gained most (geometric
   mean over levels) becomes a schedule (``tune_schedule``).
3. **Confirm** (held-apart prompts, ``rounds`` interleaved rounds): off, the schedule
   (a server started with the very ``--speculative-config`` that would be written) and
   vLLM's built-in methods at their defaults, all up at once; round by round and level
   by level each gets the same batch, in an order that alternates, so a drift of the
   machine's load falls on all alike. Each round has prompts of its own. The guard
   (``tune_schedule.guard``) then keeps a level's K only where the schedule beat off
   beyond the noise, and keeps speculation off if it never did.

A batch's figure is its output tokens (``usage``) over its wall time, the whole batch of
requests; vLLM's acceptance comes from its counters read before and after.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spectune.engines.costs import StepCosts
from spectune.engines.process import EngineStartError
from spectune.engines.vllm.metrics import read_vllm
from spectune.engines.vllm.server import VllmSettings, vllm_server
from spectune.engines.vllm.tune_grid import ONE_K_METHODS, Candidate
from spectune.engines.vllm.tune_schedule import (
    CostPoint,
    Guarded,
    Ratio,
    build_schedule,
    fit_costs,
    guard,
    one_k_ranges,
    ratio,
    schedule_ranges,
)
from spectune.monitor.remote import Exposition
from spectune.prompts import EvalPrompt

__all__ = [
    "SCHEDULE",
    "Batch",
    "TunePlan",
    "VllmTuneResult",
    "allot",
    "check_config",
    "run_batch",
    "tune_vllm",
]

REQUEST_TIMEOUT = 900.0  # seconds for one request; a loaded 2-core machine is slow


@dataclass(frozen=True)
class TunePlan:
    """What to measure and how."""

    target: Path  # the Hugging Face folder vLLM serves
    candidates: tuple[Candidate, ...]  # off first
    levels: tuple[int, ...]  # concurrency levels, increasing
    screen_cells: Mapping[int, tuple[EvalPrompt, ...]]  # [level]: its development prompts
    confirm_cells: tuple[Mapping[int, tuple[EvalPrompt, ...]], ...]  # [round][level]
    max_tokens: int
    temperature: float
    stream: bool
    noise_z: float
    log_dir: Path


@dataclass(frozen=True)
class Batch:
    """One batch of requests sent by ``concurrency`` clients."""

    concurrency: int
    requests: int
    tokens: int  # output tokens (usage)
    seconds: float  # wall time, first request sent to last answer
    drafts: int  # vLLM's counters over the batch
    draft_tokens: int
    accepted: int
    texts: tuple[str, ...] = field(repr=False)  # the answers, in prompt order
    # vLLM's own decode time over the batch's requests (its request_decode_time_seconds
    # histogram: first token to last, no prefill, no HTTP); 0 where it exports none
    decode_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "decode_seconds": round(self.decode_seconds, 3),
        }


def allot(
    prompts: Sequence[EvalPrompt], levels: Sequence[int], per_cell: int, rounds: int = 1
) -> list[dict[int, tuple[EvalPrompt, ...]]]:
    """``rounds`` x ``levels`` cells of ``per_cell`` prompts each, none used twice,
    categories taken in turn so that every cell mixes them; ValueError when the prompts
    do not reach."""
    needed = per_cell * len(levels) * rounds
    if len(prompts) < needed:
        raise ValueError(f"needs {needed} prompts ({rounds} x {len(levels)} x {per_cell})")
    by_category: dict[str, list[EvalPrompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    mixed: list[EvalPrompt] = []
    while len(mixed) < needed:
        for queue in by_category.values():
            if queue and len(mixed) < needed:
                mixed.append(queue.pop(0))
    cells = iter(mixed[i : i + per_cell] for i in range(0, needed, per_cell))
    return [{level: tuple(next(cells)) for level in levels} for _ in range(rounds)]


def _counters(url: str) -> tuple[int, int, int, float]:
    """vLLM's (drafts, draft tokens, accepted) so far, zeros without speculation, and its
    requests' decode seconds so far (0 where it exports none)."""
    ex = Exposition.parse(httpx.get(url + "/metrics", timeout=30).text)
    decode = decode_seconds(ex)
    if not any(name.startswith("vllm:spec_decode_num_draft_tokens") for name in ex.names()):
        return 0, 0, 0, decode
    counts = read_vllm(ex).counts
    if counts is None:
        return 0, 0, 0, decode
    return counts.steps, counts.num_draft_tokens, counts.accepted, decode


def decode_seconds(ex: Exposition) -> float:
    """vLLM's ``request_decode_time_seconds`` histogram's sum over its label sets: its
    requests' time from first token to last (0.0 where it exports none)."""
    return ex.total("vllm:request_decode_time_seconds_sum") or 0.0


def _request(url: str, model: str, prompt: EvalPrompt, plan: TunePlan) -> tuple[int, str]:
    """One chat completion: (output tokens, text)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [dict(m) for m in prompt.messages],
        "max_tokens": plan.max_tokens,
        "temperature": plan.temperature,
    }
    endpoint = url + "/v1/chat/completions"
    if not plan.stream:
        response = httpx.post(endpoint, json=body, timeout=REQUEST_TIMEOUT)
        response.raise_for_status()
        answer = response.json()
        return int(answer["usage"]["completion_tokens"]), answer["choices"][0]["message"][
            "content"
        ] or ""
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    tokens, parts = 0, []
    with httpx.stream("POST", endpoint, json=body, timeout=REQUEST_TIMEOUT) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk.get("choices") or ():
                parts.append(choice.get("delta", {}).get("content") or "")
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return tokens, "".join(parts)


def run_batch(
    url: str, model: str, prompts: Sequence[EvalPrompt], concurrency: int, plan: TunePlan
) -> Batch:
    """``prompts`` sent by ``concurrency`` clients at once; timed as one batch."""
    before = _counters(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(lambda p: _request(url, model, p, plan), prompts))
    seconds = time.perf_counter() - start
    after = _counters(url)
    drafts, draft_tokens, accepted, decoded = after
    drafts, draft_tokens, accepted = (
        drafts - before[0],
        draft_tokens - before[1],
        accepted - before[2],
    )
    return Batch(
        concurrency,
        len(prompts),
        sum(tokens for tokens, _ in answers),
        seconds,
        drafts,
        draft_tokens,
        accepted,
        tuple(text for _, text in answers),
        decode_seconds=max(decoded - before[3], 0.0),
    )


@dataclass
class VllmTuneResult:
    """Every figure of a run; ``to_json`` is the report."""

    plan: TunePlan
    screen: dict[str, dict[int, Batch]]  # [candidate][level]
    family: str | None  # the family picked for a schedule (None: nothing beat off)
    screen_k: dict[int, int]  # [level]: K the screen gave the schedule
    confirm: dict[str, list[dict[int, Batch]]]  # [configuration][round][level]
    confirm_configs: dict[str, Mapping[str, Any] | None]
    guarded: Guarded | None
    speculative_config: dict[str, Any] | None  # what is written; None: keep off
    costs: StepCosts | None
    seconds: float = 0.0

    def screen_ratio(self, name: str, level: int) -> float:
        off = self.screen["off"][level].tokens_per_second
        return self.screen[name][level].tokens_per_second / off if off else 0.0

    def confirm_rates(self, name: str, level: int) -> list[float]:
        return [r[level].tokens_per_second for r in self.confirm[name]]

    def confirm_ratio(self, name: str, level: int) -> Ratio:
        return ratio(self.confirm_rates(name, level), self.confirm_rates("off", level))

    def greedy_equal(self, name: str) -> tuple[int, int]:
        """(answers equal to off's, answers) over the confirmation."""
        pairs = [
            (a, b)
            for mine, off in zip(self.confirm[name], self.confirm["off"], strict=True)
            for level in mine
            for a, b in zip(mine[level].texts, off[level].texts, strict=True)
        ]
        return sum(a == b for a, b in pairs), len(pairs)

    def best_builtin(self, level: int) -> tuple[str, Ratio] | None:
        builtins = [n for n in self.confirm if n not in ("off", SCHEDULE)]
        rated = [(n, self.confirm_ratio(n, level)) for n in builtins]
        return max(rated, key=lambda item: item[1].mean) if rated else None

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        levels = list(plan.levels)
        confirm: dict[str, Any] = {}
        for name, rounds in self.confirm.items():
            entry: dict[str, Any] = {"config": self.confirm_configs[name], "levels": {}}
            for level in levels:
                rates = self.confirm_rates(name, level)
                r = self.confirm_ratio(name, level)
                drafted = sum(b[level].draft_tokens for b in rounds)
                entry["levels"][str(level)] = {
                    "tokens_per_second": [round(x, 2) for x in rates],
                    "mean": round(statistics.fmean(rates), 2),
                    "se": _se(rates),
                    "ratio": round(r.mean, 4),
                    "ratio_se": None if r.se is None else round(r.se, 4),
                    "acceptance": (
                        round(sum(b[level].accepted for b in rounds) / drafted, 4)
                        if drafted
                        else None
                    ),
                }
            if name != "off" and self.greedy_equal(name)[1] and plan.temperature == 0:
                equal, total = self.greedy_equal(name)
                entry["greedy_equal_to_off"] = f"{equal}/{total}"
            confirm[name] = entry
        guarded = self.guarded
        return {
            "engine": "vllm",
            "target": str(plan.target),
            "levels": levels,
            "stream": plan.stream,
            "max_tokens": plan.max_tokens,
            "temperature": plan.temperature,
            "rounds": len(plan.confirm_cells),
            "noise_z": plan.noise_z,
            "screen_prompts": {str(c): [p.id for p in ps] for c, ps in plan.screen_cells.items()},
            "confirm_prompts": [
                {str(c): [p.id for p in ps] for c, ps in cells.items()}
                for cells in plan.confirm_cells
            ],
            "screen": {
                c.name: {
                    "family": c.family,
                    "k": c.k,
                    "builtin": c.builtin,
                    "config": c.config,
                    "levels": {str(lv): self.screen[c.name][lv].as_json() for lv in levels},
                    "ratio": {str(lv): round(self.screen_ratio(c.name, lv), 4) for lv in levels},
                }
                for c in plan.candidates
            },
            "family": self.family,
            "screen_k": {str(c): k for c, k in self.screen_k.items()},
            "confirm": confirm,
            "schedule": None
            if guarded is None
            else {
                "k": {str(c): k for c, k in guarded.k_at.items()},
                "ranges": guarded.ranges,
                "dropped": list(guarded.dropped),
                "reason": guarded.reason,
            },
            "speculative_config": self.speculative_config,
            "costs": None if self.costs is None else self.costs.as_json(),
            "logs": str(plan.log_dir),
            "seconds": round(self.seconds, 1),
        }


SCHEDULE = "schedule"  # the confirmed schedule's name in ``VllmTuneResult.confirm``


def _se(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    return round(statistics.stdev(values) / math.sqrt(len(values)), 3)


def _log(plan: TunePlan, name: str) -> Path:
    return plan.log_dir / (name.replace(" ", "_").replace("/", "_") + ".log")


def _server(plan: TunePlan, name: str, config: Mapping[str, Any] | None) -> Any:
    return vllm_server(VllmSettings(plan.target, config), log=_log(plan, name))


@contextmanager
def _answering(plan: TunePlan, name: str) -> Iterator[None]:
    """A server that stops answering while it is measured ends the run in one line that
    names its log (vLLM's engine can die on a configuration it accepted at start)."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise EngineStartError(
            f"vLLM ({name}) stopped answering ({exc}); its log: {_log(plan, name)}"
        ) from exc


def _warm(url: str, plan: TunePlan) -> None:
    """One short request, so that the first batch does not pay for the first step."""
    body = {
        "model": str(plan.target),
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    httpx.post(url + "/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT)


def _screen(
    plan: TunePlan, on_start: Callable[[str], None], on_batch: Callable[[], None]
) -> dict[str, dict[int, Batch]]:
    out: dict[str, dict[int, Batch]] = {}
    for candidate in plan.candidates:
        on_start(f"screening {candidate.name}")
        name = "screen " + candidate.name
        with _server(plan, name, candidate.config) as url, _answering(plan, name):
            _warm(url, plan)
            out[candidate.name] = {}
            for level in plan.levels:
                prompts = plan.screen_cells[level]
                out[candidate.name][level] = run_batch(url, str(plan.target), prompts, level, plan)
                on_batch()
    return out


def _one_k(candidate: Candidate) -> bool:
    return candidate.config is not None and candidate.config["method"] in ONE_K_METHODS


def _pick(
    plan: TunePlan, screen: Mapping[str, Mapping[int, Batch]]
) -> tuple[Candidate | None, dict[int, int]]:
    """The family whose per-level best K gained most in the screen (geometric mean over
    levels of max(1, ratio)), as its largest-K member and the K per level; (None, all 0)
    when nothing beat off. The screen is one pass: no noise test here, the confirmation
    makes it."""

    def screened(c: Candidate, level: int) -> float:
        return screen[c.name][level].tokens_per_second / screen["off"][level].tokens_per_second

    families: dict[str, list[Candidate]] = {}
    for c in plan.candidates[1:]:
        families.setdefault(c.family, []).append(c)
    best: tuple[float, str] | None = None
    choices: dict[str, dict[int, int]] = {}
    for family, members in families.items():
        by_level = {
            level: {c.k: Ratio(screened(c, level), None, 1) for c in members}
            for level in plan.levels
        }
        k_at, _ = build_schedule(by_level, z=0.0, one_k=_one_k(members[0]))
        choices[family] = k_at
        gains = [max(1.0, by_level[level][k].mean) if k else 1.0 for level, k in k_at.items()]
        score = math.exp(statistics.fmean(math.log(g) for g in gains))
        if score > 1 and (best is None or score > best[0]):
            best = (score, family)
    if best is None:
        return None, {level: 0 for level in plan.levels}
    members = families[best[1]]
    return max(members, key=lambda c: c.k), choices[best[1]]


def _confirm(
    plan: TunePlan,
    configs: Mapping[str, Mapping[str, Any] | None],
    on_start: Callable[[str], None],
    on_batch: Callable[[], None],
) -> dict[str, list[dict[int, Batch]]]:
    names = list(configs)
    out: dict[str, list[dict[int, Batch]]] = {name: [] for name in names}
    with ExitStack() as stack:
        urls = {}
        for name in names:
            on_start(f"starting {name}")
            urls[name] = stack.enter_context(_server(plan, "confirm " + name, configs[name]))
            with _answering(plan, "confirm " + name):
                _warm(urls[name], plan)
        for r, cells in enumerate(plan.confirm_cells):
            for name in names:
                out[name].append({})
            for j, level in enumerate(plan.levels):
                order = names if (r + j) % 2 == 0 else names[::-1]
                for name in order:
                    on_start(f"round {r + 1}: {name} at concurrency {level}")
                    with _answering(plan, "confirm " + name):
                        batch = run_batch(urls[name], str(plan.target), cells[level], level, plan)
                    out[name][r][level] = batch
                    on_batch()
    return out


def _cost_profile(
    plan: TunePlan, screen: Mapping[str, Mapping[int, Batch]], family: str | None
) -> StepCosts | None:
    """The verification curve from the screen's batches at concurrency 1: the picked
    family's configurations (every speculating one when none was picked)."""
    if 1 not in plan.levels:
        return None
    off = screen["off"][1]
    if off.tokens == 0:
        return None
    members = [c for c in plan.candidates[1:] if family is None or c.family == family]
    batches = [screen[c.name][1] for c in members]
    longest = max((b.draft_tokens / b.drafts for b in batches if b.drafts), default=0.0)
    if off.decode_seconds > 0 and all(b.decode_seconds > 0 for b in batches):
        # vLLM's decode time: each request's first token comes from its prefill, so its
        # decode steps made tokens - 1 tokens; prefill and HTTP stay out of the curve.
        decoded = off.tokens - off.requests
        points = [
            CostPoint(b.tokens - b.requests, b.decode_seconds, b.drafts, b.draft_tokens, b.accepted)
            for b in batches
        ]
        if decoded > 0:
            return fit_costs(off.decode_seconds / decoded, points, max_k=math.ceil(longest))
    points = [CostPoint(b.tokens, b.seconds, b.drafts, b.draft_tokens, b.accepted) for b in batches]
    return fit_costs(off.seconds / off.tokens, points, max_k=math.ceil(longest))


def tune_vllm(
    plan: TunePlan,
    *,
    on_start: Callable[[str], None] = lambda _: None,
    on_batch: Callable[[], None] = lambda: None,
) -> VllmTuneResult:
    """Screen, pick, confirm and guard (the module's steps)."""
    started = time.perf_counter()
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    screen = _screen(plan, on_start, on_batch)
    member, screen_k = _pick(plan, screen)
    configs: dict[str, Mapping[str, Any] | None] = {"off": None}
    schedule_config: dict[str, Any] | None = None
    if member is not None:
        max_k = max(screen_k.values())
        ranges = one_k_ranges(max_k) if _one_k(member) else schedule_ranges(screen_k)
        schedule_config = member.scheduled(ranges)
        configs[SCHEDULE] = schedule_config
    for c in plan.candidates:
        if c.builtin:
            configs[c.name] = c.config
    confirm = _confirm(plan, configs, on_start, on_batch)
    result = VllmTuneResult(
        plan,
        screen,
        None if member is None else member.family,
        screen_k,
        confirm,
        configs,
        None,
        None,
        _cost_profile(plan, screen, None if member is None else member.family),
    )
    if member is not None:
        confirmed = {level: result.confirm_ratio(SCHEDULE, level) for level in plan.levels}
        result.guarded = guard(screen_k, confirmed, plan.noise_z, one_k=_one_k(member))
        if result.guarded.ranges is not None:
            result.speculative_config = member.scheduled(result.guarded.ranges)
    result.seconds = time.perf_counter() - started
    return result


def check_config(plan: TunePlan, config: Mapping[str, Any]) -> str:
    """Start vLLM with ``config`` and answer a batch one request larger than the largest
    level, one request alone first: proof that vLLM accepts what is written and decodes
    in its first and last ranges (run where the guard changed the confirmed schedule).
    Returns the lone request's answer."""
    prompts = [p for cells in plan.confirm_cells for level in plan.levels for p in cells[level]]
    wide = max(plan.levels) + 1
    with _server(plan, "check", config) as url, _answering(plan, "check"):
        answer = _request(url, str(plan.target), prompts[0], plan)[1]
        run_batch(url, str(plan.target), (prompts * wide)[:wide], wide, plan)
        return answer
