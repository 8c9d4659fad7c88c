"""spectune's controller as a vLLM proposer: per-request K and layered fallback inside the
engine users deploy.

vLLM 0.32 loads a user's proposer class by name::

    --speculative-config '{"method": "custom_class",
                           "model": "spectune.engines.vllm.proposer.SpectuneProposer",
                           "num_speculative_tokens": 4}'

builds it with its ``VllmConfig``, calls ``load_model(model)`` once (nothing to load: the
drafters here run no model) and, after every step, ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu)``: one list of draft tokens per batch row, of any
length up to ``num_speculative_tokens``, empty for "do not speculate on this row".
vLLM's rejection sampler verifies whatever is proposed, so the output stays the target's.
What the class does with each call is ``spectune.engines.vllm.controller``'s; its options
are ``spectune.engines.vllm.options``'.

Which request a row holds: vLLM hands a custom class only the token arrays, not the
input batch's request ids, and rows move between steps. The ids are read from the model
runner that calls ``propose`` (``GPUModelRunner.propose_draft_token_ids``, which the CPU
runner inherits): its ``input_batch`` (checked to be the batch whose ``token_ids_cpu`` was
passed) and its ``requests`` table. A vLLM that calls ``propose`` from elsewhere fails the
check on the first step with one line saying so, rather than drafting for the wrong
requests.

One thing of vLLM's own step changes while the class is loaded (option ``patch_sampler``,
``spectune.engines.vllm.patches``): on a step where no row has a draft token, its
rejection sampler skips the noise it would draw for recovered tokens.

This module runs inside vLLM's own virtualenv (``make vllm``), where spectune is installed
without its dependencies: it imports only what works there (numpy, torch, numba,
prometheus_client and transformers come with vLLM).
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from spectune.control.costs import CostCurve
from spectune.drafters.base import Drafter, describe
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.pairing import suffix_drafter_for
from spectune.drafters.suffix_history import HistoryStore
from spectune.engines.costs import load_costs
from spectune.engines.vllm.controller import RowController
from spectune.engines.vllm.options import ProposerSettings, parse_settings
from spectune.engines.vllm.patches import skip_idle_noise
from spectune.errors import InvalidParameterError
from spectune.models.tokenizer import load_tokenizer
from spectune.monitor.hub import Monitor
from spectune.monitor.trace import TraceWriter

__all__ = ["NoDraftProposer", "SpectuneProposer", "cost_curve_of", "patch_sampler", "vllm_drafter"]

log = logging.getLogger("vllm.spectune")  # under vLLM's logger: its handler prints it


def vllm_drafter(
    settings: ProposerSettings, tokenizer: str, vocab_size: int, target: str
) -> Drafter:
    """The prototype drafter the ``drafter`` option names, for the served model (its
    tokenizer folder and vocabulary size: a corpus index must share its vocabulary)."""
    if settings.drafter == "ngram":
        return NgramDrafter()
    index = settings.drafter.partition(":")[2]
    suffix = suffix_drafter_for(
        index, vocab_size, lambda: load_tokenizer(Path(tokenizer)).token_strings(), target
    )
    return suffix.with_history(HistoryStore()) if settings.history else suffix


def cost_curve_of(path: str) -> CostCurve:
    """A cost profile's v(K) as the curve the ``cost`` policy prices K on (relative units:
    the policy reads ratios)."""
    costs = load_costs(Path(path))
    return CostCurve(tuple(range(1, len(costs.verify) + 1)), costs.verify)


def _calling_runner(frame: FrameType | None, token_ids_cpu: object) -> Any:
    """The model runner whose ``propose_draft_token_ids`` is ``frame`` (module docstring)."""
    runner = None if frame is None else frame.f_locals.get("self")
    batch = getattr(runner, "input_batch", None)
    if getattr(batch, "token_ids_cpu", None) is not token_ids_cpu or not isinstance(
        getattr(runner, "requests", None), dict
    ):
        raise RuntimeError(
            "spectune's proposer reads each row's request id from the vLLM model runner "
            "that calls it (vLLM 0.32's GPUModelRunner.propose_draft_token_ids); this vLLM "
            "calls propose from elsewhere"
        )
    return runner


def patch_sampler() -> str:
    """``skip_idle_noise`` on the vLLM this process runs (``patch_sampler``); one line on
    what was done."""
    try:
        module = importlib.import_module("vllm.v1.sample.rejection_sampler")
    except ImportError:
        return "no vLLM in this process: its rejection sampler is left as it is"
    return skip_idle_noise(module)


class SpectuneProposer:
    """vLLM's ``custom_class`` proposer (module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        extra = vllm_config.additional_config
        table = extra.get("spectune") if isinstance(extra, dict) else None
        self.settings = settings = parse_settings(table, spec.num_speculative_tokens)
        model = vllm_config.model_config
        drafter = vllm_drafter(settings, model.tokenizer, model.get_vocab_size(), model.model)
        curve = cost_curve_of(settings.costs) if settings.costs else None
        # Only what is read costs a step: counters where they are served, and the trace
        # flushed once per engine step (``RowController.step``), not once per row.
        port = settings.metrics_port
        registry = CollectorRegistry() if port is not None else None
        trace = TraceWriter(settings.trace, autoflush=False) if settings.trace else None
        monitor = Monitor(registry=registry, trace=trace, on_warning=log.warning)
        self.trace = trace
        self.controller = RowController(
            settings,
            drafter,
            monitor,
            max_model_len=model.max_model_len,
            cost_curve=curve,
            info={"engine": "vllm", "target": str(model.model)},
        )
        if port is not None and registry is not None:
            try:
                start_http_server(port, addr="127.0.0.1", registry=registry)
            except OSError as exc:
                raise InvalidParameterError(
                    f"cannot serve spectune's metrics on port {port}: {exc.strerror}"
                ) from None
        if settings.patch_sampler:
            log.info("spectune: %s", patch_sampler())
        self._runner: Any = None
        log.info(
            "spectune proposer: %s, policy %s (K <= %d%s), trace %s, metrics %s",
            describe(drafter),
            settings.policy,
            settings.max_k,
            f", costs {settings.costs}" if settings.costs else "",
            settings.trace or "off",
            f"http://127.0.0.1:{settings.metrics_port}/metrics"
            if settings.metrics_port is not None
            else "off",
        )

    def load_model(self, *args: object, **kwargs: object) -> None:
        """Nothing to load: the drafters run no model."""

    def close(self) -> None:
        """End every request's record and close the trace (vLLM itself never calls this:
        its worker exits, and every finished step is on disk already)."""
        self.controller.close()
        if self.trace is not None:
            self.trace.close()

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: object,
        token_ids_cpu: object,
        slot_mappings: object = None,
    ) -> list[list[int]]:
        """[rows] draft tokens per row of vLLM's batch (``RowController.step``)."""
        runner = self._runner
        if runner is None or runner.input_batch.token_ids_cpu is not token_ids_cpu:
            runner = self._runner = _calling_runner(sys._getframe(1), token_ids_cpu)
        return self.controller.step(runner.input_batch, runner.requests, sampled_token_ids)


class NoDraftProposer:
    """A ``custom_class`` proposer that drafts nothing. vLLM started with it runs its
    speculative path on every step (draft metadata, the rejection sampler instead of the
    plain one, the engine's extra call for the drafts) and verifies no draft token: its
    speed against vLLM without speculation is the best a proposer reaches where drafting
    does not pay, on a vLLM left as it is (``scripts/vllm-proposer-bench.py``'s ``empty``
    method; it does not patch the sampler)."""

    def __init__(self, vllm_config: object) -> None:
        """Nothing to configure."""

    def load_model(self, *args: object, **kwargs: object) -> None:
        """Nothing to load."""

    def propose(
        self, sampled_token_ids: list[list[int]], *rest: object, **named: object
    ) -> list[list[int]]:
        """[rows] an empty draft for every row (only the row count is read)."""
        return [[] for _ in sampled_token_ids]
