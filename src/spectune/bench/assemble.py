"""Loading what a benchmark compares, per dtype: the target twice (spectune's runtime and
transformers), the drafts, and the systems built from them.

The ``llamacpp`` "dtype" is a runtime: the target GGUF on llama.cpp's kernels in its own
tensor types (``spectune.models.llamacpp``), with spectune's plain and speculative systems
running through the same engine, draft models on llama.cpp too, no transformers systems,
and llama.cpp's own plain and prompt-lookup decoding as anchors (``spectune.bench.anchors``,
system key ``llamacpp``). Feature-head drafts cannot run on it and are skipped with a note.

The ``random`` draft is deliberately useless: a Llama-family model with random weights,
sized like a small draft and sharing the target's vocabulary and special tokens, so it is
compatible but never right. Its output layer is scaled so it is also *confident* (top
probability well above transformers' assistant confidence threshold of 0.4): a hesitant
random draft would be screened out by that threshold and would not test anything.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spectune.bench.anchors import llama_cpp_python_systems
from spectune.bench.plan import BenchConfig, parse_tree_shape
from spectune.bench.systems import HFSystem, SpectuneSystem, System, SystemInfo
from spectune.control.base import FixedK, KPolicy
from spectune.control.config import PolicySpec, load_policy_file
from spectune.control.costs import CostCurve, measure_forward_curve
from spectune.control.crossover import curve_for_this_machine
from spectune.control.registry import build_policy, shared_calibration
from spectune.drafters.base import Drafter
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.pairing import (
    Loaded,
    compile_target,
    is_suffix_spec,
    load_drafter,
    load_target,
    native_precision,
    tree_drafter_for,
)
from spectune.drafters.tree import TreeShape
from spectune.errors import IncompatibleModelsError, InvalidParameterError
from spectune.models.base import LanguageModel, ModelInfo
from spectune.models.llama import COMPILED, LlamaConfig, LlamaLM
from spectune.models.llamacpp import LLAMACPP
from spectune.models.loading import resolve_model_path, save_native
from spectune.models.quant import PRECISIONS, quantize_net
from spectune.models.toy import toy_model
from spectune.sampling import SamplingParams

__all__ = [
    "DraftSource",
    "PolicyChoice",
    "Workbench",
    "adaptive_policy",
    "build_systems",
    "load_workbench",
    "measure_curves",
    "random_draft",
]

CURVE_SIZES = (1, 2, 4, 8, 16)  # tokens per forward in the reported verification-cost curve
ANCHOR_CONTEXT = 2048  # tokens an anchor's llama.cpp context holds (prompt + new tokens)
RANDOM_DRAFT_SCALE = 8.0  # logit spread of the random draft: confident and wrong


@dataclass
class DraftSource:
    """One drafter as spectune uses it, and as transformers' assistant (model drafts only)."""

    label: str  # "ngram", "random", or the draft's name
    drafter: Drafter
    hf_assistant: Any | None = None  # a transformers model, or None (n-gram; HF not loaded)


@dataclass
class Workbench:
    """Everything one dtype's run needs."""

    dtype: str
    target: LanguageModel
    hf_target: Any | None  # transformers model of the same checkpoint, when HF systems run
    systems: list[System]
    curves: dict[str, CostCurve]  # verification-cost curve per runtime ("spectune", "hf")
    notes: list[str] = field(default_factory=list)


