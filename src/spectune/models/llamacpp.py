"""llama.cpp backend: a GGUF model on llama.cpp's kernels behind the ``LanguageModel`` protocol.

The model runs through ``llama-cpp-python``'s low-level ctypes API (``llama_cpp.llama_cpp``),
never through its high-level ``Llama`` class: one ``llama_decode`` call per ``forward`` (a
chunk longer than ``MAX_PIECE`` tokens, a prefill, goes in pieces), with an output requested
for every token of the chunk, so verification gets the logits of the pending token and of
every draft token from one pass. The weights stay in the file's own tensor types (Q4_1 for
the default target): ``--dtype`` does not apply. Tokenization stays spectune's
(``spectune.models.tokenizer`` reads the same GGUF vocabulary), so token ids are identical
to the native runtime's.

The cache (``LlamaCppCache``) is a llama.cpp context: sequence ``row`` of the cache is
llama.cpp sequence id ``row`` (several rows: one KV stream per sequence, ``kv_unified``
off, so rows hold ``capacity`` tokens each and attention never scans another row's
tokens). Rollback is ``llama_memory_seq_rm`` of the positions at or past the kept length;
a row's lengths are mirrored on the host, so the hot path never asks llama.cpp for them.
Invariant: sequence ``row`` holds exactly positions ``0 .. length(row) - 1``.

What llama.cpp cannot do here, and what spectune does instead:

- Token trees: a batch's attention mask is the causal one per sequence, and each sequence's
  positions must continue its cached ones, so ``tree_masks`` is False: the pairing code
  refuses tree drafts and a hybrid drafter drafts chains (``spectune.drafters.pairing``).
  ``move_slots`` (a tree's path compaction) raises.
- Hidden states: llama.cpp exposes only the final embeddings, not the intermediate layers an
  EAGLE-3 feature head reads, so ``forward`` returns ``hidden=None`` and a feature-head draft
  is refused when the target runs here (``FEATURE_HEAD_REFUSAL``).

Threads: ``threads`` fixed at load, or None to follow ``torch.get_num_threads()`` at every
forward (the CLI's ``--threads`` sets torch's), for one-token and batch passes alike.

Contexts are pooled per model: a cache that is garbage collected hands its context back,
and the next ``new_cache`` of the same shape reuses it (clearing its memory) instead of
allocating and warming a new one.
"""

from __future__ import annotations

import ctypes
import importlib
import weakref
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor

from spectune.errors import IncompatibleModelsError, ModelLoadError, PromptError
from spectune.models.base import ModelInfo, ModelOutput
from spectune.models.llama import LlamaConfig
from spectune.models.names import LLAMACPP

__all__ = [
    "BUILD_MINUTES",
    "FEATURE_HEAD_REFUSAL",
    "LLAMACPP",
    "LlamaCppCache",
    "LlamaCppModel",
    "MAX_PIECE",
    "NO_AMX_CMAKE_ARGS",
    "amx_problem",
    "llama_cpp_available",
    "load_llama_cpp",
    "refuse_feature_head",
]

# How long ``pip install spectune[llamacpp]`` compiles llama.cpp on a 2-core machine (the
# package has no binary wheel for this platform).
BUILD_MINUTES = 25
# A build on every AVX-512 feature but AMX (``amx_problem``); GGML_NATIVE would add AMX.
NO_AMX_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON "
    "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
)
MAX_PIECE = 512  # tokens per llama_decode call: the context's batch and micro-batch size
_CONTEXT_STEP = 256  # a context holds a multiple of this many tokens per sequence
_FREE_CONTEXTS = 2  # contexts a model keeps for reuse once their caches are gone

FEATURE_HEAD_REFUSAL = (
    "a feature-head (EAGLE-3) draft reads the target's intermediate hidden states, which "
    "llama.cpp does not expose; use --runtime native for this draft, or a draft model, "
    "'ngram' or 'suffix' with --runtime llamacpp"
)


def load_llama_cpp() -> ModuleType:
    """The low-level ``llama_cpp.llama_cpp`` module, llama.cpp's log kept off stderr (its last
    warnings and errors go into our error messages); a one-line ``ModelLoadError`` when the
    optional extra is not installed."""
    try:
        lib = importlib.import_module("llama_cpp.llama_cpp")
    except ImportError as exc:
        raise ModelLoadError(
            f"--runtime llamacpp needs llama-cpp-python: pip install 'spectune[llamacpp]' "
            f"(it compiles llama.cpp, about {BUILD_MINUTES} minutes on 2 cores) ({exc})"
        ) from exc
    problem = amx_problem(lib.llama_print_system_info().decode("utf-8", errors="replace"))
    if problem:
        raise ModelLoadError(problem)
    global _log_callback
    if _log_callback is None:
        # llama.cpp logs every tensor it loads to stderr; keep its last warnings and errors
        # for our own error messages instead (the ctypes callback must stay referenced).
        _log_callback = lib.llama_log_callback(_remember_log)
        lib.llama_log_set(_log_callback, None)
    return lib


