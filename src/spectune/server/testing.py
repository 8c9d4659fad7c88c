"""Test doubles for the server, shipped so users can test their clients against it: a tiny
word-level tokenizer with a chat template (matches ``spectune.models.toy``'s vocabulary),
a toy service, and a real uvicorn server on a free loopback port, run in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import FastAPI

from spectune.control.base import FixedK
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer, load_tokenizer
from spectune.server.engines import DraftSource, EngineSettings, build_engine, scoped_history
from spectune.server.limits import ApiKeys, Limits
from spectune.server.service import ServedModel, Service

__all__ = ["running_server", "toy_service", "toy_tokenizer"]

SPECIAL = ("<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def toy_tokenizer(
    folder: Path, vocab_size: int = 64, *, chat_template: str | None = CHAT_TEMPLATE
) -> Tokenizer:
    """A word-level tokenizer of ``vocab_size`` ids saved in ``folder``: the specials
    (pad 0, BOS 1, EOS 2 as in ``toy_config``), the chat roles, then words ``w0``, ``w1``...
    ``chat_template``: its template (None: none, as a base model ships)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIAL, "system", "user", "assistant"]
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    raw = RawTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens(list(SPECIAL))
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=raw,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = chat_template
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return load_tokenizer(folder)


def toy_service(
    target: LlamaLM,
    tokenizer: Tokenizer,
    *,
    draft: DraftSource | None = None,
    engine: EngineSettings | None = None,
    limits: Limits | None = None,
    api_key: str | None = None,
    keys: ApiKeys | None = None,
    history_scope: str = "none",
    history_tokens: int = 4096,
    spec_usage: bool = True,
    default_k: int = 4,
) -> Service:
    """A service serving ``target`` as model ``toy`` (fixed K ``default_k`` with a draft).

    ``api_key``: one key (tenant ``default``); ``keys``: several. ``history_scope``: whose
    earlier outputs a suffix or hybrid ``draft.drafter`` drafts from (``serve
    --suffix-history-scope``), ``history_tokens`` of them in all.
    """
    draft, drafters = scoped_history(draft or DraftSource(), history_scope, history_tokens)
    speculate = draft.name is not None
    built, policies, context = build_engine(
        target,
        draft,
        engine or EngineSettings(max_batch=16, capacity=target.info.max_context),
        lambda params: FixedK(default_k if speculate else 0),
    )
    served = ServedModel("toy", target, tokenizer, drafter=draft.name)
    if api_key is not None:
        keys = ApiKeys.single(api_key)
    return Service(
        served,
        built,
        limits=limits,
        keys=keys,
        context_limit=context,
        policies=policies,
        drafters=drafters,
        spec_usage=spec_usage,
    )


@contextmanager
def running_server(app: FastAPI, host: str = "127.0.0.1", timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port of ``host``; yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
