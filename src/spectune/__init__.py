"""spectune: lossless speculative decoding with live tuning.

Importing spectune before torch sets ``MKL_CBWR=AVX2`` on AMD CPUs (unless already set):
there MKL otherwise takes a slow path for the 2-8 row fp32 matmuls that verification
runs. Not on Intel CPUs, where the AVX2 path is the slow one (2 rows: 81 us against 25 us
for the default target's MLP shape on a Xeon with AVX-512).
"""

import os
from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports


def _amd_cpu() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return any("AuthenticAMD" in line for line in cpuinfo if line.startswith("vendor"))
    except OSError:  # not Linux: leave MKL as it is
        return False


if _amd_cpu():
    os.environ.setdefault("MKL_CBWR", "AVX2")

if TYPE_CHECKING:
    from spectune.control import FixedK, KPolicy, StepPlan, make_policy
    from spectune.decode.batch import BatchEngine, SequenceUpdate
    from spectune.decode.engine import Generation, SpeculativeEngine
    from spectune.drafters import (
        Draft,
        Drafter,
        FailingDrafter,
        FeatureDrafter,
        FeatureTreeDrafter,
        HybridDrafter,
        ModelDrafter,
        NgramDrafter,
        ScriptedDrafter,
        SuffixDrafter,
        TargetFeatures,
        TreeDrafter,
    )
    from spectune.drafters.pairing import load_drafter, load_target, tree_drafter_for
    from spectune.errors import (
        DrafterError,
        IncompatibleModelsError,
        InvalidParameterError,
        ModelLoadError,
        PromptError,
        SpectuneError,
    )
    from spectune.models import LanguageModel, ModelInfo, load_model
    from spectune.monitor import Monitor
    from spectune.records import StepRecord
    from spectune.sampling import SamplingParams
    from spectune.verify.chain import VerifyResult, verify_greedy, verify_sampled
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.control": ["FixedK", "KPolicy", "StepPlan", "make_policy"],
            "spectune.decode.batch": ["BatchEngine", "SequenceUpdate"],
            "spectune.decode.engine": ["Generation", "SpeculativeEngine"],
            "spectune.drafters": [
                "Draft",
                "Drafter",
                "FailingDrafter",
                "FeatureDrafter",
                "FeatureTreeDrafter",
                "HybridDrafter",
                "ModelDrafter",
                "NgramDrafter",
                "ScriptedDrafter",
                "SuffixDrafter",
                "TargetFeatures",
                "TreeDrafter",
            ],
            "spectune.drafters.pairing": ["load_drafter", "load_target", "tree_drafter_for"],
            "spectune.errors": [
                "DrafterError",
                "IncompatibleModelsError",
                "InvalidParameterError",
                "ModelLoadError",
                "PromptError",
                "SpectuneError",
            ],
            "spectune.models": ["LanguageModel", "ModelInfo", "load_model"],
            "spectune.monitor": ["Monitor"],
            "spectune.records": ["StepRecord"],
            "spectune.sampling": ["SamplingParams"],
            "spectune.verify.chain": ["VerifyResult", "verify_greedy", "verify_sampled"],
        },
    )

__version__ = "0.1.0"

__all__ = [
    "BatchEngine",
    "Draft",
    "Drafter",
    "DrafterError",
    "FailingDrafter",
    "FeatureDrafter",
    "FeatureTreeDrafter",
    "HybridDrafter",
    "FixedK",
    "Generation",
    "IncompatibleModelsError",
    "InvalidParameterError",
    "KPolicy",
    "LanguageModel",
    "ModelDrafter",
    "ModelInfo",
    "ModelLoadError",
    "Monitor",
    "NgramDrafter",
    "PromptError",
    "SamplingParams",
    "ScriptedDrafter",
    "SuffixDrafter",
    "SequenceUpdate",
    "SpectuneError",
    "SpeculativeEngine",
    "StepPlan",
    "StepRecord",
    "TargetFeatures",
    "TreeDrafter",
    "VerifyResult",
    "load_drafter",
    "load_model",
    "load_target",
    "make_policy",
    "tree_drafter_for",
    "verify_greedy",
    "verify_sampled",
]
