"""What ``spectune bench`` compares, as plain data: its parser reads it without loading
torch (``spectune.bench.plan`` acts on it)."""

from __future__ import annotations

__all__ = ["SYSTEM_KEYS"]

# Which systems run, by key (``--systems``):
SYSTEM_KEYS = {
    "plain": "plain decoding in spectune's runtime (always runs: it is the reference)",
    "spectune": "spectune speculative decoding: every drafter x fixed K and policy",
    "hf": "transformers generate() without a draft",
    "hf-assisted": "transformers assisted generation with each draft model, default settings",
    "hf-heuristic": "the same with the 'heuristic' num_assistant_tokens_schedule",
    "hf-lookup": "transformers prompt lookup (prompt_lookup_num_tokens)",
    "llamacpp": "with --dtype llamacpp: llama.cpp's own plain decoding and prompt lookup at "
    "each fixed K (llama-cpp-python's Llama class)",
}
