"""A tuned setup as vLLM's, SGLang's and llama.cpp's own flags, or a refusal.

``to_vllm``, ``to_sglang`` and ``to_llamacpp`` write those engines' flags (names as of
vLLM's ``SpeculativeConfig``, SGLang's server arguments, and ``llama-server``'s
``common/arg.cpp`` in the llama.cpp that ``llama-cpp-python`` vendors: see
``LLAMACPP_VERSION``). Each first asks ``refusal``: a setup whose draft the engine cannot
load (``spectune.export.drafts.REFUSALS``: a feature head anywhere, suffix drafting on
llama.cpp, ...) or whose target it cannot load (llama-server takes a GGUF file) is refused
with one line saying why and what to use instead; no plan names what the engine cannot
load. What an engine runs differently from spectune is said in ``notes``, never dropped
silently.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spectune.errors import InvalidParameterError
from spectune.export.drafts import ENGINE_LABELS, DraftRef, draft_refusal, resolve_draft
from spectune.export.tuning import Tuning
from spectune.models.loading import DEFAULT_TARGET, default_target_path
from spectune.records import validate_k

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "LLAMACPP_VERSION",
    "TARGET_TEMPLATE",
    "ExportPlan",
    "engine_name",
    "export",
    "export_best",
    "refusal",
    "target_refusal",
    "to_llamacpp",
    "to_sglang",
    "to_vllm",
]

ENGINES = ("vllm", "sglang", "llamacpp")
ENGINE_NAMES = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "llama.cpp": "llamacpp"}
TARGET_TEMPLATE = "TARGET_MODEL"  # the target, where the setup does not name one
# The llama.cpp whose llama-server flags ``to_llamacpp`` writes: the one vendored by the
# llama-cpp-python sdist that ``spectune[llamacpp]`` builds. In it ``--draft-max`` /
# ``--draft-min`` are removed (they fail with "the argument has been removed"): the
# draft size is ``--spec-draft-n-max`` / ``--spec-draft-n-min``, and a draft model drafts
# only under ``--spec-type draft-simple`` (without a type, a plain draft GGUF is loaded
# but never used).
LLAMACPP_VERSION = "llama-cpp-python 0.3.36, llama.cpp ggml-org/llama.cpp@0c1e57098"


@dataclass(frozen=True)
class ExportPlan:
    engine: str
    args: list[str]  # flags for the engine's server command
    command: str  # a ready-to-run command line
    speculative_config: dict[str, Any] = field(default_factory=dict)  # vLLM's JSON
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "args": self.args,
            "command": self.command,
            "speculative_config": self.speculative_config,
            "notes": self.notes,
        }


def engine_name(name: str) -> str:
    """``vllm``, ``sglang`` or ``llamacpp`` (also spelled ``llama.cpp``)."""
    if name not in ENGINE_NAMES:
        raise InvalidParameterError(
            f"unknown engine {name!r}; choose one of vllm, sglang, llamacpp (or llama.cpp)"
        )
    return ENGINE_NAMES[name]


def _target(target: str | None) -> str:
    """The target as a path where spectune names it (``default``), else as given."""
    if target is None:
        return TARGET_TEMPLATE
    return str(default_target_path()) if target == DEFAULT_TARGET else target


def target_refusal(target: str | None, engine: str) -> str | None:
    """Why ``engine`` cannot load ``target`` (llama-server: anything but a GGUF file), or
    None."""
    path = _target(target)
    if engine_name(engine) == "llamacpp" and path != TARGET_TEMPLATE and not path.endswith(".gguf"):
        return f"llama-server loads the target from a GGUF file, not {path}: give its .gguf"
    return None


def refusal(tuning: Tuning, engine: str) -> str | None:
    """Why ``engine`` cannot run ``tuning`` (no speculation, or a draft or target it cannot
    load), in one line saying what to use instead; None when it can."""
    engine = engine_name(engine)
    if tuning.draft in (None, "none") or tuning.k == 0:
        return "the result recommends no speculation (no draft or K = 0): nothing to export"
    assert tuning.draft is not None
    return target_refusal(tuning.target, engine) or draft_refusal(
        resolve_draft(tuning.draft), engine
    )


@dataclass(frozen=True)
class _Setup:
    """A tuning an engine can run: its draft and target resolved."""

    draft: DraftRef
    target: str
    k: int
    speculate_max_batch: int | None
    notes: list[str]


def _setup(tuning: Tuning, engine: str) -> _Setup:
    reason = refusal(tuning, engine)
    if reason is not None:
        raise InvalidParameterError(reason)
    validate_k(tuning.k)
    if tuning.speculate_max_batch is not None and tuning.speculate_max_batch < 0:
        raise InvalidParameterError("speculate_max_batch must be >= 0")
    assert tuning.draft is not None
    draft = resolve_draft(tuning.draft)
    target = _target(tuning.target)
    label = ENGINE_LABELS[engine]
    notes = []
    if target == TARGET_TEMPLATE:
        kind = "GGUF file" if engine == "llamacpp" else "folder or hub id"
        notes.append(f"replace {TARGET_TEMPLATE} with the target's {kind}")
    elif target.endswith(".gguf") and engine != "llamacpp":
        notes.append(
            f"the target is a GGUF file; {label} serves a Hugging Face checkpoint best (its GGUF "
            "loading is experimental): give the target's original folder or hub id with --target"
        )
    if draft.kind == "hub":
        notes.append(
            f"draft {draft.spec} is no path here, so it goes to {label} as a hub id, unchecked: "
            "it must be a causal LM with the target's tokenizer"
        )
    if draft.kind == "template":
        notes.append(f"replace {draft.spec} with the draft model's folder, hub id or GGUF file")
    return _Setup(draft, target, tuning.k, tuning.speculate_max_batch, notes)


def to_vllm(tuning: Tuning) -> ExportPlan:
    """vLLM's ``--speculative-config`` JSON: ``draft_model`` for a standalone draft model,
    ``ngram`` for prompt lookup (``prompt_lookup_max``/``min``), ``suffix`` for suffix
    drafting; ``num_speculative_tokens`` K, ``disable_by_batch_size`` the threshold."""
    setup = _setup(tuning, "vllm")
    notes = setup.notes
    config: dict[str, Any]
    if setup.draft.kind == "ngram":
        # spectune's prompt lookup matches 1..3-gram suffixes.
        config = {
            "method": "ngram",
            "num_speculative_tokens": setup.k,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    elif setup.draft.kind == "suffix":
        config = {"method": "suffix", "num_speculative_tokens": setup.k}
        notes.append(
            "vLLM's suffix method (Arctic Inference's suffix decoding: pip install "
            "arctic-inference) drafts up to K tokens from suffix trees of the prompt and "
            "earlier responses; spectune's corpus index is not carried over"
        )
    else:
        config = {
            "method": "draft_model",
            "model": setup.draft.location,
            "num_speculative_tokens": setup.k,
        }
    limit = setup.speculate_max_batch
    if limit is not None:
        if limit >= 2:
            # vLLM: "disable speculative decoding for new incoming requests when the
            # number of enqueued requests is larger than this value" (it must be >= 2).
            config["disable_by_batch_size"] = limit
        else:
            notes.append(
                f"speculation pays only up to {limit} running request(s); vLLM's "
                "disable_by_batch_size must be >= 2, so it is left out: consider serving "
                "without speculation"
            )
    args = ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    command = shlex.join(["vllm", "serve", setup.target, *args])
    return ExportPlan("vllm", args, command, config, notes)


def to_sglang(tuning: Tuning) -> ExportPlan:
    """SGLang's server flags: ``STANDALONE`` (a standalone draft LM) as a chain draft
    (``--speculative-eagle-topk 1``) of K steps, K + 1 tokens per verification; ``NGRAM``
    for prompt lookup and suffix drafting."""
    setup = _setup(tuning, "sglang")
    notes = setup.notes
    if setup.draft.kind in ("ngram", "suffix"):
        args = [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(setup.k + 1),
        ]
        notes.append("SGLang's NGRAM speculation runs on CUDA only")
        if setup.draft.kind == "suffix":
            notes.append(
                "SGLang has no suffix method; NGRAM, which matches the request's last tokens "
                "against the prompts and outputs it has served, is its nearest; spectune's "
                "corpus index is not carried over"
            )
    else:
        assert setup.draft.location is not None
        args = [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            setup.draft.location,
            "--speculative-num-steps",
            str(setup.k),
            "--speculative-eagle-topk",
            "1",
            # A chain of K draft tokens plus the verified root: num_steps * topk + 1.
            "--speculative-num-draft-tokens",
            str(setup.k + 1),
        ]
    if setup.speculate_max_batch is not None:
        notes.append(
            f"SGLang has no flag to stop speculating above a batch size; speculation paid "
            f"only up to {setup.speculate_max_batch} running requests here, so cap "
            f"--max-running-requests near it or serve larger batches without speculation"
        )
    command = shlex.join(
        ["python", "-m", "sglang.launch_server", "--model-path", setup.target, *args]
    )
    return ExportPlan("sglang", args, command, {}, notes)


def to_llamacpp(tuning: Tuning) -> ExportPlan:
    """``llama-server`` flags (see ``LLAMACPP_VERSION``): a draft model GGUF as ``--spec-type
    draft-simple`` drafting exactly K tokens (``--spec-draft-n-max K``, ``--spec-draft-n-min
    0``, ``--spec-draft-p-min 0``: no early stop on a hesitant draft, like spectune's fixed
    K); n-gram lookup as ``--spec-type ngram-simple``, a 3-token lookup n-gram followed by
    a K-token draft."""
    setup = _setup(tuning, "llamacpp")
    notes = setup.notes
    if setup.draft.kind == "ngram":
        args = [
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
            "--spec-ngram-simple-size-m",
            str(setup.k),
        ]
        notes.append(
            "llama.cpp's ngram-simple looks up exactly 3 tokens; spectune's n-gram drafter "
            "backs off from 3 to 1 when the longer match fails"
        )
    else:
        assert setup.draft.location is not None
        args = [
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            setup.draft.location,
            "--spec-draft-n-max",
            str(setup.k),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            "0",
        ]
    if setup.speculate_max_batch is not None:
        notes.append(
            f"llama-server has no flag to stop speculating above a batch size; speculation "
            f"paid only up to {setup.speculate_max_batch} running requests here, so keep "
            f"--parallel near it or serve larger batches without speculation"
        )
    notes.append(
        f"flag names as of {LLAMACPP_VERSION}; older llama.cpp builds spell the draft size "
        "--draft-max / --draft-min"
    )
    command = shlex.join(["llama-server", "--model", setup.target, *args])
    return ExportPlan("llamacpp", args, command, {}, notes)


WRITERS: dict[str, Callable[[Tuning], ExportPlan]] = {
    "vllm": to_vllm,
    "sglang": to_sglang,
    "llamacpp": to_llamacpp,
}


def export(tuning: Tuning, engine: str) -> ExportPlan:
    """``tuning`` as ``engine``'s flags; ``InvalidParameterError`` with ``refusal``'s line
    when the engine cannot run it."""
    return WRITERS[engine_name(engine)](tuning)


def export_best(tunings: Sequence[Tuning], engine: str) -> ExportPlan:
    """The first of ``tunings`` (best first, as ``read_tunings`` ranks a bench run) that
    ``engine`` can run, with a note for each better one it cannot; refused with the best
    one's reason when it can run none."""
    engine = engine_name(engine)
    skipped: list[str] = []
    for tuning in tunings:
        reason = refusal(tuning, engine)
        if reason is None:
            plan = export(tuning, engine)
            return replace(plan, notes=[*skipped, *plan.notes])
        skipped.append(f"skipped {tuning.label}, ranked above it in {tuning.source}: {reason}")
    if not tunings:
        raise InvalidParameterError("no tuned setup to export")
    first = refusal(tunings[0], engine)
    assert first is not None
    if len(tunings) > 1:
        first += f" (nor can {ENGINE_LABELS[engine]} run any other setup in {tunings[0].source})"
    raise InvalidParameterError(first)
