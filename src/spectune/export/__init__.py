"""Carry a tuned setup to the engines users scale out on: vLLM, SGLang and llama.cpp.

Three steps: ``read_tunings`` takes the tuned setups (draft, K, the batch size above which
speculation stops paying) from a ``select`` or ``bench`` result file
(``spectune.export.tuning``); ``resolve_draft`` tells what the draft is to an engine
(``spectune.export.drafts``); ``export`` writes the engine's own flags, or refuses in one
line a draft or target the engine cannot load (``spectune.export.engines``).
"""

from spectune.export.drafts import DRAFT_TEMPLATE, REFUSALS, DraftRef, draft_refusal, resolve_draft
from spectune.export.engines import (
    ENGINE_NAMES,
    ENGINES,
    LLAMACPP_VERSION,
    TARGET_TEMPLATE,
    ExportPlan,
    engine_name,
    export,
    export_best,
    refusal,
    target_refusal,
    to_llamacpp,
    to_sglang,
    to_vllm,
)
from spectune.export.tuning import Tuning, read_tuning, read_tunings

__all__ = [
    "DRAFT_TEMPLATE",
    "ENGINES",
    "ENGINE_NAMES",
    "LLAMACPP_VERSION",
    "REFUSALS",
    "TARGET_TEMPLATE",
    "DraftRef",
    "ExportPlan",
    "Tuning",
    "draft_refusal",
    "engine_name",
    "export",
    "export_best",
    "read_tuning",
    "read_tunings",
    "refusal",
    "resolve_draft",
    "target_refusal",
    "to_llamacpp",
    "to_sglang",
    "to_vllm",
]
