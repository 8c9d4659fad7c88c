"""What a model is and how spectune will run it, read from its metadata before any weight.

Loading a non-Llama GGUF de-quantises it through transformers (minutes for a 270M model),
so every question that metadata answers is asked first: which runtime runs the model,
whether it decodes a batch, whether it takes token trees, its vocabulary and special
tokens (a draft's pairing with its target), whether it has a chat template. A ``.gguf``
file answers from its header (``spectune.models.gguf_header``: a few hundredths of a
second even for a 262,144-token vocabulary, cached per file version); a model folder from
its ``config.json`` and ``tokenizer_config.json``.

Runtimes, as ``spectune.models.loading`` chooses them for ``--runtime auto``:

- ``native``: Llama-family models (llama, qwen2, mistral) without rope scaling or
  sliding-window patterns; batches, token trees, int8/int4 kernels.
- ``hf`` (transformers): every other architecture; one sequence per cache, token trees
  only where every layer attends to the full context, fp32 or bf16 only.
- ``llamacpp``: a GGUF on llama.cpp's kernels (``--runtime llamacpp``); batches, no trees.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import ModelLoadError
from spectune.models.gguf_header import GGUFHeader, read_gguf_header
from spectune.models.refs import resolve_model_path

__all__ = [
    "NATIVE_FAMILIES",
    "RUNTIMES",
    "ModelFacts",
    "chat_template_known",
    "family_label",
    "folder_needs_hf",
    "gguf_header",
    "gguf_version",
    "model_facts",
    "read_json",
]

NATIVE_FAMILIES = ("llama", "qwen2", "mistral")
_LLAMACPP = "llamacpp"  # spectune.models.llamacpp.LLAMACPP (that module imports torch)
RUNTIMES = ("auto", "native", "hf", _LLAMACPP)
_RUNTIME_WORDS = {"native": "the native runtime", "hf": "the transformers runtime"}
_RUNTIME_WORDS[_LLAMACPP] = "llama.cpp's runtime"
# Architecture names as people write them; others are shown as the metadata spells them.
_FAMILY_NAMES = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "mistral": "Mistral",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "gemma3_text": "Gemma 3",
    "phi3": "Phi-3",
    "gpt2": "GPT-2",
}


def family_label(family: str) -> str:
    """``gemma3`` -> ``Gemma 3 (gemma3)``: the name people know, then the metadata's."""
    known = _FAMILY_NAMES.get(family)
    return f"{known} ({family})" if known else (family or "an unknown architecture")


@dataclass(frozen=True)
class ModelFacts:
    """A model as its metadata describes it, and how spectune will run it.

    ``runtime``: ``native``, ``hf`` or ``llamacpp`` (the module docstring). ``max_batch``:
    the most sequences one cache decodes together (None: no limit). ``trees``: whether the
    runtime takes token trees for this model. ``has_chat_template``: None where the
    metadata cannot tell (a folder without ``tokenizer_config.json``). ``vocab_size`` and
    the special-token ids are what draft/target pairing compares
    (``spectune.drafters.pairing.identity_problems``).
    """

    name: str
    family: str  # "llama", "gemma3", ... (general.architecture / config.model_type)
    runtime: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    has_chat_template: bool | None
    max_batch: int | None
    trees: bool
    sliding_window: int | None  # tokens a sliding-window layer sees; None: full attention
    max_context: int

    @property
    def label(self) -> str:
        return family_label(self.family)

    @property
    def runs_on(self) -> str:
        """``Gemma 3 (gemma3) runs on the transformers runtime``."""
        return f"{self.label} runs on {_RUNTIME_WORDS[self.runtime]}"

    def batch_refusal(self, max_batch: int) -> str | None:
        """Why this model cannot decode ``max_batch`` sequences together, with the fix
        (None: it can)."""
        if self.max_batch is None or max_batch <= self.max_batch:
            return None
        return f"{self.runs_on}, one sequence at a time: use --max-batch {self.max_batch}"

    def precision_refusal(self, quantize: str) -> str | None:
        """Why this model cannot run with ``int8``/``int4`` kernels (None: it can, or
        ``quantize`` is ``none``)."""
        if quantize == "none" or self.runtime == "native":
            return None
        return (
            f"--dtype {quantize} needs the native runtime (Llama-family models: "
            f"{', '.join(NATIVE_FAMILIES)}); {self.runs_on}: use --dtype fp32 or bf16"
        )

    def tree_refusal(self) -> str | None:
        """Why this model cannot verify token trees (None: it can)."""
        if self.trees:
            return None
        if self.runtime == _LLAMACPP:
            return "token trees need tree attention masks, which llama.cpp's runtime lacks"
        why = (
            f"its sliding-window layers ({self.sliding_window} tokens) would lose their window "
            "under a tree mask"
            if self.sliding_window is not None
            else "its attention takes no tree mask"
        )
        return f"token trees: {self.runs_on}, where {why}; draft chains instead"


def model_facts(ref: str | Path, runtime: str = "auto") -> ModelFacts:
    """The ``ModelFacts`` of ``ref`` (``default``, a shipped draft name, a ``.gguf`` file or a
    model folder) as ``runtime`` (``auto``, ``native``, ``hf``, ``llamacpp``) would run it.
    Reads metadata only. Raises ``ModelLoadError`` for what loading would refuse on
    metadata alone: a missing model, an unreadable header or config, a file that is no
    GGUF, an architecture the requested runtime does not run."""
    if runtime not in RUNTIMES:
        raise ModelLoadError(f"unknown runtime {runtime!r} ({', '.join(RUNTIMES)})")
    path = resolve_model_path(ref)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"unsupported model file {path.name}: expected .gguf or a folder")
        return _gguf_facts(path, gguf_header(path), runtime)
    if runtime == _LLAMACPP:
        raise ModelLoadError(f"--runtime llamacpp runs .gguf files; {path.name} is not one")
    return _folder_facts(path, runtime)


