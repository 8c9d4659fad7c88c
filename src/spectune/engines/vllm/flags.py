"""A tuned setup as vLLM's ``--speculative-config``, or the line that refuses it.

Keys as of vLLM's ``SpeculativeConfig`` (the 0.32 CPU build ``engines.vllm.setup`` installs):
``draft_model`` for a standalone draft model, ``ngram`` for prompt lookup, ``suffix`` for
suffix drafting (Arctic Inference). A feature head of the EAGLE-3 layout is served as
``eagle3`` once ``spectune convert --draft`` has written it in vLLM's format; it is not
written here (``DRAFT_REFUSALS``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from spectune.engines.drafts import FEATURE_HEAD, HYBRID, LM_GGUF, USE_LM_DRAFT, DraftKind
from spectune.engines.plan import ExportPlan, prepare
from spectune.engines.tuned import Tuning

__all__ = ["DRAFT_REFUSALS", "to_vllm"]

# The draft kinds vLLM cannot load as ``export`` writes them: why, and what instead.
DRAFT_REFUSALS: dict[DraftKind, str] = {
    "feature-head": FEATURE_HEAD + ", so vLLM's draft_model method cannot load it: a head "
    "of the EAGLE-3 layout (spectune distill --layout eagle3) goes to vLLM's eagle3 method "
    "through spectune convert --draft; else use --draft suffix or --draft ngram (vLLM's own "
    f"methods) or {USE_LM_DRAFT}",
    "hybrid": HYBRID + ": use --draft suffix (vLLM's suffix method)",
    "lm-gguf": LM_GGUF,
}


def to_vllm(tuning: Tuning) -> ExportPlan:
    """``vllm serve TARGET --speculative-config JSON``: ``num_speculative_tokens`` K,
    ``disable_by_batch_size`` the threshold; notes on what vLLM runs differently."""
    setup = prepare(tuning, "vllm", DRAFT_REFUSALS)
    notes = setup.notes
    config: dict[str, Any]
    if setup.draft.kind == "ngram":
        # spectune's prompt lookup matches 1..3-gram suffixes.
        config = {
            "method": "ngram",
            "num_speculative_tokens": setup.k,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    elif setup.draft.kind == "suffix":
        config = {"method": "suffix", "num_speculative_tokens": setup.k}
        notes.append(
            "vLLM's suffix method (Arctic Inference's suffix decoding: pip install "
            "arctic-inference) drafts up to K tokens from suffix trees of the prompt and "
            "earlier responses; spectune's corpus index is not carried over"
        )
    else:
        config = {
            "method": "draft_model",
            "model": setup.draft.location,
            "num_speculative_tokens": setup.k,
        }
    limit = setup.speculate_max_batch
    if limit is not None:
        if limit >= 2:
            # vLLM: "disable speculative decoding for new incoming requests when the
            # number of enqueued requests is larger than this value" (it must be >= 2).
            config["disable_by_batch_size"] = limit
        else:
            notes.append(
                f"speculation pays only up to {limit} running request(s); vLLM's "
                "disable_by_batch_size must be >= 2, so it is left out: consider serving "
                "without speculation"
            )
    args = ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    command = shlex.join(["vllm", "serve", setup.target, *args])
    return ExportPlan("vllm", args, command, config, notes)
