"""spectune: lossless speculative decoding with live tuning.

Importing spectune before torch sets ``MKL_CBWR=AVX2`` on AMD CPUs (unless already set):
there MKL otherwise takes a slow path for the 2-8 row fp32 matmuls that verification
runs. Not on Intel CPUs, where the AVX2 path is the slow one (2 rows: 81 us against 25 us
for the default target's MLP shape on a Xeon with AVX-512).
"""

import os


def _amd_cpu() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return any("AuthenticAMD" in line for line in cpuinfo if line.startswith("vendor"))
    except OSError:  # not Linux: leave MKL as it is
        return False


if _amd_cpu():
    os.environ.setdefault("MKL_CBWR", "AVX2")

from spectune.control import FixedK, KPolicy, StepPlan, make_policy  # noqa: E402
from spectune.decode.batch import BatchEngine, SequenceUpdate  # noqa: E402
from spectune.decode.engine import Generation, SpeculativeEngine  # noqa: E402
from spectune.drafters import (  # noqa: E402
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
from spectune.drafters.pairing import load_drafter, load_target, tree_drafter_for  # noqa: E402
from spectune.errors import (  # noqa: E402
    DrafterError,
    IncompatibleModelsError,
    InvalidParameterError,
    ModelLoadError,
    PromptError,
    SpectuneError,
)
from spectune.models import LanguageModel, ModelInfo, load_model  # noqa: E402
from spectune.monitor import Monitor  # noqa: E402
from spectune.records import StepRecord  # noqa: E402
from spectune.sampling import SamplingParams  # noqa: E402
from spectune.verify.chain import VerifyResult, verify_greedy, verify_sampled  # noqa: E402

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
