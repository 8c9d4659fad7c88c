"""Carry a tuned setup to the engines users scale out on: vLLM, SGLang and llama.cpp.

A tuned setup is a draft, a K and the batch size above which speculation stops paying.
``read_tuning`` takes them from a result file, tolerating the shapes spectune writes:

- ``spectune select`` JSON: ``{"target": ..., "recommendation": {"draft": ..., "k": ...}}``
- ``spectune bench`` ``results.json``: ``{"config": {...}, "rows": [{"system", "drafter",
  "k", "speedup_vs_plain", "category", ...}]}``; the spectune row with a draft and a fixed
  K with the best speedup wins (all categories pooled when an ``all`` row is absent).
- any JSON with top-level (or ``recommendation``) keys ``draft``/``drafter``, ``k``,
  ``speculate_max_batch`` (alias ``disable_by_batch_size``), and optionally
  ``k_by_batch_size`` ``{"1": 5, "8": 2, "16": 0}``: the threshold is then the largest
  batch size before the first K of 0.

``to_vllm``, ``to_sglang`` and ``to_llamacpp`` turn it into those engines' flags (names as
of vLLM's ``SpeculativeConfig``, SGLang's server arguments, and ``llama-server``'s
``common/arg.cpp`` in the llama.cpp that ``llama-cpp-python`` vendors: see
``LLAMACPP_VERSION``). What an engine cannot express is said in ``notes``, never dropped
silently.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spectune.errors import InvalidParameterError
from spectune.records import validate_k

__all__ = [
    "ENGINES",
    "LLAMACPP_VERSION",
    "ExportPlan",
    "Tuning",
    "export",
    "read_tuning",
    "to_llamacpp",
    "to_sglang",
    "to_vllm",
]

ENGINES = ("vllm", "sglang", "llamacpp")
# The llama.cpp whose llama-server flags ``to_llamacpp`` writes: the one vendored by the
# llama-cpp-python sdist that ``spectune[llamacpp]`` builds. In it ``--draft-max`` /
# ``--draft-min`` are removed (they fail with "the argument has been removed"): the
# draft size is ``--spec-draft-n-max`` / ``--spec-draft-n-min``, and a draft model drafts
# only under ``--spec-type draft-simple`` (without a type, a plain draft GGUF is loaded
# but never used).
LLAMACPP_VERSION = "llama-cpp-python 0.3.36, llama.cpp ggml-org/llama.cpp@0c1e57098"


@dataclass(frozen=True)
class Tuning:
    """A tuned speculative setup (what ``select``/``bench`` recommend)."""

    draft: str | None  # a draft model path or name, "ngram", or None (no speculation)
    k: int
    speculate_max_batch: int | None = None  # no speculation above this many running requests
    target: str | None = None
    source: str | None = None  # where it came from, for the notes


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


def _int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidParameterError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _threshold_from_ks(ks: Mapping[str, Any]) -> int | None:
    """Largest batch size before the first K of 0 (None: K never drops to 0)."""
    try:
        pairs = sorted((int(size), int(k)) for size, k in ks.items())
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("k_by_batch_size must map batch sizes to K") from exc
    previous: int | None = None
    for size, k in pairs:
        if k == 0:
            return previous if previous is not None else 0
        previous = size
    return None


def _from_keys(data: Mapping[str, Any], source: str) -> Tuning | None:
    scopes = [data]
    if isinstance(data.get("recommendation"), Mapping):
        scopes.insert(0, data["recommendation"])
    found: dict[str, Any] = {}
    for scope in scopes:
        for key, names in (
            ("draft", ("draft", "drafter")),
            ("k", ("k", "num_speculative_tokens")),
            ("limit", ("speculate_max_batch", "disable_by_batch_size")),
            ("ks", ("k_by_batch_size",)),
        ):
            for name in names:
                if key not in found and scope.get(name) is not None:
                    found[key] = scope[name]
    if "k" not in found and "ks" not in found:
        return None
    ks = found.get("ks")
    limit = _int(found.get("limit"), "speculate_max_batch")
    k = _int(found.get("k"), "k")
    if isinstance(ks, Mapping):
        limit = limit if limit is not None else _threshold_from_ks(ks)
        if k is None:
            smallest = min(ks, key=lambda size: int(size))
            k = _int(ks[smallest], "k")
    target = data.get("target")
    return Tuning(
        draft=str(found["draft"]) if found.get("draft") is not None else None,
        k=k or 0,
        speculate_max_batch=limit,
        target=target if isinstance(target, str) else None,
        source=source,
    )


def _from_bench_rows(data: Mapping[str, Any], source: str) -> Tuning | None:
    rows = [
        r
        for r in data.get("rows", [])
        if isinstance(r, Mapping)
        and r.get("drafter")
        and isinstance(r.get("k"), int)
        and isinstance(r.get("speedup_vs_plain"), int | float)
        and str(r.get("system", "spectune")).startswith("spectune")
    ]
    if not rows:
        return None
    pooled = [r for r in rows if r.get("category") == "all"] or rows
    # Mean speedup per (drafter, K) over categories and temperatures.
    scores: dict[tuple[str, int], list[float]] = {}
    for r in pooled:
        scores.setdefault((str(r["drafter"]), int(r["k"])), []).append(float(r["speedup_vs_plain"]))
    (draft, k), _ = max(scores.items(), key=lambda item: sum(item[1]) / len(item[1]))
    config = data.get("config")
    target = config.get("target") if isinstance(config, Mapping) else None
    return Tuning(draft, k, None, target if isinstance(target, str) else None, source)


def read_tuning(path: Path) -> Tuning:
    """The tuned setup in a ``select`` or ``bench`` result file (see the module docstring)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InvalidParameterError(f"no such result file: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidParameterError(f"{path} is not a readable JSON file: {exc}") from exc
    if not isinstance(data, Mapping):
        raise InvalidParameterError(f"{path} holds no JSON object")
    tuning = _from_keys(data, str(path)) or _from_bench_rows(data, str(path))
    if tuning is None:
        raise InvalidParameterError(
            f"{path} holds no recommendation: expected 'recommendation': {{'draft', 'k'}} "
            "(spectune select), 'rows' (spectune bench) or top-level 'draft' and 'k'"
        )
    return tuning


def _check(tuning: Tuning) -> Tuning:
    if tuning.draft in (None, "none") or tuning.k == 0:
        raise InvalidParameterError(
            "the result recommends no speculation (no draft or K = 0): nothing to export"
        )
    validate_k(tuning.k)
    if tuning.speculate_max_batch is not None and tuning.speculate_max_batch < 0:
        raise InvalidParameterError("speculate_max_batch must be >= 0")
    if tuning.target is None:
        return replace(tuning, target="TARGET_MODEL")
    return tuning


def _draft_notes(draft: str) -> list[str]:
    notes = []
    if draft.endswith(".gguf"):
        notes.append(
            f"the draft {draft} is a GGUF file; vLLM and SGLang load drafts as Hugging Face "
            "folders (safetensors): export it with spectune's save_native or use its HF original"
        )
    if draft.startswith("model:"):
        notes.append(f"the draft is named '{draft}'; replace it with its folder or hub id")
    return notes


def to_vllm(tuning: Tuning) -> ExportPlan:
    """vLLM's ``--speculative-config`` JSON (``method``, ``model``, ``num_speculative_tokens``,
    ``disable_by_batch_size``; n-gram drafts use ``prompt_lookup_max``/``min``)."""
    tuning = _check(tuning)
    assert tuning.draft is not None and tuning.target is not None
    notes: list[str] = []
    config: dict[str, Any]
    if tuning.draft == "ngram":
        # spectune's prompt lookup matches 1..3-gram suffixes.
        config = {
            "method": "ngram",
            "num_speculative_tokens": tuning.k,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    else:
        config = {
            "method": "draft_model",
            "model": tuning.draft,
            "num_speculative_tokens": tuning.k,
        }
        notes += _draft_notes(tuning.draft)
    limit = tuning.speculate_max_batch
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
    command = shlex.join(["vllm", "serve", tuning.target, *args])
    return ExportPlan("vllm", args, command, config, notes)


def to_sglang(tuning: Tuning) -> ExportPlan:
    """SGLang's server flags: ``STANDALONE`` (a small draft LLM) or ``NGRAM``, a chain draft
    (``--speculative-eagle-topk 1``) of K steps, K + 1 tokens per verification."""
    tuning = _check(tuning)
    assert tuning.draft is not None and tuning.target is not None
    notes: list[str] = []
    if tuning.draft == "ngram":
        args = [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(tuning.k + 1),
        ]
        notes.append("SGLang's NGRAM speculation runs on CUDA only")
    else:
        args = [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            tuning.draft,
            "--speculative-num-steps",
            str(tuning.k),
            "--speculative-eagle-topk",
            "1",
            # A chain of K draft tokens plus the verified root: num_steps * topk + 1.
            "--speculative-num-draft-tokens",
            str(tuning.k + 1),
        ]
        notes += _draft_notes(tuning.draft)
    if tuning.speculate_max_batch is not None:
        notes.append(
            f"SGLang has no flag to stop speculating above a batch size; speculation paid "
            f"only up to {tuning.speculate_max_batch} running requests here, so cap "
            f"--max-running-requests near it or serve larger batches without speculation"
        )
    command = shlex.join(
        ["python", "-m", "sglang.launch_server", "--model-path", tuning.target, *args]
    )
    return ExportPlan("sglang", args, command, {}, notes)


def to_llamacpp(tuning: Tuning) -> ExportPlan:
    """``llama-server`` flags (see ``LLAMACPP_VERSION``): a draft model as ``--spec-type
    draft-simple`` drafting exactly K tokens (``--spec-draft-n-max K``, ``--spec-draft-n-min
    0``, ``--spec-draft-p-min 0``: no early stop on a hesitant draft, like spectune's fixed
    K); n-gram lookup as ``--spec-type ngram-simple``, a 3-token lookup n-gram followed by
    a K-token draft."""
    tuning = _check(tuning)
    assert tuning.draft is not None and tuning.target is not None
    notes: list[str] = []
    if tuning.draft == "ngram":
        args = [
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
            "--spec-ngram-simple-size-m",
            str(tuning.k),
        ]
        notes.append(
            "llama.cpp's ngram-simple looks up exactly 3 tokens; spectune's n-gram drafter "
            "backs off from 3 to 1 when the longer match fails"
        )
    else:
        args = [
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            tuning.draft,
            "--spec-draft-n-max",
            str(tuning.k),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            "0",
        ]
        if tuning.draft.startswith("model:"):
            notes.append(f"the draft is named '{tuning.draft}'; replace it with its GGUF file")
        elif not tuning.draft.endswith(".gguf"):
            notes.append(
                f"llama.cpp loads drafts as GGUF files: a spectune distill --kind lm folder "
                f"is converted by spectune tune --engine llamacpp --draft {tuning.draft} "
                "(which also measures the flags); others with llama.cpp's convert_hf_to_gguf.py"
            )
    if not tuning.target.endswith(".gguf"):
        notes.append(f"llama.cpp loads the target as a GGUF file, not {tuning.target}")
    if tuning.speculate_max_batch is not None:
        notes.append(
            f"llama-server has no flag to stop speculating above a batch size; speculation "
            f"paid only up to {tuning.speculate_max_batch} running requests here, so keep "
            f"--parallel near it or serve larger batches without speculation"
        )
    notes.append(
        f"flag names as of {LLAMACPP_VERSION}; older llama.cpp builds spell the draft size "
        "--draft-max / --draft-min"
    )
    command = shlex.join(["llama-server", "--model", tuning.target, *args])
    return ExportPlan("llamacpp", args, command, {}, notes)


def export(tuning: Tuning, engine: str) -> ExportPlan:
    if engine == "vllm":
        return to_vllm(tuning)
    if engine == "sglang":
        return to_sglang(tuning)
    if engine == "llamacpp":
        return to_llamacpp(tuning)
    raise InvalidParameterError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
