"""What the live vLLM tests share: their marks (slow; skipped, naming ``make vllm``, where
vLLM's virtualenv is missing) and a greedy chat completion against a served model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from spectune.engines.vllm.setup import vllm_missing

LIVE = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing())),
]

Test = TypeVar("Test", bound=Callable[..., Any])


def live(test: Test) -> Test:
    """``LIVE`` on one test."""
    for mark in LIVE:
        test = mark(test)
    return test


def chat(url: str, model: Path, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """One greedy chat completion of ``prompt`` (``extra``: more body fields)."""
    body = {
        "model": str(model),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer
