"""Shared fixtures. spectune is imported first so MKL_CBWR is set before torch loads."""

from __future__ import annotations

import pytest
import torch

import spectune  # noqa: F401  (sets MKL_CBWR before torch is imported)
from spectune.models.llama import LlamaLM
from spectune.models.toy import perturbed, toy_model


@pytest.fixture(scope="session")
def toy_target() -> LlamaLM:
    return toy_model(0, scale=3.0)


@pytest.fixture(scope="session")
def toy_draft(toy_target: LlamaLM) -> LlamaLM:
    """A draft that agrees with the toy target often but not always."""
    return perturbed(toy_target, 0.3)


@pytest.fixture(scope="session")
def smollm2():  # type: ignore[no-untyped-def]
    """The real default target (SmolLM2-135M-Instruct, fp32, native runtime) and tokenizer."""
    from spectune.pairing import load_target

    return load_target("default")


@pytest.fixture()
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
