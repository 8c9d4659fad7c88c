"""What a benchmark run will do: its configuration, its prompts, and fitting it to a budget.

The budget is applied up front, never mid-run: a run that stops half-way would compare
systems over different prompts. Repetitions go first (down to one), then prompts per
category (down to one each); the estimate is printed before anything is timed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.bench.names import SYSTEM_KEYS
from spectune.control.config import POLICIES
from spectune.errors import InvalidParameterError, PromptError
from spectune.models.tokenizer import Tokenizer
from spectune.prompts import load_prompts
from spectune.sampling import MAX_SEED

__all__ = [
    "SYSTEM_KEYS",
    "BenchConfig",
    "BenchPrompt",
    "Budgeted",
    "fit_budget",
    "load_bench_prompts",
    "parse_tree_shape",
    "select_prompts",
]


@dataclass(frozen=True)
class BenchConfig:
    target: str = "default"
    drafters: tuple[str, ...] = ("ngram",)  # draft paths/names, "ngram", "random"
    temperatures: tuple[float, ...] = (0.0,)
    max_tokens: int = 64
    repeats: int = 3
    dtypes: tuple[str, ...] = ("fp32",)  # precisions fp32, bf16, int8, int4; or llamacpp
    device: str = "cpu"  # resolved (cpu or cuda); int8 / int4 always run on the CPU
    ks: tuple[int, ...] = (1, 2, 4, 6, 8)
    policies: tuple[str, ...] = ("threshold", "cost")
    policy_files: tuple[str, ...] = ()  # TOML policy files (``spectune tune``'s output)
    trees: tuple[str, ...] = ()  # token-tree shapes "WIDTHxNODES" for each draft model
    tree_ks: tuple[int, ...] = (4,)  # tree depths (K) run for each shape
    systems: tuple[str, ...] = tuple(SYSTEM_KEYS)
    seed: int = 0
    prompt_lookup_tokens: int = 10
    budget_minutes: float | None = None
    prompt_format: str = "chat:model"  # how the prompts were encoded (PromptEncoding.format)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.systems) - set(SYSTEM_KEYS))
        if unknown:
            raise InvalidParameterError(
                f"unknown systems {unknown}; choose from {', '.join(SYSTEM_KEYS)}"
            )
        if self.max_tokens < 1 or self.repeats < 1:
            raise InvalidParameterError("--max-tokens and --repeats must be at least 1")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise InvalidParameterError("temperatures must be >= 0")
        for shape in self.trees:
            parse_tree_shape(shape)
        if self.budget_minutes is not None and not 0 < self.budget_minutes < math.inf:
            raise InvalidParameterError("--budget-minutes must be a positive number")
        unknown = sorted(set(self.policies) - set(POLICIES))
        if unknown:
            raise InvalidParameterError(
                f"unknown policies {unknown}; choose from {', '.join(POLICIES)}"
            )
        if self.prompt_lookup_tokens < 1:
            raise InvalidParameterError("--prompt-lookup-tokens must be at least 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise InvalidParameterError(f"--seed must be in [0, 2**63 - 1], got {self.seed}")

    def runs(self, key: str) -> bool:
        return key in self.systems

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def parse_tree_shape(text: str) -> tuple[int, int]:
    """``"2x16"`` -> (width 2, node budget 16)."""
    try:
        width, nodes = (int(part) for part in text.lower().split("x"))
    except ValueError as exc:
        raise InvalidParameterError(
            f"tree shape must be WIDTHxNODES (e.g. 2x16), got {text!r}"
        ) from exc
    return width, nodes


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    tokens: tuple[int, ...]  # chat template applied (a plain prompt: none)


def load_bench_prompts(
    tokenizer: Tokenizer,
    path: Path | None = None,
    *,
    categories: Sequence[str] | None = None,
    split: str | None = "test",
    limit_per_category: int | None = None,
) -> list[BenchPrompt]:
    """Prompts as token ids (``EvalPrompt.tokens`` with ``tokenizer``), in file order, through
    ``spectune.prompts`` (the shipped set when ``path`` is None). The shipped set's ``test``
    split is held out from tuning, so reported numbers use it by default."""
    if limit_per_category is not None and limit_per_category < 1:
        raise InvalidParameterError("--limit-per-category must be at least 1")
    records = load_prompts(
        path, categories=categories, split=split, limit_per_category=limit_per_category
    )
    prompts = [BenchPrompt(p.id, p.category, tuple(p.tokens(tokenizer))) for p in records]
    if not prompts:
        raise PromptError("the benchmark has no prompts (check --categories and --split)")
    return prompts


def select_prompts(
    prompts: Sequence[BenchPrompt],
    *,
    categories: Sequence[str] | None = None,
    limit_per_category: int | None = None,
) -> list[BenchPrompt]:
    if categories:
        missing = sorted(set(categories) - {p.category for p in prompts})
        if missing:
            raise PromptError(f"no prompts in categories {missing}")
        prompts = [p for p in prompts if p.category in categories]
    if limit_per_category is not None:
        if limit_per_category < 1:
            raise InvalidParameterError("--limit-per-category must be at least 1")
        seen: dict[str, int] = {}
        kept = []
        for prompt in prompts:
            seen[prompt.category] = seen.get(prompt.category, 0) + 1
            if seen[prompt.category] <= limit_per_category:
                kept.append(prompt)
        prompts = kept
    if not prompts:
        raise PromptError("the benchmark has no prompts")
    return list(prompts)


@dataclass(frozen=True)
class Budgeted:
    prompts: list[BenchPrompt]
    repeats: int
    estimate_seconds: float  # after trimming
    notes: tuple[str, ...]  # what was trimmed, and any remaining overrun


def fit_budget(
    prompts: Sequence[BenchPrompt],
    repeats: int,
    estimate: Callable[[Sequence[BenchPrompt], int], float],
    budget_seconds: float | None,
) -> Budgeted:
    """Trim repetitions, then prompts per category, until ``estimate(prompts, repeats)`` fits."""
    prompts = list(prompts)
    notes: list[str] = []
    seconds = estimate(prompts, repeats)
    if budget_seconds is None or seconds <= budget_seconds:
        return Budgeted(prompts, repeats, seconds, ())
    original = (len(prompts), repeats)
    while repeats > 1 and seconds > budget_seconds:
        repeats -= 1
        seconds = estimate(prompts, repeats)
    by_category: dict[str, int] = {}
    for prompt in prompts:
        by_category[prompt.category] = by_category.get(prompt.category, 0) + 1
    limit = max(by_category.values())
    while limit > 1 and seconds > budget_seconds:
        limit -= 1
        prompts = select_prompts(prompts, limit_per_category=limit)
        seconds = estimate(prompts, repeats)
    notes.append(
        f"budget: trimmed from {original[0]} prompts x {original[1]} repeats to "
        f"{len(prompts)} x {repeats}"
    )
    if seconds > budget_seconds:
        notes.append(
            f"budget: still estimated at {seconds / 60:.1f} min with one prompt per category "
            "and one repetition; lower --max-tokens or select fewer systems"
        )
    return Budgeted(prompts, repeats, seconds, tuple(notes))
