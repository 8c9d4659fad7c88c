"""The self-distillation corpus: what the target says, recorded once and reused.

For each prompt the target continues the chat greedily, in batches on the
native runtime; every position of the resulting sequence is stored with

- ``tokens``      the token id,
- ``hidden``      the target's last hidden state there (what a feature drafter reads),
- ``topk_ids`` / ``topk_probs``  the target's k most likely next tokens and their
                  probabilities (temperature 1): the soft labels of the KL loss,
- ``loss_mask``   1 where the next token was produced by the target (the positions a
                  draft will be asked to guess), 0 inside the prompt.

Plain-text files are teacher-forced instead: the target scores the given text, every
position is a training position. Shards are safetensors files under a cache folder keyed
by the target and the generation settings; a killed run resumes after its last shard.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from spectune.distill.corpus import Answer, read_answer_shard
from spectune.distill.settings import PRECISIONS
from spectune.distill.sources import CorpusItem
from spectune.errors import InvalidParameterError, PromptError
from spectune.models.base import LanguageModel
from spectune.models.llama import LlamaLM
from spectune.models.tokenizer import Tokenizer

__all__ = [
    "DistillCorpus",
    "GenerationSettings",
    "PRECISIONS",
    "build_answer_features",
    "compute_precision",
    "build_corpus",
    "corpus_from_token_ids",
    "features_of_answers",
]


@dataclass(frozen=True)
class _Encoded:
    ids: list[int]
    generate: bool  # continue with the target, or only score the given tokens
    train_from: int  # first position whose next token is a training label


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 160
    max_prompt_tokens: int = 512
    batch_size: int = 16
    top_k: int = 32  # soft labels kept per position
    shard_sequences: int = 64

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_prompt_tokens", "batch_size", "top_k"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")


def _encode(item: CorpusItem, tokenizer: Tokenizer, limit: int) -> _Encoded | None:
    """Token ids, and whether the target continues them (a chat) or only scores them (a
    chat with a reference reply, or plain text)."""
    try:
        if item.messages:
            ids = tokenizer.encode_chat([{"role": r, "content": c} for r, c in item.messages])
            if not item.reply:
                if len(ids) > limit:  # cutting a chat would drop its generation prompt
                    return None
                return _Encoded(ids, True, len(ids) - 1)
            prompt_length = len(ids)
            ids = ids + [int(t) for t in tokenizer.hf.encode(item.reply, add_special_tokens=False)]
            eos = tokenizer.eos_token_id
            if eos is not None:
                ids.append(eos)
            train_from = prompt_length - 1
        else:
            # Corpus text is the operator's training data, tokenized as it always was
            # (special-token text in it is parsed); requests' text never is.
            ids = tokenizer.encode(item.text, allow_special_tokens=True)
            train_from = 0
    except PromptError:
        return None
    ids = ids[:limit]
    if len(ids) < 2 or train_from >= len(ids) - 1:
        return None
    return _Encoded(ids, False, train_from)


def compute_precision(
    precision: str, device: torch.device | None = None
) -> contextlib.AbstractContextManager[object]:
    """The context distillation computes in on ``device`` (default the CPU): fp32 as is,
    or bf16 autocast (weights stay fp32; matmuls run on the CPU's bf16 units, AMX /
    AVX-512 BF16 where it has them, or a GPU's tensor cores)."""
    if precision not in PRECISIONS:
        raise InvalidParameterError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast("cpu" if device is None else device.type, dtype=torch.bfloat16)


def _topk(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """logits: [n, vocab] -> (ids [n, k] int32, probs [n, k] fp16) of softmax at T = 1."""
    probs = torch.softmax(logits.float(), dim=-1)
    values, ids = probs.topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


@torch.inference_mode()
def _run_batch(
    target: LanguageModel,
    batch: list[_Encoded],
    settings: GenerationSettings,
    pad_id: int,
) -> list[dict[str, Tensor]]:
    """Prefill a batch of prompts (right-padded, then each row truncated to its length) and
    continue every chat row greedily for up to ``max_new_tokens`` tokens."""
    eos = set(target.info.eos_token_ids)
    lengths = [len(e.ids) for e in batch]
    width = max(lengths)
    new_tokens = settings.max_new_tokens if any(e.generate for e in batch) else 0
    cache = target.new_cache(len(batch), capacity=width + new_tokens + 1)
    rows: list[dict[str, list[Tensor]]] = [{"hidden": [], "ids": [], "probs": []} for _ in batch]
    next_tokens: list[int] = []
    # Prefill in groups of four rows: full-vocabulary logits over long prompts are large.
    padded = torch.tensor([e.ids + [pad_id] * (width - len(e.ids)) for e in batch])
    for start in range(0, len(batch), 4):
        group = padded[start : start + 4]
        sub = target.new_cache(group.shape[0], capacity=width)
        out = target.forward(group, sub)
        assert out.hidden is not None, "distillation needs a target that exposes hidden states"
        for r in range(group.shape[0]):
            b = start + r
            n = lengths[b]
            ids, probs = _topk(out.logits[r, :n], settings.top_k)
            rows[b]["hidden"].append(out.hidden[r, :n].to(torch.float16))
            rows[b]["ids"].append(ids)
            rows[b]["probs"].append(probs)
            next_tokens.append(int(out.logits[r, n - 1].argmax()))
        # Copy the group's keys and values into the batch cache.
        src_keys = getattr(sub, "keys", None)
        dst_keys = getattr(cache, "keys", None)
        if src_keys is None or dst_keys is None:
            raise InvalidParameterError("batched corpus generation needs the native runtime")
        for layer in range(len(dst_keys)):
            cache.keys[layer][start : start + 4, :, :width] = sub.keys[layer]  # type: ignore[attr-defined]
            cache.values[layer][start : start + 4, :, :width] = sub.values[layer]  # type: ignore[attr-defined]
    for b, n in enumerate(lengths):
        cache.lengths[b] = n  # type: ignore[attr-defined]

    generated: list[list[int]] = [[] for _ in batch]
    active = [e.generate for e in batch]
    for _ in range(new_tokens):
        if not any(active):
            break
        for b in range(len(batch)):
            if active[b]:
                generated[b].append(next_tokens[b])
                if next_tokens[b] in eos or len(generated[b]) >= new_tokens:
                    active[b] = False
        if not any(active):
            break
        feed = torch.tensor(
            [[generated[b][-1] if generated[b] else pad_id] for b in range(len(batch))]
        )
        out = target.forward(feed, cache)
        assert out.hidden is not None
        ids, probs = _topk(out.logits[:, 0], settings.top_k)  # [batch, k]
        for b in range(len(batch)):
            if active[b]:
                rows[b]["hidden"].append(out.hidden[b, :1].to(torch.float16))
                rows[b]["ids"].append(ids[b : b + 1])
                rows[b]["probs"].append(probs[b : b + 1])
                next_tokens[b] = int(out.logits[b, 0].argmax())
            else:
                next_tokens[b] = pad_id

    records: list[dict[str, Tensor]] = []
    for b, entry in enumerate(batch):
        tokens = entry.ids + generated[b]
        hidden = torch.cat(rows[b]["hidden"])  # [n_scored, hidden]
        top_ids = torch.cat(rows[b]["ids"])
        top_probs = torch.cat(rows[b]["probs"])
        # The last generated token was never fed: it has no prediction of its own.
        scored = hidden.shape[0]
        pad_rows = len(tokens) - scored
        if pad_rows > 0:
            hidden = torch.cat((hidden, hidden.new_zeros(pad_rows, hidden.shape[1])))
            top_ids = torch.cat((top_ids, top_ids.new_zeros(pad_rows, top_ids.shape[1])))
            top_probs = torch.cat((top_probs, top_probs.new_zeros(pad_rows, top_probs.shape[1])))
        mask = torch.zeros(len(tokens), dtype=torch.uint8)
        # Position i predicts token i + 1: train where that token is the target's own
        # (generated) or the given reply / text.
        mask[entry.train_from : scored if entry.generate else len(tokens) - 1] = 1
        records.append(
            {
                "tokens": torch.tensor(tokens, dtype=torch.int32),
                "hidden": hidden,
                "topk_ids": top_ids,
                "topk_probs": top_probs,
                "loss_mask": mask,
            }
        )
    return records


class DistillCorpus:
    """The cached corpus: sequences of token ids, target hidden states and soft labels."""

    def __init__(self, sequences: list[dict[str, Tensor]]) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def to(self, device: torch.device) -> DistillCorpus:
        """The same sequences with their tensors on ``device``."""
        return DistillCorpus([{k: v.to(device) for k, v in s.items()} for s in self.sequences])

    @property
    def num_tokens(self) -> int:
        return sum(int(s["tokens"].shape[0]) for s in self.sequences)

    @property
    def num_training_positions(self) -> int:
        return sum(int(s["loss_mask"].sum()) for s in self.sequences)

    def token_counts(self, vocab_size: int) -> Tensor:
        """How often each id occurs in the corpus: [vocab] int64 (for a reduced vocabulary)."""
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for s in self.sequences:
            counts += torch.bincount(s["tokens"].long(), minlength=vocab_size)[:vocab_size]
        return counts

    def split(self, holdout: int) -> tuple[DistillCorpus, DistillCorpus]:
        """(train, held-out): the first ``holdout`` sequences are held out, so the held-out
        set stays the same while a cached corpus grows (at most a fifth of the corpus)."""
        holdout = min(holdout, len(self.sequences) // 5)
        return DistillCorpus(self.sequences[holdout:]), DistillCorpus(self.sequences[:holdout])

    @classmethod
    def load(cls, folder: Path) -> DistillCorpus:
        from safetensors.torch import load_file

        sequences: list[dict[str, Tensor]] = []
        for shard in sorted(folder.glob("shard-*.safetensors")):
            flat = load_file(str(shard))
            offsets = flat["offsets"].tolist()
            for i in range(len(offsets) - 1):
                lo, hi = offsets[i], offsets[i + 1]
                sequences.append({k: v[lo:hi] for k, v in flat.items() if k != "offsets"})
        return cls(sequences)


def _save_shard(path: Path, records: list[dict[str, Tensor]]) -> None:
    from safetensors.torch import save_file

    lengths = [int(r["tokens"].shape[0]) for r in records]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)
    flat = {k: torch.cat([r[k] for r in records]).contiguous() for k in records[0]}
    flat["offsets"] = offsets
    tmp = path.with_suffix(".tmp")
    save_file(flat, str(tmp))
    tmp.rename(path)  # a shard exists completely or not at all


def corpus_key(target_path: Path, items: Sequence[CorpusItem], settings: GenerationSettings) -> str:
    digest = hashlib.sha256()
    digest.update(str(target_path.resolve()).encode())
    digest.update(json.dumps(settings.__dict__, sort_keys=True).encode())
    for item in items:
        digest.update(item.cache_key().encode())
    return digest.hexdigest()[:16]


def _batches(encoded: list[_Encoded], batch_size: int) -> Iterator[list[_Encoded]]:
    for start in range(0, len(encoded), batch_size):
        yield encoded[start : start + batch_size]


def build_corpus(
    target: LanguageModel,
    tokenizer: Tokenizer,
    items: Sequence[CorpusItem],
    folder: Path,
    settings: GenerationSettings,
    *,
    limit: int | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> DistillCorpus:
    """Generate (or resume generating) the corpus into ``folder`` and load it.

    ``on_progress(done_sequences, total_sequences, new_tokens)`` is called after each batch.
    Items are processed in the given order (shuffle beforehand for a mixed corpus); each
    shard holds ``shard_sequences`` consecutive items, so resuming skips whole shards.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pad_id = target.info.pad_token_id if target.info.pad_token_id is not None else 0
    encoded = [e for e in (_encode(i, tokenizer, settings.max_prompt_tokens) for i in items) if e]
    per_shard = settings.shard_sequences
    total = len(encoded) if limit is None else min(limit, len(encoded))
    for shard_index, start in enumerate(range(0, total, per_shard)):
        path = folder / f"shard-{shard_index:05d}.safetensors"
        chunk = encoded[start : min(start + per_shard, total)]
        if path.exists():
            if on_progress:
                on_progress(start + len(chunk), total, 0)
            continue
        # Group by length inside the shard so padding and finished rows waste little.
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i].ids))
        results: dict[int, dict[str, Tensor]] = {}
        done = start
        for batch_idx in _batches([chunk[i] for i in order], settings.batch_size):
            offset = len(results)
            for j, record in enumerate(_run_batch(target, batch_idx, settings, pad_id)):
                results[order[offset + j]] = record
            done += len(batch_idx)
            if on_progress:
                new = sum(int(r["loss_mask"].sum()) for r in list(results.values())[offset:])
                on_progress(done, total, new)
        _save_shard(path, [results[i] for i in range(len(chunk))])
    return DistillCorpus.load(folder)


def corpus_from_token_ids(
    target: LanguageModel,
    prompts: Sequence[Sequence[int]],
    settings: GenerationSettings,
) -> DistillCorpus:
    """An in-memory corpus of the target's continuations of tokenized prompts (no cache;
    for tests and for targets without a tokenizer)."""
    pad_id = target.info.pad_token_id if target.info.pad_token_id is not None else 0
    encoded = [_Encoded(list(p), True, len(p) - 1) for p in prompts]
    records: list[dict[str, Tensor]] = []
    for batch in _batches(encoded, settings.batch_size):
        records.extend(_run_batch(target, batch, settings, pad_id))
    return DistillCorpus(records)


@torch.inference_mode()
def features_of_answers(
    model: LlamaLM,
    answers: Sequence[Answer],
    *,
    layers: tuple[int, ...] = (),
    top_k: int = 32,
    prompt_context: int = 128,
    batch_tokens: int = 4096,
    precision: str = "fp32",
) -> list[dict[str, Tensor]]:
    """Training records of target answers: one teacher-forced pass over prompt + answer.

    ``hidden`` holds the target states a head reads (the concatenated ``layers``, or the
    last state), ``topk_*`` the soft labels, ``loss_mask`` the positions whose next token
    is the target's answer. Only the last ``prompt_context`` prompt positions are kept
    (the head attends over them; the states were computed with the whole prompt).
    ``precision`` bf16 runs the pass under bf16 autocast (soft labels and states then
    carry bf16 rounding; the states are stored in fp16 either way).
    """
    device = model.device
    autocast = compute_precision(precision, device)
    order = sorted(
        range(len(answers)), key=lambda i: len(answers[i].prompt) + len(answers[i].answer)
    )
    records: dict[int, dict[str, Tensor]] = {}
    start = 0
    while start < len(order):
        longest = len(answers[order[start]].prompt) + len(answers[order[start]].answer)
        group = [order[start]]
        while start + len(group) < len(order):
            nxt = order[start + len(group)]
            length = len(answers[nxt].prompt) + len(answers[nxt].answer)
            if length * (len(group) + 1) > batch_tokens:
                break
            group.append(nxt)
            longest = length
        start += len(group)
        sequences = [list(answers[i].prompt) + list(answers[i].answer) for i in group]
        tokens = torch.zeros(len(group), longest, dtype=torch.long)  # right-padded
        for row, seq in enumerate(sequences):
            tokens[row, : len(seq)] = torch.tensor(seq)
        tokens = tokens.to(device)
        positions = torch.arange(longest, device=device).expand_as(tokens)
        with autocast:
            logits, states = model.net(tokens, positions, capture=layers)  # causal, no cache
        for row, index in enumerate(group):
            answer = answers[index]
            n = len(sequences[row])
            first = max(0, len(answer.prompt) - prompt_context)
            ids, probs = _topk(logits[row, first:n], top_k)
            mask = torch.zeros(n - first, dtype=torch.uint8)
            mask[len(answer.prompt) - 1 - first : n - 1 - first] = 1  # predicts an answer token
            records[index] = {
                "tokens": torch.tensor(sequences[row][first:], dtype=torch.int32),
                "hidden": states[row, first:n].to("cpu", torch.float16),
                "topk_ids": ids.cpu(),
                "topk_probs": probs.cpu(),
                "loss_mask": mask,
            }
    return [records[i] for i in range(len(answers))]


def build_answer_features(
    model: LlamaLM,
    answers_folder: Path,
    out: Path,
    *,
    layers: tuple[int, ...] = (),
    top_k: int = 32,
    prompt_context: int = 128,
    max_shards: int | None = None,
    precision: str = "fp32",
    on_shard: Callable[[int, int], None] | None = None,
) -> tuple[DistillCorpus, DistillCorpus]:
    """(train, held-out) corpora of the answer corpus in ``answers_folder``: one feature
    shard per answer shard under ``out/train`` and ``out/heldout`` (resumable: a shard is
    written whole or not at all, and ``out/done`` marks a finished answer shard). Answers
    are deduplicated by prompt across shards; held out are those the corpus holds out."""
    shards = sorted(answers_folder.glob("shard-*.safetensors"))[:max_shards]
    if not shards:
        raise InvalidParameterError(f"no answer shards in {answers_folder}")
    for sub in ("train", "heldout", "done"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    seen: set[tuple[int, ...]] = set()
    for done, shard in enumerate(shards, 1):
        answers = [a for a in read_answer_shard(shard) if a.prompt not in seen]
        seen.update(a.prompt for a in answers)
        marker = out / "done" / shard.name
        if marker.exists():
            continue
        for split in ("train", "heldout"):
            chosen = [a for a in answers if a.split == split]
            if chosen:
                records = features_of_answers(
                    model,
                    chosen,
                    layers=layers,
                    top_k=top_k,
                    prompt_context=prompt_context,
                    precision=precision,
                )
                _save_shard(out / split / shard.name, records)
        marker.touch()
        if on_shard is not None:
            on_shard(done, len(shards))
    return DistillCorpus.load(out / "train"), DistillCorpus.load(out / "heldout")
