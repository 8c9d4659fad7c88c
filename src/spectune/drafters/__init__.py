"""Drafters: sources of guesses the target verifies."""

from spectune.drafters.base import Draft, Drafter, TargetFeatures
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.scripted import FailingDrafter, ScriptedDrafter
from spectune.drafters.tree import TreeDrafter, TreeShape

__all__ = [
    "Draft",
    "Drafter",
    "FailingDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "ScriptedDrafter",
    "TargetFeatures",
    "TreeDrafter",
    "TreeShape",
]
