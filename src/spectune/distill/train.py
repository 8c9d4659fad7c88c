"""The training loop: AdamW, warmup + cosine learning rate, a budget, held-out checks.

The budget is whichever comes first of steps, training tokens and wall minutes; the
learning-rate schedule follows the fraction of the budget spent, so a wall-clock budget
gets a complete cosine decay too. Every ``eval_every`` steps the draft is scored on the
held-out sequences (KL and teacher-forced top-1 agreement, i.e. the greedy acceptance
of a first draft token), a point is added to the learning curve, and a checkpoint is
written; ``resume`` continues from it.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from spectune.distill.checkpoint import CurvePoint, TrainState, load_checkpoint, save_checkpoint
from spectune.distill.data import DistillCorpus, compute_precision
from spectune.distill.losses import SoftLabels, feature_regression, kl_to_target, soft_labels
from spectune.distill.models import TrainableDraft, TrainBatch
from spectune.errors import InvalidParameterError
from spectune.sampling import MAX_SEED

__all__ = [
    "Budget",
    "CurvePoint",
    "TrainSettings",
    "TrainState",
    "evaluate",
    "iterate_batches",
    "train",
]


@dataclass(frozen=True)
class Budget:
    max_steps: int | None = None
    max_tokens: int | None = None  # training positions seen
    max_minutes: float | None = None

    def __post_init__(self) -> None:
        if self.max_steps is None and self.max_tokens is None and self.max_minutes is None:
            raise InvalidParameterError("a training budget needs steps, tokens or minutes")
        for value in (self.max_steps, self.max_tokens, self.max_minutes):
            if value is not None and not 0 <= value < math.inf:
                raise InvalidParameterError("budget limits must be finite and >= 0")

    def fraction(self, step: int, tokens: int, seconds: float) -> float:
        """How much of the budget is spent (>= 1: done). A zero limit is spent at once."""
        parts = [0.0]
        for used, limit in (
            (step, self.max_steps),
            (tokens, self.max_tokens),
            (seconds, None if self.max_minutes is None else 60 * self.max_minutes),
        ):
            if limit is not None:
                parts.append(used / limit if limit > 0 else 1.0)
        return max(parts)


@dataclass(frozen=True)
class TrainSettings:
    learning_rate: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    batch_tokens: int = 2048  # padded positions per batch
    max_length: int = 512
    regression_weight: float = 1.0  # feature drafts only
    eval_every: int = 100
    seed: int = 0
    precision: str = "fp32"  # or bf16: autocast forward and backward, fp32 weights and optimizer

    def __post_init__(self) -> None:
        compute_precision(self.precision)  # checks the name
        if not 0 < self.learning_rate < math.inf:
            raise InvalidParameterError(f"learning rate must be > 0, got {self.learning_rate}")
        for name in ("batch_tokens", "max_length", "eval_every"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise InvalidParameterError(f"seed must be in [0, 2**63 - 1], got {self.seed}")


def _collate(sequences: list[dict[str, Tensor]], max_length: int) -> TrainBatch:
    length = min(max_length, max(int(s["tokens"].shape[0]) for s in sequences))
    batch = len(sequences)
    sample = sequences[0]
    device = sample["tokens"].device  # batches are cut where the corpus lives
    tokens = torch.zeros(batch, length, dtype=torch.long, device=device)
    hidden = torch.zeros(batch, length, sample["hidden"].shape[1], device=device)
    ids = torch.zeros(batch, length, sample["topk_ids"].shape[1], dtype=torch.long, device=device)
    probs = torch.zeros(batch, length, sample["topk_probs"].shape[1], device=device)
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    for b, s in enumerate(sequences):
        n = min(length, int(s["tokens"].shape[0]))
        tokens[b, :n] = s["tokens"][:n].long()
        hidden[b, :n] = s["hidden"][:n].float()
        ids[b, :n] = s["topk_ids"][:n].long()
        probs[b, :n] = s["topk_probs"][:n].float()
        mask[b, :n] = s["loss_mask"][:n].bool()
    return TrainBatch(tokens, hidden, ids, probs, mask)


def iterate_batches(
    corpus: DistillCorpus, settings: TrainSettings, rng: random.Random | None
) -> Iterator[TrainBatch]:
    """Length-bucketed batches of about ``batch_tokens`` padded positions; shuffled (one
    epoch) when ``rng`` is given, in order otherwise."""
    order = sorted(range(len(corpus)), key=lambda i: int(corpus.sequences[i]["tokens"].shape[0]))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        length = min(settings.max_length, int(corpus.sequences[i]["tokens"].shape[0]))
        if current and length * (len(current) + 1) > settings.batch_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    if rng is not None:
        rng.shuffle(groups)
    for group in groups:
        yield _collate([corpus.sequences[i] for i in group], settings.max_length)


@dataclass(frozen=True)
class _BatchLoss:
    loss: Tensor  # what is minimised: KL (every draft position) + feature regression
    kl: float  # mean KL of the first draft position
    agree: list[tuple[int, int]]  # per draft position: (target argmax matched, positions)


def _losses(
    draft: TrainableDraft, batch: TrainBatch, column_of: Tensor, settings: TrainSettings
) -> _BatchLoss:
    """The losses of one batch. Positions of every unrolled draft step count equally in
    the loss; the reported KL and the counters are kept per draft position."""
    with compute_precision(settings.precision, batch.tokens.device):
        out = draft.train_forward(batch)
    rows, cols = out.position_index
    labels = soft_labels(batch.topk_ids[rows, cols], batch.topk_probs[rows, cols], column_of)
    loss = kl_to_target(out.logits, labels)
    if out.predicted is not None and out.target_features is not None:
        loss = loss + settings.regression_weight * feature_regression(
            out.predicted, out.target_features
        )
    step = out.draft_position if out.draft_position is not None else torch.zeros_like(rows)
    matched = out.logits.detach().argmax(-1) == labels.target_top1  # [n]
    agree = [
        (int(matched[step == s].sum()), int((step == s).sum()))
        for s in range(int(step.max()) + 1 if step.numel() else 1)
    ]
    first = step == 0
    kl = (
        float(kl_to_target(out.logits.detach()[first], _select(labels, first)))
        if first.any()
        else 0.0
    )
    return _BatchLoss(loss, kl, agree)


def _select(labels: SoftLabels, keep: Tensor) -> SoftLabels:
    return SoftLabels(labels.columns[keep], labels.probs[keep], labels.target_top1[keep])


@torch.no_grad()
def evaluate(
    draft: TrainableDraft, heldout: DistillCorpus, column_of: Tensor, settings: TrainSettings
) -> tuple[float, list[float]]:
    """(KL of the first draft position, top-1 agreement per draft position) over the
    held-out training positions."""
    module = draft.module()
    was_training = module.training
    module.eval()
    kl_sum = 0.0
    matched: list[int] = []
    counts: list[int] = []
    for batch in iterate_batches(heldout, settings, None):
        result = _losses(draft, batch, column_of, settings)
        for position, (hits, n) in enumerate(result.agree):
            if position == len(counts):
                matched.append(0)
                counts.append(0)
            matched[position] += hits
            counts[position] += n
        kl_sum += result.kl * (result.agree[0][1] if result.agree else 0)
    module.train(was_training)
    rates = [m / max(c, 1) for m, c in zip(matched, counts, strict=True)] or [0.0]
    return kl_sum / max(counts[0] if counts else 0, 1), rates


def _lr(settings: TrainSettings, step: int, fraction: float) -> float:
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))
    floor = settings.min_lr_ratio
    return settings.learning_rate * (floor + (1 - floor) * cosine)


def train(
    draft: TrainableDraft,
    corpus: DistillCorpus,
    heldout: DistillCorpus,
    column_of: Tensor,  # [vocab] draft column of each token id, -1 if not draftable
    settings: TrainSettings,
    budget: Budget,
    *,
    checkpoint: Path | None = None,
    on_step: Callable[[TrainState, float, float], None] | None = None,
    on_eval: Callable[[CurvePoint], None] | None = None,
    reload: Callable[[], DistillCorpus] | None = None,
) -> TrainState:
    """Train ``draft`` until the budget is spent; returns the final state with its curve.

    ``on_step(state, loss, tokens_per_second)`` reports progress after every step.
    ``reload``, if given, is asked for the training corpus again at every epoch boundary
    (to train while a generation job is still adding shards to the cache).
    """
    module = draft.module()
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    # Everything lives where the draft trains (a GPU holds the whole corpus), so batches
    # are cut there without host-to-device copies.
    device = params[0].device
    column_of, corpus, heldout = column_of.to(device), corpus.to(device), heldout.to(device)
    optimizer = torch.optim.AdamW(
        params, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    state = TrainState()
    if checkpoint is not None and (checkpoint / "state.json").is_file():
        state = load_checkpoint(checkpoint, module, optimizer)
    rng = random.Random(settings.seed + state.step)  # a resumed run reshuffles differently
    started = time.perf_counter() - state.seconds
    epoch: Iterator[TrainBatch] = iter(())

    def record() -> None:
        kl, agree = evaluate(draft, heldout, column_of, settings)
        point = CurvePoint(
            state.step, state.tokens, state.seconds, last_loss, kl, agree[0], tuple(agree)
        )
        state.curve.append(point)
        if on_eval:
            on_eval(point)
        if checkpoint is not None:
            save_checkpoint(checkpoint, module, optimizer, state)

    last_loss = float("nan")
    if not state.curve:
        record()
    while budget.fraction(state.step, state.tokens, state.seconds) < 1.0:
        batch = next(epoch, None)
        if batch is None:
            if reload is not None and state.step > 0:
                corpus = reload().to(device)
            epoch = iterate_batches(corpus, settings, rng)
            batch = next(epoch)
        step_start = time.perf_counter()
        fraction = budget.fraction(state.step, state.tokens, state.seconds)
        for group in optimizer.param_groups:
            group["lr"] = _lr(settings, state.step, fraction)
        result = _losses(draft, batch, column_of, settings)
        loss = result.loss
        positions = result.agree[0][1] if result.agree else 0
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state.step += 1
        state.tokens += positions
        state.seconds = time.perf_counter() - started
        last_loss = float(loss.detach())
        if on_step:
            on_step(state, last_loss, positions / max(time.perf_counter() - step_start, 1e-9))
        if state.step % settings.eval_every == 0:
            record()
    if not state.curve or state.curve[-1].step != state.step:
        record()
    return state


def curve_json(state: TrainState) -> str:
    return json.dumps([asdict(p) for p in state.curve], indent=1)
