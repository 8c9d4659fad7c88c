"""The proposer's one change to vLLM's step (``spectune.engines.vllm.patches``): the
rejection sampler skips its recovered-token noise on steps without draft tokens, and does
everything else as before. Against a stand-in module (fast) and vLLM's own (slow)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

import torch

from _vllm import live
from spectune.engines.vllm.patches import skip_idle_noise
from spectune.engines.vllm.proposer import patch_sampler


def stand_in() -> tuple[SimpleNamespace, list[tuple[Any, ...]]]:
    """A module whose sample_recovered_tokens has vLLM 0.32's parameters and draws noise
    as vLLM's does; the calls it got."""
    calls: list[tuple[Any, ...]] = []

    def sample_recovered_tokens(
        max_spec_len: int,
        num_draft_tokens: list[int],
        cu_num_draft_tokens: torch.Tensor,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        sampling_metadata: object,
        device: torch.device,
        use_fp64_gumbel: bool = False,
    ) -> torch.Tensor:
        calls.append((max_spec_len, list(num_draft_tokens)))
        torch.empty(len(num_draft_tokens), target_probs.shape[-1]).exponential_()
        return torch.zeros_like(draft_token_ids)

    return SimpleNamespace(sample_recovered_tokens=sample_recovered_tokens), calls


def call(module: SimpleNamespace, num_draft_tokens: list[int], vocab: int = 50) -> torch.Tensor:
    num_tokens = sum(num_draft_tokens)
    result: torch.Tensor = module.sample_recovered_tokens(
        max(num_draft_tokens),
        num_draft_tokens,
        torch.tensor(num_draft_tokens, dtype=torch.int32).cumsum(0),
        torch.ones(num_tokens, dtype=torch.int32),  # draft_token_ids
        None,
        torch.full((num_tokens, vocab), 1.0 / vocab),
        SimpleNamespace(generators={}),
        torch.device("cpu"),
        use_fp64_gumbel=False,
    )
    return result


def test_a_step_without_drafts_returns_the_empty_result_without_drawing() -> None:
    module, calls = stand_in()
    assert "skips" in skip_idle_noise(module)
    state = torch.get_rng_state()
    result = call(module, [0, 0, 0])
    assert torch.equal(torch.get_rng_state(), state)  # no noise drawn
    assert calls == [] and result.shape == (0,) and result.dtype == torch.int32
    assert torch.equal(call(module, [2, 0, 1]), torch.zeros(3, dtype=torch.int32))
    assert calls == [(2, [2, 0, 1])]  # a step with drafts: vLLM's own function, as called


def test_the_patch_is_applied_once_and_only_to_the_function_it_knows() -> None:
    module, _ = stand_in()
    skip_idle_noise(module)
    wrapped = module.sample_recovered_tokens
    assert "already" in skip_idle_noise(module) and module.sample_recovered_tokens is wrapped

    def other(num_draft_tokens: list[int], max_spec_len: int) -> None: ...

    changed = SimpleNamespace(sample_recovered_tokens=other)
    assert "is not vLLM 0.32's" in skip_idle_noise(changed)
    assert changed.sample_recovered_tokens is other
    assert "is not vLLM 0.32's" in skip_idle_noise(SimpleNamespace())


def test_outside_vllm_there_is_nothing_to_patch() -> None:
    assert "no vLLM" in patch_sampler()


LIVE_CHECK = """
import torch
from vllm.v1.sample import rejection_sampler as rs
from spectune.engines.vllm.patches import skip_idle_noise

original = rs.sample_recovered_tokens
draft = torch.empty(0, dtype=torch.int32)
args = (0, [0, 0, 0], torch.zeros(3, dtype=torch.int32), draft, None,
        torch.empty(0, 64), None, torch.device("cpu"))
print(skip_idle_noise(rs))
assert rs.sample_recovered_tokens is not original
# rejection_sample finds it among the module's globals at call time: it calls the patch.
assert rs.rejection_sample.__globals__["sample_recovered_tokens"] is rs.sample_recovered_tokens
state = torch.get_rng_state()
patched = rs.sample_recovered_tokens(*args)
assert torch.equal(torch.get_rng_state(), state), "the patched call drew noise"
assert patched.shape == (0,) and patched.dtype == draft.dtype
print("ok")
"""


@live
def test_vllms_own_rejection_sampler_takes_the_patch() -> None:
    """vLLM 0.32's sample_recovered_tokens has the parameters the patch reads, and
    ``rejection_sample`` calls it through the module, where the patch puts it."""
    from spectune.engines.vllm.setup import find_vllm_python

    done = subprocess.run(
        [str(find_vllm_python()), "-c", LIVE_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "skips its recovered-token noise" in done.stdout and "ok" in done.stdout
