"""A target written as a Hugging Face folder: the form vLLM (and transformers) load.

vLLM 0.32 cannot serve a GGUF. ``convert_target`` reads the target the way spectune's own
runtime does (a GGUF dequantised to fp32, llama.cpp's rotary row order undone; or a native
folder) and writes what vLLM reads:

- ``config.json``        ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` for qwen2, whose biases
                         sit on q/k/v only), fp32;
- ``model.safetensors``  the fp32 weights under transformers' names;
- tokenizer files        ``tokenizer.json``, ``tokenizer_config.json`` and the chat template;
- ``spectune-convert.json`` the source's path, size, modification time and SHA-256.

A second conversion of the same source into the same folder reads the record and stops
(the hash is computed again only when size or time changed). ``check_logits`` loads the
folder with transformers and compares its logits with spectune's runtime on a few prompts:
the same weights in fp32, so they differ only by summation order (``LOGIT_TOLERANCE``);
``record_check`` keeps the result in the record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spectune.errors import InvalidParameterError, ModelLoadError
from spectune.models.cache_dir import derived_path
from spectune.models.llama import LlamaLM
from spectune.models.loading import (
    NATIVE_FAMILIES,
    gguf_architecture,
    load_model,
    resolve_model_path,
    save_native,
)
from spectune.models.tokenizer import load_tokenizer

__all__ = [
    "CHECK_PROMPTS",
    "LOGIT_TOLERANCE",
    "RECORD",
    "Conversion",
    "LogitCheck",
    "check_logits",
    "check_source",
    "compare_logits",
    "convert_target",
    "record_check",
    "served_folder",
]

RECORD = "spectune-convert.json"
FORMAT = 1  # the record's and the folder's layout; a change converts again
# fp32 both sides, the same weights: only the order of sums differs. Measured on the
# default target: at most ~2e-5 of the largest logit.
LOGIT_TOLERANCE = 1e-3  # |logit difference| over max(1, |largest logit|)
CHECK_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Speculative decoding drafts tokens and verifies them",
)
# The architecture transformers and vLLM read, per native family.
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("llama", "LlamaForCausalLM"),  # no sliding window in the native runtime
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}


@dataclass(frozen=True)
class LogitCheck:
    prompts: int
    positions: int  # logit rows compared
    max_relative_diff: float  # max |difference| / max(1, |largest logit|), over prompts
    argmax_equal: bool  # the same top token at every position

    @property
    def passed(self) -> bool:
        return self.argmax_equal and self.max_relative_diff <= LOGIT_TOLERANCE

    def summary(self) -> str:
        return (
            f"logits vs spectune's fp32 runtime on {self.prompts} prompts ({self.positions} "
            f"positions): max difference {self.max_relative_diff:.1e} of the largest logit "
            f"(tolerance {LOGIT_TOLERANCE:.0e}), same top token: "
            f"{'yes' if self.argmax_equal else 'no'}"
        )


@dataclass(frozen=True)
class Conversion:
    folder: Path
    source: Path
    sha256: str
    reused: bool  # the folder already held this source's conversion
    check: LogitCheck | None  # the logit check recorded with the folder (None: not run)


def served_folder(ref: str | Path) -> tuple[Path, bool]:
    """The Hugging Face folder an engine serves for target ``ref``, and whether it must be
    converted first: a model folder (with ``config.json``) as it is; ``default`` or a GGUF
    converted into spectune's cache (``spectune.models.cache_dir``, keyed by the file's
    path, size and time), once. A source ``convert_target`` cannot take is a one-line
    error here, before anything loads."""
    path = resolve_model_path(ref)
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve(), False
    out = derived_path(path, "vllm-target")
    check_source(ref, out)
    return out, not _converted(path, out)


def _converted(path: Path, out: Path) -> bool:
    """Whether ``out`` holds this source's conversion already, by size and time."""
    record = _record_of(out)
    return (
        record is not None
        and record.get("format") == FORMAT
        and (record.get("files") == _stat_key(path))
    )