def amx_problem(system_info: str) -> str | None:
    """Why a llama.cpp build cannot serve, from ``llama_print_system_info``, or None.

    A build with llama.cpp's AMX kernels (``GGML_NATIVE=ON`` on a CPU with AMX, such as a
    Sapphire Rapids Xeon) crashes the process in ``ggml_backend_amx_mul_mat`` on any batch
    of more than one token with the default target's Q4_1 weights (a prompt, a draft to
    verify), here as in ``llama-bench -p 2`` (llama.cpp issue 20824; its Q4_0/Q4_1 AMX
    results were also found wrong, pull request 16315). Refused before it can crash."""
    if "AMX_INT8 = 1" not in system_info:
        return None
    return (
        "this llama-cpp-python was built with llama.cpp's AMX kernels, which crash on "
        "multi-token batches (llama.cpp issue 20824); rebuild it without them: "
        f"CMAKE_ARGS='{NO_AMX_CMAKE_ARGS}' pip install --force-reinstall --no-cache-dir "
        "'spectune[llamacpp]'"
    )


_log_callback: Any = None
_recent_log: deque[str] = deque(maxlen=3)  # llama.cpp's last warning or error lines
_LOG_WARN, _LOG_ERROR = 3, 4  # ggml_log_level


def _remember_log(level: int, text: bytes, user_data: Any) -> None:
    if level in (_LOG_WARN, _LOG_ERROR):
        line = text.decode("utf-8", errors="replace").strip()
        if line:
            _recent_log.append(line)


def _llama_said() -> str:
    """llama.cpp's last warnings and errors, as a clause for an error message."""
    return f" (llama.cpp: {' / '.join(_recent_log)})" if _recent_log else ""


def llama_cpp_available() -> bool:
    """Whether the optional extra is importable (tests and the bench skip without it)."""
    try:
        importlib.import_module("llama_cpp.llama_cpp")
    except ImportError:
        return False
    return True


class _Weights:
    """The loaded ``llama_model``; freed when the model and every context are gone."""

    def __init__(self, lib: ModuleType, path: Path, gpu: bool) -> None:
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 999 if gpu else 0
        _recent_log.clear()
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if not handle:
            raise ModelLoadError(f"llama.cpp cannot load {path}{_llama_said()}")
        self.handle = handle
        self.vocab_size = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(handle)))
        self.num_parameters = int(lib.llama_model_n_params(handle))
        weakref.finalize(self, lib.llama_model_free, handle)


class _Context:
    """One llama.cpp context (its KV memory holds ``num_seqs`` sequences of ``per_seq``
    tokens) and the batch arrays ``forward`` fills with numpy, never per token in Python."""

    def __init__(self, lib: ModuleType, weights: _Weights, num_seqs: int, per_seq: int) -> None:
        params = lib.llama_context_default_params()
        params.n_ctx = num_seqs * per_seq
        params.n_batch = params.n_ubatch = MAX_PIECE
        params.n_seq_max = num_seqs
        params.kv_unified = num_seqs == 1
        params.no_perf = True
        threads = torch.get_num_threads()
        params.n_threads = params.n_threads_batch = threads
        _recent_log.clear()
        handle = lib.llama_init_from_model(weights.handle, params)
        if not handle:
            raise ModelLoadError(
                f"llama.cpp cannot create a context of {num_seqs} x {per_seq} tokens{_llama_said()}"
            )
        self.lib = lib
        self._decode, self._get_logits = lib.llama_decode, lib.llama_get_logits  # hot path
        self.weights = weights  # keeps the model alive as long as this context
        self.handle = handle
        self.memory = lib.llama_get_memory(handle)
        self.num_seqs = num_seqs
        self.per_seq = per_seq
        self.threads = threads
        # The batch's arrays (numpy owns them; the struct points into them).
        self.tokens = np.zeros(MAX_PIECE, dtype=np.int32)
        self.positions = np.zeros(MAX_PIECE, dtype=np.int32)
        self.seq_ids = np.zeros(MAX_PIECE, dtype=np.int32)  # one sequence id per token
        self.outputs = np.ones(MAX_PIECE, dtype=np.int8)  # every token's logits
        self.num_seq_ids = np.ones(MAX_PIECE, dtype=np.int32)
        seq_id_p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_ids.ctypes.data
        self.seq_id_ptrs = (seq_id_p * MAX_PIECE)(
            *(ctypes.cast(base + 4 * i, seq_id_p) for i in range(MAX_PIECE))
        )
        self.batch = lib.llama_batch(
            n_tokens=0,
            token=self.tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            embd=None,
            pos=self.positions.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            n_seq_id=self.num_seq_ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self.seq_id_ptrs, ctypes.POINTER(seq_id_p)),
            logits=self.outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self._finalizer = weakref.finalize(self, lib.llama_free, handle)

    def free(self) -> None:
        self._finalizer()

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, False)

    def follow_threads(self, fixed: int | None) -> None:
        threads = fixed or torch.get_num_threads()
        if threads != self.threads:
            self.lib.llama_set_n_threads(self.handle, threads, threads)
            self.threads = threads

    def decode(
        self,
        tokens: np.ndarray,  # [n] int32
        positions: np.ndarray,  # [n] int32
        seq_ids: np.ndarray,  # [n] int32
        logits: Tensor,  # [n, vocab] float32, filled in place
    ) -> None:
        """Run the tokens through the model in pieces of ``MAX_PIECE``, every token's
        logits copied out (llama.cpp overwrites its buffer on the next call)."""
        row_bytes = logits.shape[1] * logits.element_size()
        for start in range(0, tokens.shape[0], MAX_PIECE):
            end = min(start + MAX_PIECE, tokens.shape[0])
            count = end - start
            self.tokens[:count] = tokens[start:end]
            self.positions[:count] = positions[start:end]
            self.seq_ids[:count] = seq_ids[start:end]
            self.batch.n_tokens = count
            _recent_log.clear()
            status = self._decode(self.handle, self.batch)
            if status != 0:
                raise RuntimeError(f"llama_decode failed with status {status}{_llama_said()}")
            # Straight into the (contiguous, fp32) output rows: numpy's ctypes view of the
            # buffer cost more than the copy itself.
            source = self._get_logits(self.handle)
            ctypes.memmove(logits[start].data_ptr(), source, count * row_bytes)


