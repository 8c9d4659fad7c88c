"""Whether a model's weight files describe the model: missing and unused tensors, one line.

Both loaders use it: the native runtime (``spectune.models.loading``) and the transformers
adapter (``spectune.models.hf``). A config that names one architecture over another's
weights must fail loudly, not decode with random weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from pathlib import Path

from spectune.errors import ModelLoadError, SpectuneWarning

__all__ = ["check_weights"]


def check_weights(
    source: Path, missing: Collection[str], unused: Collection[str], *, strict: bool
) -> None:
    """Raise ``ModelLoadError`` (``strict``) or warn when the files of ``source`` lack
    weights the model expects (``missing``) or hold tensors it does not use (``unused``).

    One line naming the first three of each, sorted, and what to do."""
    parts = [
        f"{len(names)} {label} ({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''})"
        for label, names in (
            ("weights the model expects are missing from the files", missing),
            ("tensors in the files are not used by the model", unused),
        )
        if names
    ]
    if not parts:
        return
    message = f"{source}: " + "; ".join(parts)
    if strict:
        raise ModelLoadError(
            f"{message}: config.json and the weights do not describe the same model "
            "(--allow-missing-weights loads it anyway, with random weights where missing)"
        )
    warnings.warn(
        f"--allow-missing-weights: {message}; those weights are randomly initialised",
        SpectuneWarning,
        stacklevel=3,
    )
