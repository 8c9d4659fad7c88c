"""Drafters: sources of guesses the target verifies."""

from spectune.draft import Draft
from spectune.drafters.base import Drafter, TargetFeatures
from spectune.drafters.feature import FeatureDrafter, FeatureTreeDrafter
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.model import ModelDrafter, TreeDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.scripted import FailingDrafter, ScriptedDrafter
from spectune.drafters.suffix import SuffixDrafter
from spectune.drafters.tree import TreeShape

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
