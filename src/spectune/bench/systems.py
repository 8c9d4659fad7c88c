"""The systems a benchmark compares: one verb, ``run(prompt, params, seed) -> CallResult``.

Two kinds:
- ``SpectuneSystem``: spectune's engine (plain, or a drafter with a K policy). Its counts
  come from the engine's own ``StepRecord``s.
- ``HFSystem``: ``transformers`` ``generate()`` (plain, assisted with a draft model, or
  prompt lookup). transformers does not report what it accepted, so its counts come from
  forward hooks: every target forward emits its accepted tokens plus one, so tokens per
  target call is the mean accepted length; each assistant forward drafts one token.

Every system is timed end to end (prefill included), the same way for both kinds.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from spectune.control.base import KPolicy
from spectune.decode.engine import Generation, SpeculativeEngine
from spectune.drafters.base import Drafter
from spectune.models.base import LanguageModel
from spectune.sampling import SamplingParams

__all__ = [
    "CallResult",
    "Decoder",
    "ForwardMeter",
    "HFSystem",
    "SpectuneSystem",
    "System",
    "SystemInfo",
]

# Families, in the order tables list them.
FAMILIES = (
    "spectune-plain",
    "spectune",
    "hf-generate",
    "hf-assisted",
    "hf-lookup",
    "llamacpp-plain",  # llama.cpp's own decoding (spectune.bench.anchors)
    "llamacpp-lookup",
)


@dataclass(frozen=True)
class SystemInfo:
    """What a system is, for tables and for pairing it with its baselines."""

    name: str  # unique label, e.g. "spectune ngram K=4"
    family: str  # one of FAMILIES
    drafter: str | None = None  # "ngram", "random", a draft's name; None without a draft
    k: int | None = None  # fixed K, when the system has one
    policy: str | None = None  # "fixed", "threshold", "cost", "hf-default", "hf-heuristic"
    tree: str | None = None  # token-tree shape "WIDTHxNODES"; None for a chain


@dataclass(frozen=True)
class CallResult:
    """One generation by one system. Counts that a system cannot observe are None."""

    tokens: tuple[int, ...]  # new tokens, EOS included when generated
    seconds: float  # wall time of the whole call, prefill included
    target_calls: int  # target forwards that emitted tokens (engine steps; HF: all calls)
    drafted: int | None  # draft positions tested (a chain: tokens drafted; a tree: its depth)
    accepted: int | None  # draft tokens the target kept
    draft_seconds: float | None  # time spent drafting
    decode_seconds: float | None = None  # time in decode steps (spectune only)
    ks: tuple[int, ...] = ()  # K asked for at every step (spectune only; 0 = a plain step)
    step_drafted: tuple[int, ...] = ()  # tokens actually drafted at every step (<= K)
    step_positions: tuple[int, ...] = ()  # draft positions tested at every step (tree: depth)
    step_accepted: tuple[int, ...] = ()  # draft tokens the target kept at every step
    fallback_steps: int = 0  # steps where speculation was off or cut short for a reason


class System(Protocol):
    info: SystemInfo

    def run(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> CallResult:
        """Generate from ``prompt``; at temperature > 0 every random number follows ``seed``."""
        ...


class Decoder(Protocol):
    """What a spectune system decodes with: ``SpeculativeEngine`` today; a tree engine with
    the same ``run`` slots in here without touching the benchmark."""

    def run(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        policy: KPolicy | None = None,
        generator: torch.Generator | None = None,
    ) -> Generation: ...


class SpectuneSystem:
    """spectune's engine with a fresh K policy per request (policies own per-request state)."""

    def __init__(
        self,
        info: SystemInfo,
        decoder: Decoder,
        policy_factory: Callable[[SamplingParams], KPolicy],
    ) -> None:
        self.info = info
        self.decoder = decoder
        self.policy_factory = policy_factory

    @classmethod
    def build(
        cls,
        info: SystemInfo,
        target: LanguageModel,
        drafter: Drafter | None,
        policy_factory: Callable[[SamplingParams], KPolicy],
    ) -> SpectuneSystem:
        return cls(info, SpeculativeEngine(target, drafter), policy_factory)

    def run(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> CallResult:
        generator = torch.Generator().manual_seed(seed)
        policy = self.policy_factory(params)
        start = time.perf_counter()
        gen = self.decoder.run(prompt, params, policy=policy, generator=generator)
        seconds = time.perf_counter() - start
        speculative = self.info.family != "spectune-plain"
        counts = gen.counts
        return CallResult(
            tokens=tuple(gen.tokens),
            seconds=seconds,
            target_calls=counts.steps,
            # Positions tested (a tree counts its depth), the acceptance denominator.
            drafted=counts.positions if speculative else None,
            accepted=counts.accepted if speculative else None,
            draft_seconds=counts.draft_time if speculative else None,
            decode_seconds=counts.step_time,
            ks=tuple(s.k for s in gen.steps),
            step_drafted=tuple(s.num_draft_tokens for s in gen.steps),
            step_positions=tuple(s.positions for s in gen.steps),
            step_accepted=tuple(s.accepted for s in gen.steps),
            fallback_steps=counts.fallback_steps,
        )


class ForwardMeter:
    """Counts a torch module's top-level forward calls and the time spent in them."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._started: list[float] = []

    @contextlib.contextmanager
    def attach(self, module: torch.nn.Module) -> Iterator[ForwardMeter]:
        def before(*_: object) -> None:
            self._started.append(time.perf_counter())

        def after(*_: object) -> None:
            self.seconds += time.perf_counter() - self._started.pop()
            self.calls += 1

        handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


@contextlib.contextmanager
def _assistant_schedule(assistant: Any, schedule: str | None) -> Iterator[None]:
    """Give the assistant a private copy of its generation config with ``schedule`` set.

    transformers writes the heuristic schedule's K back into the assistant's config after
    each call; swapping in a copy per call keeps the user's config untouched and makes
    every request start from the same K, whatever order the benchmark runs them in.
    """
    if assistant is None or schedule is None:
        yield
        return
    original = assistant.generation_config
    private = copy.deepcopy(original)
    private.num_assistant_tokens_schedule = schedule
    assistant.generation_config = private
    try:
        yield
    finally:
        assistant.generation_config = original


class HFSystem:
    """transformers ``generate()``: plain, assisted (``assistant``) or prompt lookup."""

    def __init__(
        self,
        info: SystemInfo,
        model: Any,  # a transformers PreTrainedModel
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        assistant: Any | None = None,
        schedule: str | None = None,  # assistant schedule, e.g. "heuristic"; None: its own
        prompt_lookup_tokens: int | None = None,
    ) -> None:
        self.info = info
        self.model = model
        self.assistant = assistant
        self.schedule = schedule
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id

    def _kwargs(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
            "do_sample": not params.greedy,
        }
        if not params.greedy:
            # Same distribution as spectune: transformers' default top-k of 50 is switched
            # off unless asked for.
            kwargs.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        if self.prompt_lookup_tokens is not None:
            kwargs["prompt_lookup_num_tokens"] = self.prompt_lookup_tokens
        return kwargs

    @torch.inference_mode()
    def run(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> CallResult:
        input_ids = torch.tensor([list(prompt)], device=self.model.device)  # [1, prompt]
        target_meter, draft_meter = ForwardMeter(), ForwardMeter()
        with contextlib.ExitStack() as stack:
            # transformers samples from the global generator: fork it so the seed stays local.
            stack.enter_context(torch.random.fork_rng(devices=[]))
            torch.manual_seed(seed)
            stack.enter_context(_assistant_schedule(self.assistant, self.schedule))
            stack.enter_context(target_meter.attach(self.model))
            if self.assistant is not None:
                stack.enter_context(draft_meter.attach(self.assistant))
            start = time.perf_counter()
            out = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), **self._kwargs(params)
            )
            seconds = time.perf_counter() - start
        tokens = tuple(int(t) for t in out[0, input_ids.shape[1] :])
        target_calls = max(1, target_meter.calls)
        speculative = self.assistant is not None or self.prompt_lookup_tokens is not None
        # Each target forward emits its accepted draft tokens plus one of its own.
        accepted = max(0, len(tokens) - target_calls) if speculative else None
        # Prompt lookup's drafts are invisible from outside; an assistant drafts one token
        # per forward.
        drafted = draft_meter.calls if self.assistant is not None else None
        draft_seconds = draft_meter.seconds if self.assistant is not None else None
        return CallResult(
            tokens=tokens,
            seconds=seconds,
            target_calls=target_calls,
            drafted=drafted,
            accepted=accepted,
            draft_seconds=draft_seconds,
        )
