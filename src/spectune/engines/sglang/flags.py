"""A tuned setup as SGLang's server flags, or the line that refuses it.

Flags as of SGLang's server arguments: ``STANDALONE`` (a standalone draft LM) as a chain
draft of K steps, ``NGRAM`` for prompt lookup and suffix drafting.
"""

from __future__ import annotations

import shlex

from spectune.engines.drafts import FEATURE_HEAD, HYBRID, LM_GGUF, USE_LM_DRAFT, DraftKind
from spectune.engines.plan import ExportPlan, prepare
from spectune.engines.tuned import Tuning

__all__ = ["DRAFT_REFUSALS", "to_sglang"]

# The draft kinds SGLang cannot load: why, and what to give it instead.
DRAFT_REFUSALS: dict[DraftKind, str] = {
    "feature-head": FEATURE_HEAD + ", so SGLang's STANDALONE algorithm cannot load it, "
    "and spectune does not write SGLang's EAGLE3 head format: use --draft ngram or --draft "
    f"suffix (SGLang's NGRAM) or {USE_LM_DRAFT}",
    "hybrid": HYBRID + ": use --draft suffix (SGLang's NGRAM)",
    "lm-gguf": LM_GGUF,
}


def to_sglang(tuning: Tuning) -> ExportPlan:
    """SGLang's server flags: ``STANDALONE`` (a standalone draft LM) as a chain draft
    (``--speculative-eagle-topk 1``) of K steps, K + 1 tokens per verification; ``NGRAM``
    for prompt lookup and suffix drafting."""
    setup = prepare(tuning, "sglang", DRAFT_REFUSALS)
    notes = setup.notes
    if setup.draft.kind in ("ngram", "suffix"):
        args = [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(setup.k + 1),
        ]
        notes.append("SGLang's NGRAM speculation runs on CUDA only")
        if setup.draft.kind == "suffix":
            notes.append(
                "SGLang has no suffix method; NGRAM, which matches the request's last tokens "
                "against the prompts and outputs it has served, is its nearest; spectune's "
                "corpus index is not carried over"
            )
    else:
        assert setup.draft.location is not None
        args = [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            setup.draft.location,
            "--speculative-num-steps",
            str(setup.k),
            "--speculative-eagle-topk",
            "1",
            # A chain of K draft tokens plus the verified root: num_steps * topk + 1.
            "--speculative-num-draft-tokens",
            str(setup.k + 1),
        ]
    if setup.speculate_max_batch is not None:
        notes.append(
            f"SGLang has no flag to stop speculating above a batch size; speculation paid "
            f"only up to {setup.speculate_max_batch} running requests here, so cap "
            f"--max-running-requests near it or serve larger batches without speculation"
        )
    command = shlex.join(
        ["python", "-m", "sglang.launch_server", "--model-path", setup.target, *args]
    )
    return ExportPlan("sglang", args, command, {}, notes)
