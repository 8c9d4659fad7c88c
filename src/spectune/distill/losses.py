"""Distillation losses: match the target's next-token distribution, not just its argmax.

The corpus stores the target's top-k probabilities per position (``spectune.distill.data``).
Restricted to the draft's vocabulary and renormalised they form ``soft_labels`` p~; the loss
is KL(p~ || q_draft) = sum_j p~_j (log p~_j - log q_j), which differs from the full KL only
by the target mass outside the top-k (small: top-32 holds most of it) and outside a reduced
vocabulary (a mass no draft over that vocabulary can cover).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SoftLabels", "feature_regression", "kl_to_target", "soft_labels"]


@dataclass(frozen=True)
class SoftLabels:
    columns: Tensor  # [n, k] int64 column in the draft's output layer (0 where dropped)
    probs: Tensor  # [n, k] fp32 renormalised target probabilities (0 where dropped)
    target_top1: Tensor  # [n] int64 column of the target's argmax, -1 if outside the subset


def soft_labels(
    topk_ids: Tensor,  # [n, k] target token ids, most likely first
    topk_probs: Tensor,  # [n, k]
    column_of: Tensor,  # [vocab] int64 draft column of each token id, -1 if not draftable
) -> SoftLabels:
    columns = column_of[topk_ids.long()]  # [n, k]
    keep = columns >= 0
    probs = topk_probs.float() * keep
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
    return SoftLabels(columns.clamp_min(0), probs, columns[:, 0])


def kl_to_target(draft_logits: Tensor, labels: SoftLabels) -> Tensor:
    """Mean KL(p~ || q) over positions. draft_logits: [n, num_draft_tokens]."""
    log_q = F.log_softmax(draft_logits.float(), dim=-1).gather(-1, labels.columns)  # [n, k]
    p = labels.probs
    kl = (p * (torch.log(p.clamp_min(1e-9)) - log_q)).sum(-1)  # [n]
    return kl.mean()


def feature_regression(predicted: Tensor, target: Tensor) -> Tensor:
    """Smooth-L1 between the head's features and the target's (EAGLE's regression term)."""
    return F.smooth_l1_loss(predicted.float(), target.float())
