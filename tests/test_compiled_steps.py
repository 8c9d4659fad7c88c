"""Compiled steps (``LlamaLM.compile_steps``): after an eager prompt, every forward of one
sequence runs a compiled graph per chunk size; a position's logits are the same bits in a
one-token step and in any row of a chain (int4), so speculative greedy output equals
compiled plain decoding's; trees and batches are refused with one clear line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from spectune.cli import main
from spectune.control.base import FixedK
from spectune.control.crossover import runtime_of
from spectune.decode.batch import BatchEngine
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import ModelDrafter, NgramDrafter
from spectune.drafters.base import TreeShape
from spectune.drafters.batched import PerRow
from spectune.drafters.pairing import tree_drafter_for
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.quant import quantize_net
from spectune.models.toy import perturbed
from spectune.sampling import SamplingParams


def _int4(model: LlamaLM) -> LlamaLM:
    net = copy.deepcopy(model.net)
    quantize_net(net, "int4")
    return LlamaLM(net, name=model.info.name)


def test_a_compiled_target_refuses_trees_and_batches(toy_target: LlamaLM) -> None:
    """Nothing is compiled here (``torch.compile`` compiles at the first call): the
    refusals come first."""
    target = _int4(toy_target)
    with pytest.raises(InvalidParameterError, match="compile_steps first"):
        target.compile_chunks(2)
    target.compile_steps()
    assert target.compiled_steps and not target.tree_masks
    assert runtime_of(target) == "int4+compile"  # its own verification curve
    with pytest.raises(InvalidParameterError, match="drop --compile"):
        tree_drafter_for(ModelDrafter(toy_target), target, TreeShape())
    with pytest.raises(InvalidParameterError, match="one sequence at a time"):
        BatchEngine(target, PerRow(NgramDrafter), max_batch=2)
    cache = target.new_cache(2)
    target.forward(torch.tensor([[1, 2], [3, 4]]), cache)  # an empty cache: eager prefill
    with pytest.raises(InvalidParameterError, match="no token trees, no batches"):
        target.forward(torch.tensor([[5], [6]]), cache)


@pytest.mark.slow
def test_compiled_speculation_keeps_compiled_plain_greedy_output(toy_target: LlamaLM) -> None:
    """int4 toy target, compiled: every row of a chain scores the same bits as the
    one-token step at that position, speculative greedy output (K = 1, 2; in one pass and
    in groups) equals compiled plain decoding's, which equals eager plain decoding's tokens
    here, and neither a growing cache nor a group's slice of a chain compiles a graph
    beyond one per chunk size."""
    from torch._dynamo.utils import counters

    eager = _int4(toy_target)
    target = _int4(toy_target)
    heard: list[int] = []
    target.compile_steps(on_compile=heard.append)  # the CLI's progress line per size
    torch._dynamo.reset()
    counters.clear()
    target.compile_chunks(3)  # chunks 1, 2 and 3: all that K <= 2 verifies
    assert heard == [1, 2, 3]
    graphs = counters["stats"]["unique_graphs"]
    params = SamplingParams(max_tokens=24)
    draft = ModelDrafter(perturbed(toy_target, 0.3))
    for prompt in ([1, 5, 9], [1, 22, 40, 7, 3]):
        plain = SpeculativeEngine(target).run(prompt, params, policy=FixedK(0)).tokens
        assert plain == SpeculativeEngine(eager).run(prompt, params, policy=FixedK(0)).tokens
        for k in (1, 2):
            run = SpeculativeEngine(target, draft).run(prompt, params, policy=FixedK(k))
            assert run.tokens == plain
        # Chunked verification scores slices of the chain (other strides): no new graphs.
        run = SpeculativeEngine(target, draft, verify_groups=2).run(
            prompt, params, policy=FixedK(2)
        )
        assert run.tokens == plain
    assert graphs <= 3 and counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    cache_one, cache_chain = target.new_cache(), target.new_cache()
    prompt = torch.tensor([[1, 22, 40, 7, 3]])
    target.forward(prompt, cache_one)
    target.forward(prompt, cache_chain)
    chain = [11, 12, 13]
    steps = [target.forward(torch.tensor([[t]]), cache_one).logits[0, 0] for t in chain]
    rows = target.forward(torch.tensor([chain]), cache_chain).logits[0]
    for i, step in enumerate(steps):
        assert torch.equal(rows[i], step), i
    # A feature head's layers, exposed after compiling, come out of the compiled steps.
    target.expose_layers((0, target.net.cfg.num_layers - 1))
    hidden = target.forward(torch.tensor([[14]]), cache_one).hidden
    assert hidden.shape[-1] == 2 * target.net.cfg.hidden_size


@pytest.mark.slow
def test_runtimes_experiment_measures_a_compiled_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--precisions fp32,fp32+compile``: a row for the compiled runtime, its greedy
    generations equal to the eager reference's."""
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "cache"))  # curves land here
    out = tmp_path / "runtimes.json"
    argv = ["experiment", "runtimes", "--toy", "--precisions", "fp32,fp32+compile"]
    assert main([*argv, "--max-tokens", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["precision"]: r for r in report["runtimes"]}
    assert list(rows) == ["fp32", "fp32+compile"]
    assert rows["fp32+compile"]["identical_generations"] == rows["fp32+compile"]["prompts"]


@pytest.mark.slow
def test_compiled_int4_default_target_speculates_greedy_equal() -> None:
    """The default target on int4 with compiled steps: the shipped head (its three layers
    come out of the compiled steps) and the suffix drafter, greedy output equal to the
    compiled target's plain decoding token for token."""
    from spectune.drafters.pairing import load_drafter, load_target_at

    target = load_target_at("default", "int4+compile")
    model = target.model
    assert isinstance(model, LlamaLM) and model.compiled_steps
    model.compile_chunks(4)
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}])
    params = SamplingParams(max_tokens=32)
    plain = SpeculativeEngine(model).run(prompt, params, policy=FixedK(0)).tokens
    for spec, k in (("smollm2-draft", 2), ("suffix", 3)):
        drafter = load_drafter(spec, target)
        run = SpeculativeEngine(model, drafter).run(prompt, params, policy=FixedK(k))
        assert run.tokens == plain, spec
        assert sum(step.accepted for step in run.steps) > 0, spec  # drafts land
