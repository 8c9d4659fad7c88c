"""Drafters: sources of guesses the target verifies."""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.draft import Draft
    from spectune.drafters.base import Drafter, TargetFeatures
    from spectune.drafters.feature import FeatureDrafter, FeatureTreeDrafter
    from spectune.drafters.hybrid import HybridDrafter
    from spectune.drafters.model import ModelDrafter, TreeDrafter
    from spectune.drafters.ngram import NgramDrafter
    from spectune.drafters.scripted import FailingDrafter, ScriptedDrafter
    from spectune.drafters.suffix import SuffixDrafter
    from spectune.drafters.tree import TreeShape
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.draft": ["Draft"],
            "spectune.drafters.base": ["Drafter", "TargetFeatures"],
            "spectune.drafters.feature": ["FeatureDrafter", "FeatureTreeDrafter"],
            "spectune.drafters.hybrid": ["HybridDrafter"],
            "spectune.drafters.model": ["ModelDrafter", "TreeDrafter"],
            "spectune.drafters.ngram": ["NgramDrafter"],
            "spectune.drafters.scripted": ["FailingDrafter", "ScriptedDrafter"],
            "spectune.drafters.suffix": ["SuffixDrafter"],
            "spectune.drafters.tree": ["TreeShape"],
        },
    )

__all__ = [
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
    "TreeShape",
]
