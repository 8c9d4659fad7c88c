"""Shared fixtures. spectune is imported first so MKL_CBWR is set before torch loads.

Tests run at a fixed thread count (``OMP_NUM_THREADS``, which the CLI subprocesses they
start inherit): the thread governor, which follows the idle cores, would otherwise make a
test's numerics depend on what else the machine runs. Likewise the load check that
withholds advise's verdict on a busy machine stays off (``SPECTUNE_BUSY_CORES``) except
in the tests that set it. tests/test_threads.py tests both on purpose.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("SPECTUNE_BUSY_CORES", "inf")

import spectune  # noqa: F401, E402, I001  (sets MKL_CBWR before torch loads)
import pytest  # noqa: E402
import torch  # noqa: E402
from spectune.models.llama import LlamaLM  # noqa: E402
from spectune.models.toy import perturbed, toy_model  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run only where torch sees a CUDA GPU; elsewhere they skip."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
    from spectune.drafters.pairing import load_target

    return load_target("default")


@pytest.fixture()
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def toy_feature_drafter(toy_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A feature head distilled for a few seconds on the toy target, with a reduced
    vocabulary of 48 tokens: it agrees with the target often, not always."""
    from spectune.distill.data import DistillCorpus, GenerationSettings, corpus_from_token_ids
    from spectune.distill.models import DraftArchitecture
    from spectune.distill.pipeline import distill
    from spectune.distill.train import Budget, TrainSettings
    from spectune.drafters.loading import feature_drafter_from_folder

    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (6,), generator=generator).tolist() for _ in range(72)]
    corpus = corpus_from_token_ids(
        toy_target, prompts, GenerationSettings(max_new_tokens=24, batch_size=24, top_k=16)
    )
    result = distill(
        toy_target,
        (corpus, DistillCorpus([])),
        DraftArchitecture(kind="feature", intermediate_size=64),
        tmp_path_factory.mktemp("toy-feature-draft"),
        vocab_size=48,
        settings=TrainSettings(learning_rate=3e-3, warmup_steps=10, batch_tokens=512),
        budget=Budget(max_steps=180),
        heldout_sequences=8,
        training_record={"command": "tests/conftest.py"},
    )
    return feature_drafter_from_folder(result.folder, toy_target)
