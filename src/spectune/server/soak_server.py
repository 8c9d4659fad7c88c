"""The soak test's server process (``spectune.server.soak``): the service with drafters
that fail on purpose, on a loopback port it prints as ``PORT <n>``, until SIGTERM."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from spectune.drafters.base import Drafter
from spectune.drafters.scripted import FailingDrafter
from spectune.server.soak import SoakConfig

__all__ = ["serve"]


def _fault_factory(
    inner: Callable[[], Drafter], vocab_size: int, config: SoakConfig
) -> Callable[[], Drafter]:
    """Per-request drafters: ``inner``'s, a share of which fail after their first proposal."""
    rng = random.Random(config.seed)
    made = 0
    forced = {2: "raise", 4: "nan", 6: "hang"}  # every kind at least once, early

    def make() -> Drafter:
        nonlocal made
        made += 1
        mode = forced.get(made, "none")
        if mode == "none" and rng.random() < config.fault_rate:
            mode = rng.choice(("raise", "nan", "hang"))
        if mode == "none":
            return inner()
        return FailingDrafter(
            mode, vocab_size=vocab_size, after=1, inner=inner(), hang_seconds=config.hang_seconds
        )

    return make


def serve(config: SoakConfig) -> None:
    """The server process: builds the service, prints ``PORT <n>``, serves until SIGTERM."""
    from spectune.drafters.model import ModelDrafter
    from spectune.models.toy import perturbed, toy_model
    from spectune.server import Limits, create_app
    from spectune.server.engines import DraftSource, EngineSettings
    from spectune.server.run import listen, serve_on
    from spectune.server.testing import toy_service, toy_tokenizer

    torch.set_num_threads(1)
    if config.target == "toy":
        target = toy_model(0, scale=3.0)
        tokenizer = toy_tokenizer(Path(tempfile.mkdtemp(prefix="spectune-soak-")))
    else:
        from spectune.drafters.pairing import fresh_drafter, load_drafter, load_target

        loaded = load_target(config.target)
        target, tokenizer = loaded.model, loaded.tokenizer  # type: ignore[assignment]
    inner: Callable[[], Drafter]
    if config.draft == "toy":
        draft_model = perturbed(target, 0.3)
        inner = lambda: ModelDrafter(draft_model)  # noqa: E731
    else:
        loaded_drafter = load_drafter(config.draft, loaded)
        assert loaded_drafter is not None, "the soak needs a drafter to inject faults into"
        inner = lambda: fresh_drafter(loaded_drafter)  # noqa: E731
    limit = max(config.max_tokens, config.sigterm_max_tokens)
    service = toy_service(
        target,
        tokenizer,
        draft=DraftSource(
            drafters=_fault_factory(inner, target.info.vocab_size, config), label="soak"
        ),
        engine=EngineSettings(
            max_batch=config.max_batch,
            capacity=min(target.info.max_context, 1024),
            draft_deadline=config.draft_deadline,
        ),
        limits=Limits(max_tokens=limit, default_max_tokens=limit, max_requests=config.clients),
    )
    sock = listen("127.0.0.1", 0)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    serve_on(create_app(service), sock, log_level="warning", drain_seconds=config.drain_seconds)