def chat_template_known(ref: str | Path) -> bool | None:
    """Whether ``ref``'s tokenizer has a chat template, from metadata alone: a GGUF's
    ``tokenizer.chat_template`` key; a folder's ``chat_template`` in
    ``tokenizer_config.json`` or a ``chat_template.jinja`` / ``chat_template.json`` file.
    None where the metadata cannot tell (a folder without ``tokenizer_config.json``, or a
    reference that names no readable model: loading then reports that itself), so a
    ``--chat`` on a model without a template can be refused before any weight loads."""
    try:
        return model_facts(ref).has_chat_template
    except ModelLoadError:
        return None


# ---------------------------------------------------------------------------- GGUF


def gguf_version(path: Path) -> tuple[str, int, int]:
    """The GGUF at ``path`` as a cache key: its resolved path, modification time and size
    (an edited file gets a new key), or a one-line ``ModelLoadError``."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


def gguf_header(path: Path) -> GGUFHeader:
    """The header of the GGUF at ``path`` (``read_gguf_header``), read once per version of
    the file."""
    return _header(*gguf_version(path))


@functools.lru_cache(maxsize=8)  # keyed by modification time and size: an edited file is re-read
def _header(path: str, mtime_ns: int, size: int) -> GGUFHeader:
    return read_gguf_header(Path(path))


def _gguf_facts(path: Path, header: GGUFHeader, runtime: str) -> ModelFacts:
    fields = header.fields
    family = str(fields.get("general.architecture", ""))

    def meta(key: str) -> Any:
        return fields.get(f"{family}.{key}")

    chosen = _runtime_for(family, runtime, native_ok=family in NATIVE_FAMILIES)
    window = meta("attention.sliding_window")
    sliding = int(window) if window else None
    eos = fields.get("tokenizer.ggml.eos_token_id")
    vocab = meta("vocab_size") or header.array_lengths.get("tokenizer.ggml.tokens", 0)
    return ModelFacts(
        name=str(fields.get("general.name") or path.stem),
        family=family,
        runtime=chosen,
        vocab_size=int(vocab),
        bos_token_id=_token_id(fields.get("tokenizer.ggml.bos_token_id")),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=_token_id(fields.get("tokenizer.ggml.padding_token_id")),
        has_chat_template=bool(fields.get("tokenizer.chat_template")),
        max_batch=1 if chosen == "hf" else None,
        trees=chosen == "native" or (chosen == "hf" and sliding is None),
        sliding_window=sliding,
        max_context=int(meta("context_length") or 2048),
    )


def _token_id(value: Any) -> int | None:
    return None if value is None else int(value)


# ---------------------------------------------------------------------------- folders


def folder_needs_hf(config: dict[str, Any]) -> bool:
    """Features of a Llama-family folder that the native runtime does not implement (it
    then defers to transformers): rope scaling, sliding-window patterns."""
    rope = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    return rope_type not in ("default", None) or bool(config.get("sliding_window_pattern"))


def read_json(path: Path) -> dict[str, Any]:
    """A model folder's JSON file as an object, or a one-line ``ModelLoadError``."""
    if not path.is_file():
        raise ModelLoadError(f"{path.parent} is not a model folder: {path.name} is missing")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data


def _folder_facts(path: Path, runtime: str) -> ModelFacts:
    config = read_json(path / "config.json")
    text = config.get("text_config") or config  # multimodal configs nest the language model
    family = str(config.get("model_type", ""))
    chosen = _runtime_for(
        family, runtime, native_ok=family in NATIVE_FAMILIES and not folder_needs_hf(config)
    )
    window = text.get("sliding_window") if text.get("use_sliding_window", True) else None
    sliding = int(window) if window else None
    full = all(kind == "full_attention" for kind in text.get("layer_types") or ())
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    try:
        return ModelFacts(
            name=path.name,
            family=family,
            runtime=chosen,
            vocab_size=int(text.get("vocab_size") or 0),
            bos_token_id=_token_id(text.get("bos_token_id", config.get("bos_token_id"))),
            eos_token_ids=tuple(int(e) for e in eos)
            if isinstance(eos, list)
            else (() if eos is None else (int(eos),)),
            pad_token_id=_token_id(text.get("pad_token_id", config.get("pad_token_id"))),
            has_chat_template=_folder_chat_template(path),
            max_batch=1 if chosen == "hf" else None,
            trees=chosen == "native" or (chosen == "hf" and sliding is None and full),
            sliding_window=sliding,
            max_context=int(text.get("max_position_embeddings") or 2048),
        )
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}/config.json: bad field ({exc})") from exc


def _folder_chat_template(path: Path) -> bool | None:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return bool(read_json(config).get("chat_template"))
    except ModelLoadError:
        return None  # the tokenizer's own load reports a damaged file


def _runtime_for(family: str, runtime: str, *, native_ok: bool) -> str:
    """The runtime that runs ``family`` when ``runtime`` is asked for (as ``load_model``)."""
    if runtime in ("hf", _LLAMACPP):
        return runtime
    if native_ok:
        return "native"
    if runtime == "native":
        raise ModelLoadError(
            f"the native runtime does not support '{family}' models; use --runtime hf"
        )
    return "hf"