class LlamaCppCache:
    """Sequences ``offset .. offset + batch_size - 1`` of a llama.cpp context (see the module
    docstring). ``rows`` views share the context; their lengths are copies, written back by
    ``spectune.models.rows.row_view``."""

    def __init__(
        self, context: _Context, capacity: int, batch_size: int, *, root: LlamaCppCache | None
    ) -> None:
        self.context = context
        self._capacity = capacity
        self.offset = 0
        self.lengths = [0] * batch_size  # host-side mirror of each sequence's length
        self._root = root  # a view keeps its cache (and so the context's lease) alive

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self._capacity

    def length(self, row: int = 0) -> int:
        return self.lengths[row]

    def truncate(self, length: int, row: int = 0) -> None:
        """Roll sequence ``row`` back to ``length`` tokens: llama.cpp forgets the positions
        at or past it. Never grows a sequence."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate row {row} of length {self.lengths[row]} to {length}")
        if length < self.lengths[row]:
            lib = self.context.lib
            if not lib.llama_memory_seq_rm(self.context.memory, self.offset + row, length, -1):
                raise RuntimeError(f"llama.cpp could not roll sequence {row} back to {length}")
        self.lengths[row] = length

    def reset(self, row: int | None = None) -> None:
        """Empty one sequence (or all)."""
        for r in range(self.batch_size) if row is None else (row,):
            self.truncate(0, r)

    def move_slots(self, row: int, src: Tensor, dst_start: int) -> None:
        raise NotImplementedError(
            "llama.cpp caches cannot compact a token tree's path (tree_masks is False)"
        )

    def rows(self, start: int, stop: int) -> LlamaCppCache:
        """Rows ``[start, stop)`` as a cache sharing this context (see the class docstring)."""
        if not 0 <= start < stop <= self.batch_size:
            raise ValueError(f"rows [{start}, {stop}) outside a batch of {self.batch_size}")
        view = LlamaCppCache(self.context, self._capacity, 0, root=self._root or self)
        view.offset = self.offset + start
        view.lengths = self.lengths[start:stop]
        return view

    def copy_row(self, src: int, dst: int) -> None:
        """Make row ``dst`` hold what row ``src`` holds (the batched engine keeps its active
        sequences in the leading rows)."""
        memory, lib = self.context.memory, self.context.lib
        lib.llama_memory_seq_rm(memory, self.offset + dst, -1, -1)
        lib.llama_memory_seq_cp(memory, self.offset + src, self.offset + dst, -1, -1)
        self.lengths[dst] = self.lengths[src]


class LlamaCppModel:
    """A GGUF model decoding on llama.cpp (see the module docstring).

    ``cfg``: the file's metadata as the native loader reads it
    (``spectune.models.loading.gguf_config``), so both runtimes describe a file alike.
    ``threads``: llama.cpp's threads, or None to follow ``torch.get_num_threads()``.
    ``gpu``: offload every layer (needs a llama-cpp-python built with a GPU backend).
    """

    tree_masks = False  # see the module docstring
    precision = LLAMACPP  # the file's own tensor types, on llama.cpp's kernels

    def __init__(
        self, path: Path, cfg: LlamaConfig, *, threads: int | None = None, gpu: bool = False
    ) -> None:
        lib = load_llama_cpp()
        if gpu and not lib.llama_supports_gpu_offload():
            raise ModelLoadError(
                "--device cuda: this llama-cpp-python build has no GPU backend (rebuild it "
                "with CMAKE_ARGS=-DGGML_CUDA=on) ; use --device cpu"
            )
        self.lib = lib
        self.path = path
        self.threads = threads
        self.weights = _Weights(lib, path, gpu)
        if self.weights.vocab_size != cfg.vocab_size:
            raise ModelLoadError(
                f"{path}: llama.cpp reads {self.weights.vocab_size} tokens, the metadata "
                f"{cfg.vocab_size}"
            )
        self._info = cfg.model_info(name=cfg.name, num_parameters=self.weights.num_parameters)
        self._free: list[_Context] = []

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def device(self) -> torch.device:
        """The decode loop's side: outputs come back on the CPU in any case."""
        return torch.device("cpu")

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> LlamaCppCache:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        capacity = min(capacity or self._info.max_context, self._info.max_context)
        context = self._take_context(batch_size, capacity)
        cache = LlamaCppCache(context, capacity, batch_size, root=None)
        weakref.finalize(cache, self._give_back, context)
        return cache

    def _take_context(self, num_seqs: int, capacity: int) -> _Context:
        for i, context in enumerate(self._free):
            if context.num_seqs == num_seqs and context.per_seq >= capacity:
                del self._free[i]
                context.clear()
                return context
        per_seq = -(-capacity // _CONTEXT_STEP) * _CONTEXT_STEP
        return _Context(self.lib, self.weights, num_seqs, per_seq)

    def _give_back(self, context: _Context) -> None:
        self._free.insert(0, context)
        for stale in self._free[_FREE_CONTEXTS:]:
            stale.free()
        del self._free[_FREE_CONTEXTS:]

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk] int64
        cache: Any,
        *,
        positions: Tensor | None = None,  # [batch, chunk] int64: must be the slot indices
        chunk_mask: Tensor | None = None,  # must be None (no token trees, see tree_masks)
        last_only: bool = False,  # every token's logits are computed all the same
    ) -> ModelOutput:
        if not isinstance(cache, LlamaCppCache) or cache.context.weights is not self.weights:
            raise TypeError("LlamaCppModel decodes against a LlamaCppCache it created")
        if chunk_mask is not None:
            raise NotImplementedError("llama.cpp takes no tree attention mask (tree_masks)")
        rows, chunk = tokens.shape
        if rows != cache.batch_size:
            raise ValueError(f"{rows} rows of tokens for a cache of {cache.batch_size}")
        starts = np.asarray(cache.lengths, dtype=np.int32)  # [rows]
        if int(starts.max()) + chunk > cache.capacity:
            raise PromptError(f"sequence would exceed the context of {cache.capacity} tokens")
        slots = starts[:, None] + np.arange(chunk, dtype=np.int32)[None, :]  # [rows, chunk]
        if positions is not None and not np.array_equal(positions.numpy(), slots):
            raise NotImplementedError("llama.cpp places a chunk right after its cached tokens")
        seq_ids = np.repeat(np.arange(rows, dtype=np.int32) + cache.offset, chunk)  # [rows*chunk]
        context = cache.context
        context.follow_threads(self.threads)
        logits = torch.empty(rows * chunk, self._info.vocab_size)  # [rows * chunk, vocab]
        flat = tokens.reshape(-1).numpy().astype(np.int32)  # [rows * chunk]
        try:
            context.decode(flat, slots.reshape(-1), seq_ids, logits)
        except BaseException:
            # Pieces already decoded stay in llama.cpp's memory: forget them, so every
            # sequence again holds exactly its mirrored length.
            for row, start in enumerate(cache.lengths):
                self.lib.llama_memory_seq_rm(context.memory, cache.offset + row, start, -1)
            raise
        cache.lengths = [n + chunk for n in cache.lengths]
        logits = logits.view(rows, chunk, -1)
        return ModelOutput(logits=logits[:, -1:] if last_only else logits, hidden=None)


def refuse_feature_head(target: object) -> None:
    """Raise ``IncompatibleModelsError`` when ``target`` runs on llama.cpp (a feature head
    cannot read its hidden states)."""
    if isinstance(target, LlamaCppModel):
        raise IncompatibleModelsError(FEATURE_HEAD_REFUSAL)