def check_source(ref: str | Path, out: Path) -> Path:
    """The source's path, or a one-line error before any heavy work: a missing or unknown
    source, a family the native runtime does not hold, an ``out`` that is a file or a
    folder of something else."""
    path = resolve_model_path(ref)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path.name} is not a .gguf file or a model folder")
        family = gguf_architecture(path)
    else:
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelLoadError(f"{path} is not a model folder: config.json is missing")
        try:
            family = str(json.loads(config_file.read_text()).get("model_type", ""))
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise ModelLoadError(f"cannot read {config_file}: {exc}") from None
    if family not in NATIVE_FAMILIES:
        raise ModelLoadError(
            f"convert takes Llama-family targets ({', '.join(NATIVE_FAMILIES)}); "
            f"{path.name} is '{family}'"
        )
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out {out} is a file, not a folder")
    if out.resolve() == (path if path.is_dir() else path.parent).resolve():
        raise InvalidParameterError("--out must not be the source's own folder")
    if out.is_dir() and any(out.iterdir()) and not (out / RECORD).is_file():
        raise InvalidParameterError(
            f"--out {out} holds other files; give an empty or new folder "
            f"(or one 'spectune convert' wrote)"
        )
    return path


def _source_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(f for f in path.iterdir() if f.is_file() and f.name != RECORD)


def _stat_key(path: Path) -> list[list[Any]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in _source_files(path)]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for file in _source_files(path):
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _record_of(out: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((out / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def convert_target(ref: str | Path, out: Path) -> Conversion:
    """Write target ``ref`` (``default``, a ``.gguf``, a native folder) as a Hugging Face
    folder at ``out``; a folder that already holds this source's conversion is kept."""
    path = check_source(ref, out)
    stat_key = _stat_key(path)
    record = _record_of(out)
    if record is not None and record.get("format") == FORMAT:
        check = _recorded_check(record)
        if record.get("files") == stat_key:
            return Conversion(out, path, str(record["sha256"]), True, check)
        sha = _sha256(path)
        if record.get("sha256") == sha:
            return Conversion(out, path, sha, True, check)
    else:
        sha = _sha256(path)
    model = load_model(path, dtype=torch.float32, runtime="native")
    if not isinstance(model, LlamaLM):  # check_source admitted only native families
        raise ModelLoadError(f"{path.name} did not load into the native runtime")
    model_type, architecture = _ARCHITECTURES[model.net.cfg.family]
    tokenizer = load_tokenizer(path)
    # Written aside, then put in place: an interrupted conversion leaves no half folder
    # that the record would vouch for.
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save_native(
        model,
        staging,
        extra_config={"model_type": model_type, "architectures": [architecture]},
    )
    tokenizer.hf.save_pretrained(str(staging))
    record = {
        "format": FORMAT,
        "source": str(path.resolve()),
        "files": stat_key,
        "sha256": sha,
        "architecture": architecture,
    }
    (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, out)
    return Conversion(out, path, sha, False, None)


def record_check(folder: Path, check: LogitCheck) -> None:
    """Keep ``check`` in the folder's record, so a reused folder need not be checked again."""
    record = _record_of(folder)
    if record is None:
        raise ModelLoadError(f"{folder} holds no {RECORD}: it is not a conversion")
    record["check"] = dataclasses.asdict(check)
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _recorded_check(record: dict[str, Any]) -> LogitCheck | None:
    found = record.get("check")
    try:
        return LogitCheck(**found) if isinstance(found, dict) else None
    except TypeError:  # a record of another layout: checked again
        return None


def check_logits(
    ref: str | Path, folder: Path, prompts: Sequence[str] = CHECK_PROMPTS
) -> LogitCheck:
    """Logits of ``folder`` loaded by transformers against spectune's own fp32 runtime on
    ``ref``, at every position of each prompt (encoded by ``ref``'s tokenizer)."""
    tokenizer = load_tokenizer(resolve_model_path(ref))
    token_lists = [tokenizer.encode(prompt) for prompt in prompts]
    if not all(token_lists):
        raise ModelLoadError(f"{ref}: a check prompt encodes to no tokens")
    return compare_logits(ref, folder, token_lists)


def compare_logits(
    ref: str | Path, folder: Path, token_lists: Sequence[Sequence[int]]
) -> LogitCheck:
    """``check_logits`` on given token ids."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    ours = load_model(resolve_model_path(ref), dtype=torch.float32, runtime="native")
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    theirs.eval()  # type: ignore[no-untyped-call]
    worst, rows, same = 0.0, 0, True
    for tokens in token_lists:
        ids = torch.tensor([list(tokens)], dtype=torch.long)  # [1, n]
        with torch.inference_mode():
            mine = ours.forward(ids, ours.new_cache()).logits[0]  # [n, vocab]
            other = theirs(ids).logits[0].float()  # [n, vocab]
        scale = max(1.0, float(mine.abs().max()))
        worst = max(worst, float((mine - other).abs().max()) / scale)
        same = same and bool(torch.equal(mine.argmax(-1), other.argmax(-1)))
        rows += ids.shape[1]
    return LogitCheck(len(token_lists), rows, worst, same)
