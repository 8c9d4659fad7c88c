"""The public API is pinned: adding or removing a name is a deliberate change here."""

from __future__ import annotations

import spectune

PUBLIC = {
    "BatchEngine",
    "Draft",
    "Drafter",
    "DrafterError",
    "FailingDrafter",
    "FeatureDrafter",
    "FeatureTreeDrafter",
    "FixedK",
    "HybridDrafter",
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
    "SequenceUpdate",
    "SpectuneError",
    "SpeculativeEngine",
    "StepPlan",  # what a KPolicy's plan() returns: custom policies build it
    "StepRecord",
    "SuffixDrafter",
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
}


def test_all_is_pinned() -> None:
    assert set(spectune.__all__) == PUBLIC


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in spectune.__all__:
        member = getattr(spectune, name)
        assert member.__doc__, f"{name} has no docstring"
