"""The soak test's clients (``spectune.server.soak``): one request of a given kind, sent
with httpx, and its outcome (answered, disconnected on purpose, or an error kind)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["Job", "send"]


@dataclass(frozen=True)
class Job:
    """One request's kind: endpoint, prompt, streaming, greedy or sampled, abandoned or not."""

    chat: bool
    prompt: int
    stream: bool
    greedy: bool
    disconnect: bool
    seed: int


def _body(job: Job, prompts: Sequence[str], max_tokens: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": "toy", "max_tokens": max_tokens, "stream": job.stream}
    if job.greedy:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, top_p=0.95, seed=job.seed)
    if job.chat:
        body["messages"] = [{"role": "user", "content": prompts[job.prompt]}]
        return "/v1/chat/completions", body
    body["prompt"] = prompts[job.prompt]
    return "/v1/completions", body


def _text(reply: dict[str, Any], chat: bool) -> str:
    choice = reply["choices"][0]
    return str(choice["message"]["content"] if chat else choice["text"])


def send(
    url: str, job: Job, prompts: Sequence[str], max_tokens: int, rng: random.Random
) -> tuple[str, str | None]:
    """(outcome, text): outcome is ``answered``, ``disconnected`` or an error kind."""
    path, body = _body(job, prompts, max_tokens)
    timeout = rng.uniform(0.05, 0.4) if job.disconnect and not job.stream else 120.0
    try:
        with httpx.Client(base_url=url, timeout=timeout) as client:
            if not job.stream:
                reply = client.post(path, json=body)
                if reply.status_code != 200:
                    return f"http {reply.status_code} {reply.json()['error'].get('code')}", None
                return "answered", _text(reply.json(), job.chat)
            return _read_stream(client, path, body, job, rng)
    except httpx.ReadTimeout:
        return ("disconnected", None) if job.disconnect else ("timeout", None)
    except httpx.HTTPError as exc:
        return f"transport {type(exc).__name__}", None


def _read_stream(
    client: httpx.Client, path: str, body: dict[str, Any], job: Job, rng: random.Random
) -> tuple[str, str | None]:
    leave_after = rng.randint(1, 3) if job.disconnect else None
    parts: list[str] = []
    with client.stream("POST", path, json=body) as reply:
        if reply.status_code != 200:
            reply.read()
            return f"http {reply.status_code} {reply.json()['error'].get('code')}", None
        events = 0
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                return "answered", "".join(parts)
            event = json.loads(data)
            if "error" in event:
                return f"stream error {event['error']['message'][:60]}", None
            for choice in event["choices"]:
                parts.append(choice["delta"].get("content", "") if job.chat else choice["text"])
            events += 1
            if leave_after is not None and events >= leave_after:
                return "disconnected", None  # leaving the block closes the connection
    return "stream cut", None