def random_draft(target: ModelInfo, *, seed: int = 0) -> LlamaLM:
    """A useless but compatible draft: random weights, the target's vocabulary and ids."""
    hidden = max(32, min(256, (target.hidden_size // 2) // 32 * 32))
    config = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=hidden // 4,
        max_context=target.max_context,
        tie_word_embeddings=True,
        bos_token_id=target.bos_token_id,
        eos_token_ids=target.eos_token_ids,
        pad_token_id=target.pad_token_id,
        name="random",
    )
    model = toy_model(seed, config=config, scale=RANDOM_DRAFT_SCALE)
    return LlamaLM(model.net, name="random")


@dataclass(frozen=True)
class PolicyChoice:
    """A policy the bench runs with every draft: its label in the tables and its registry
    spec, given the target's verification curve. Each system takes its own ``factory()``:
    the ``cost`` policies of that system's requests share one calibration of the curve (as
    one server's would), and no two systems share one, so no system's figures depend on
    which ran before it."""

    label: str
    spec: PolicySpec
    cost_curve: CostCurve | None

    def factory(self) -> Callable[[SamplingParams], KPolicy]:
        spec, curve = self.spec, self.cost_curve
        calibration = shared_calibration(spec.name, spec.options, curve)

        def make(params: SamplingParams) -> KPolicy:
            return build_policy(spec, params=params, cost_curve=curve, calibration=calibration)

        return make


def adaptive_policy(name: str, cost_curve: CostCurve | None) -> PolicyChoice:
    """The named policy of ``spectune.control``'s registry (default options). Raises the
    registry's error for a bad name now, at set-up, rather than in the middle of the run;
    the caller turns it into a note and skips the policy."""
    choice = PolicyChoice(name, PolicySpec(name), cost_curve)
    choice.factory()(SamplingParams())
    return choice


def file_policy(path: str, cost_curve: CostCurve | None) -> PolicyChoice:
    """A policy file, labelled by its file name without ``.toml``; a bad file fails now, at
    set-up, with the registry's one-line error."""
    choice = PolicyChoice(Path(path).stem, load_policy_file(path), cost_curve)
    choice.factory()(SamplingParams())
    return choice


# The largest K the adaptive policies ask for by default (``threshold`` and ``cost``: 8) and
# the one more that ``cost`` probes with: the chunks a compiled target compiles up front.
COMPILED_POLICY_K = 9


def _fixed(k: int) -> Callable[[SamplingParams], KPolicy]:
    return lambda params: FixedK(k)


def build_systems(
    config: BenchConfig,
    target: LanguageModel,
    hf_target: Any | None,
    drafts: list[DraftSource],
    notes: list[str],
    cost_curve: CostCurve | None = None,
) -> list[System]:
    """Systems in table order: baselines first, then spectune, then transformers' drafting."""
    info = target.info
    systems: list[System] = []
    plain = SystemInfo("spectune plain", "spectune-plain", policy="fixed", k=0)
    systems.append(SpectuneSystem.build(plain, target, None, _fixed(0)))
    eos = list(info.eos_token_ids)
    pad = info.pad_token_id if info.pad_token_id is not None else (eos[0] if eos else 0)

    def hf(info_: SystemInfo, **kwargs: Any) -> HFSystem:
        return HFSystem(info_, hf_target, eos_token_ids=eos, pad_token_id=pad, **kwargs)

    if hf_target is not None and config.runs("hf"):
        systems.append(hf(SystemInfo("HF generate", "hf-generate")))
    if config.runs("spectune"):
        policies: list[PolicyChoice] = []
        for name in config.policies:
            try:
                policies.append(adaptive_policy(name, cost_curve))
            except Exception as exc:  # a missing registry or a bad name: skip, say why
                notes.append(f"policy '{name}' skipped: {type(exc).__name__}: {exc}")
        policies += [file_policy(path, cost_curve) for path in config.policy_files]
        for draft in drafts:
            for k in config.ks:
                label = SystemInfo(
                    f"spectune {draft.label} K={k}", "spectune", draft.label, k, "fixed"
                )
                systems.append(SpectuneSystem.build(label, target, draft.drafter, _fixed(k)))
            systems += _tree_systems(config, target, draft)
            for choice in policies:
                name = choice.label
                label = SystemInfo(
                    f"spectune {draft.label} {name}", "spectune", draft.label, None, name
                )
                systems.append(SpectuneSystem.build(label, target, draft.drafter, choice.factory()))
    if hf_target is not None:
        for draft in drafts:
            if draft.hf_assistant is None:
                continue
            if config.runs("hf-assisted"):
                label = SystemInfo(
                    f"HF assisted {draft.label}", "hf-assisted", draft.label, None, "hf-default"
                )
                systems.append(hf(label, assistant=draft.hf_assistant))
            if config.runs("hf-heuristic"):
                label = SystemInfo(
                    f"HF assisted {draft.label} heuristic",
                    "hf-assisted",
                    draft.label,
                    None,
                    "hf-heuristic",
                )
                systems.append(hf(label, assistant=draft.hf_assistant, schedule="heuristic"))
        if config.runs("hf-lookup"):
            label = SystemInfo(
                f"HF prompt lookup {config.prompt_lookup_tokens}",
                "hf-lookup",
                "prompt-lookup",
                config.prompt_lookup_tokens,
                "hf-lookup",
            )
            systems.append(hf(label, prompt_lookup_tokens=config.prompt_lookup_tokens))
    return systems


def _tree_systems(config: BenchConfig, target: LanguageModel, draft: DraftSource) -> list[System]:
    """Token-tree variants of a draft model or feature head (``--trees``); trees need the
    native runtime, so other pairings get no tree systems."""
    if not config.trees:
        return []
    systems: list[System] = []
    for text in config.trees:
        width, nodes = parse_tree_shape(text)
        try:
            drafter = tree_drafter_for(draft.drafter, target, TreeShape(width=width, nodes=nodes))
        except InvalidParameterError:
            return []
        label = f"{draft.label} tree{width}x{nodes}"
        for k in config.tree_ks:
            info = SystemInfo(
                f"spectune {label} K={k}", "spectune", label, k, "fixed", f"{width}x{nodes}"
            )
            systems.append(SpectuneSystem.build(info, target, drafter, _fixed(k)))
    return systems


def _hf_model(path: Path, dtype: torch.dtype, device: torch.device) -> Any:
    from spectune.models.hf import load_hf_model

    return load_hf_model(path, dtype=dtype).model.to(device)


def load_workbench(
    config: BenchConfig, dtype_name: str, scratch: Path | None = None, *, curve_repeats: int = 5
) -> tuple[Workbench, Loaded]:
    """Load the target (and drafts) in one dtype, measure its verification-cost curve (the
    ``cost`` policy and the analytic bound need it) and build the systems.

    ``scratch`` holds the random draft's HF folder for transformers (a temporary folder
    when None).
    """
    on_llamacpp = dtype_name == LLAMACPP
    precision = PRECISIONS["fp32"] if on_llamacpp else native_precision(dtype_name)
    compiled = dtype_name.endswith(COMPILED)
    dtype, quantize = precision.dtype, precision.quantize
    runtime = LLAMACPP if on_llamacpp else "native"
    # The weight-only kernels are CPU kernels: int8 / int4 run there whatever the device.
    device = torch.device("cpu" if quantize != "none" or on_llamacpp else config.device)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    loaded = load_target(
        config.target, dtype=dtype, runtime=runtime, quantize=quantize, device=device
    )
    notes: list[str] = []
    if compiled:  # before the drafters: pairing reads tree_masks
        compile_target(loaded.model)
    needs_hf = any(config.runs(key) for key in ("hf", "hf-assisted", "hf-heuristic", "hf-lookup"))
    if needs_hf and compiled:
        needs_hf = False
        notes.append(f"{dtype_name}: no transformers systems (they run the {precision.name} one)")
    elif needs_hf and on_llamacpp:
        needs_hf = False
        notes.append(f"{dtype_name}: no transformers systems (it runs no llama.cpp kernels)")
    elif needs_hf and quantize != "none":
        needs_hf = False
        notes.append(
            f"{dtype_name}: no transformers systems (transformers runs no weight-only "
            "int8/int4 CPU kernels to compare with)"
        )
    hf_target = _hf_model(loaded.path, dtype, device) if needs_hf else None
    wants_assistant = hf_target is not None and (
        config.runs("hf-assisted") or config.runs("hf-heuristic")
    )
    # Before the drafters: a hybrid prices its merged trees with this machine's curve.
    prior = curve_for_this_machine(loaded.model, report=notes.append) if config.drafters else None
    drafts: list[DraftSource] = []
    for spec in config.drafters:
        if spec == "ngram":
            drafts.append(DraftSource("ngram", NgramDrafter()))
        elif spec == "random":
            model = random_draft(loaded.model.info, seed=config.seed)
            assistant = None
            if wants_assistant:
                folder = Path(scratch or tempfile.mkdtemp(prefix="spectune-bench-")) / "random"
                save_native(model, folder)
                assistant = _hf_model(folder, dtype, device)
            # After saving: ``to`` converts the module in place.
            drafter_model = LlamaLM(model.net.to(dtype=dtype, device=device), name="random")
            quantize_net(drafter_model.net, quantize)
            drafts.append(DraftSource("random", ModelDrafter(drafter_model), assistant))
        elif is_suffix_spec(spec):
            try:
                suffix = load_drafter(
                    spec, loaded, dtype=dtype, runtime=runtime, quantize=quantize, device=device
                )
            except IncompatibleModelsError as exc:  # a hybrid's feature head on llama.cpp
                if not on_llamacpp:
                    raise
                notes.append(f"{dtype_name}: draft '{spec}' skipped: {exc}")
                continue
            if suffix is not None:  # no transformers counterpart: no HF systems for it
                drafts.append(DraftSource(spec, suffix))
        else:
            try:
                drafter = load_drafter(
                    spec, loaded, dtype=dtype, runtime=runtime, quantize=quantize, device=device
                )
            except IncompatibleModelsError as exc:
                if not on_llamacpp:
                    raise
                notes.append(f"{dtype_name}: draft '{spec}' skipped: {exc}")
                continue
            if drafter is None:
                continue
            path = resolve_model_path(spec)
            label = path.stem if path.is_file() else path.name
            # Only a plain LM draft is something transformers can run as an assistant; a
            # feature head reads spectune's target states.
            hf_loadable = isinstance(drafter, ModelDrafter)
            wanted = wants_assistant and hf_loadable
            assistant = _hf_model(path, dtype, device) if wanted else None
            if wants_assistant and not hf_loadable:
                notes.append(
                    f"{label}: transformers cannot run a '{drafter.name}' draft as an "
                    "assistant model; no HF assisted systems for it"
                )
            drafts.append(DraftSource(label, drafter, assistant))
    if isinstance(loaded.model, LlamaLM) and loaded.model.compiled_steps:
        # After the drafters (a feature head exposes target layers: other graphs): every
        # chunk a fixed K or an adaptive policy (K <= 8, plus its probe) verifies.
        loaded.model.compile_chunks(max(*config.ks, COMPILED_POLICY_K) + 1)
    curves = measure_curves(loaded.model, hf_target, repeats=curve_repeats)
    # The adaptive policies start from the curve generate and serve use (this machine's,
    # recorded once), as a user's would, not from the bench's own measurement (it moves
    # between runs: int4 two tokens at 1.10x-1.37x one). The cost policy corrects it from
    # its own steps either way.
    systems = build_systems(config, loaded.model, hf_target, drafts, notes, prior)
    if on_llamacpp and config.runs(LLAMACPP):
        systems += _anchors(config, loaded, notes)
    return Workbench(dtype_name, loaded.model, hf_target, systems, curves, notes), loaded


def _anchors(config: BenchConfig, loaded: Loaded, notes: list[str]) -> list[System]:
    """llama.cpp's own plain and prompt-lookup decoding at each fixed K, when the high-level
    ``llama_cpp`` package imports (the backend itself needs only its low-level module)."""
    try:
        return llama_cpp_python_systems(
            loaded.path, loaded.model.info.eos_token_ids, ANCHOR_CONTEXT, config.ks
        )
    except ImportError as exc:
        notes.append(f"{LLAMACPP}: no llama.cpp anchor systems ({exc})")
        return []


def measure_curves(
    target: LanguageModel, hf_target: Any | None, *, repeats: int = 5
) -> dict[str, CostCurve]:
    """Verification-cost curves of the target in spectune's runtime and, if loaded, through
    transformers (``spectune.models.hf`` wraps the same transformers model)."""
    curves = {"spectune": measure_forward_curve(target, CURVE_SIZES, repeats=repeats)}
    if hf_target is not None:
        from spectune.models.hf import HFModel

        hf = HFModel(hf_target, name="hf")
        curves["hf"] = measure_forward_curve(hf, CURVE_SIZES, repeats=repeats)
    return curves
