"""llama.cpp's own decoding as anchor rows of the ``llamacpp`` benchmark run.

spectune's plain and speculative systems on the llama.cpp backend share the kernels with
these anchors; the anchors decode through ``llama-cpp-python``'s high-level ``Llama`` class
instead of spectune's engine:

- ``llama.cpp plain``: ``Llama.generate`` without a draft.
- ``llama.cpp prompt lookup K=k``: ``Llama.generate`` with ``LlamaPromptLookupDecoding``
  (n-grams of up to 2 tokens, ``k`` draft tokens), llama-cpp-python's prompt-lookup
  speculation, verified by its own loop; one per fixed K of the run, beside spectune's
  ``ngram K=k`` rows.

Counts: ``Llama.eval`` runs once per target pass (prefill included), so ``target_calls``
counts its calls, and tokens per call is the mean accepted length, as for transformers'
systems. Draft tokens and acceptance are not observable from outside (``None``). Each call
starts from an empty cache (``Llama.reset``): no prefix is reused between prompts, as
spectune's engine reuses none. At temperature > 0 llama.cpp samples with its own sampler
seeded with the call's seed (not spectune's generator: the same distribution, other
numbers).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spectune.bench.systems import CallResult, System, SystemInfo
from spectune.models.llamacpp import load_llama_cpp
from spectune.sampling import SamplingParams

__all__ = ["LlamaCppPythonSystem", "llama_cpp_python_systems"]

LOOKUP_NGRAM = 2  # LlamaPromptLookupDecoding's default n-gram size


class LlamaCppPythonSystem:
    """One ``llama_cpp.Llama`` over the GGUF (see the module docstring); ``lookup_tokens``:
    prompt-lookup draft length, or None for plain decoding."""

    def __init__(
        self,
        info: SystemInfo,
        path: Path,
        *,
        eos_token_ids: Sequence[int],
        context: int,
        lookup_tokens: int | None = None,
    ) -> None:
        load_llama_cpp()  # the one-line error when the extra is missing, and quiet logs
        llama_cpp = importlib.import_module("llama_cpp")
        speculative = importlib.import_module("llama_cpp.llama_speculative")
        draft = (
            None
            if lookup_tokens is None
            else speculative.LlamaPromptLookupDecoding(
                max_ngram_size=LOOKUP_NGRAM, num_pred_tokens=lookup_tokens
            )
        )
        threads = torch.get_num_threads()
        self.info = info
        self.eos = set(eos_token_ids)
        self.llm: Any = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=context,
            n_threads=threads,
            n_threads_batch=threads,
            draft_model=draft,
            verbose=False,
        )
        self.calls = 0
        inner_eval = self.llm.eval

        def counted_eval(tokens: Sequence[int]) -> None:
            self.calls += 1
            inner_eval(tokens)

        self.llm.eval = counted_eval

    def run(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> CallResult:
        llm = self.llm
        llm.reset()
        llm.set_seed(seed)
        self.calls = 0
        tokens: list[int] = []
        start = time.perf_counter()
        if params.max_tokens > 0:
            for token in llm.generate(
                list(prompt),
                temp=params.temperature,
                top_k=params.top_k,  # 0: llama.cpp's "off", as spectune's
                top_p=params.top_p,
                min_p=0.0,
                repeat_penalty=1.0,
                reset=True,
            ):
                tokens.append(int(token))
                if token in self.eos or len(tokens) >= params.max_tokens:
                    break
        seconds = time.perf_counter() - start
        return CallResult(
            tokens=tuple(tokens),
            seconds=seconds,
            target_calls=max(1, self.calls),
            drafted=None,
            accepted=(
                None if self.info.family == "llamacpp-plain" else max(0, len(tokens) - self.calls)
            ),
            draft_seconds=None,
        )


def llama_cpp_python_systems(
    path: Path, eos_token_ids: Sequence[int], context: int, ks: Sequence[int]
) -> list[System]:
    """llama.cpp plain decoding, and prompt lookup with each of ``ks`` draft tokens."""
    plain = SystemInfo("llama.cpp plain", "llamacpp-plain")
    systems: list[System] = [
        LlamaCppPythonSystem(plain, path, eos_token_ids=eos_token_ids, context=context)
    ]
    for k in ks:
        info = SystemInfo(
            f"llama.cpp prompt lookup K={k}", "llamacpp-lookup", "prompt-lookup", k, "fixed"
        )
        systems.append(
            LlamaCppPythonSystem(
                info, path, eos_token_ids=eos_token_ids, context=context, lookup_tokens=k
            )
        )
    return systems
