"""Drafts of several sizes and two architecture families, distilled on equal budgets.

Each ``DraftSpec`` is trained by ``spectune.distill`` (the same corpus, settings and
budget for every draft) into ``<out>/drafts/<name>/draft``; a draft already there is not
trained again (the run resumes). Then each is scored on the evaluation prompts: alpha at
T = 0 and T = 1 (``spectune.select.alpha``), its one-token forward time against the
target's, and the speedup the cost model predicts at its best K from those measurements
(``spectune.control.costs.optimal_k``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.control.costs import measure_forward_curve, optimal_k
from spectune.distill.data import DistillCorpus
from spectune.distill.models import DraftArchitecture
from spectune.distill.pipeline import distill
from spectune.distill.train import Budget, TrainSettings
from spectune.drafters.loading import DRAFT_META_FILE, lm_drafter_from_folder
from spectune.drafters.model import ModelDrafter
from spectune.errors import InvalidParameterError
from spectune.experiments.common import Setup
from spectune.experiments.evidence.measure import labelled_prompts
from spectune.models.base import LanguageModel
from spectune.models.hf import load_hf_model
from spectune.models.llama import LlamaLM
from spectune.models.loading import load_model
from spectune.select.alpha import estimate_alpha, make_continuations

__all__ = ["DraftSpec", "distill_drafts", "parse_sizes", "score_drafts"]

FAMILIES = {"llama": "lm", "gpt2": "gpt2"}  # family -> distill kind


@dataclass(frozen=True)
class DraftSpec:
    family: str  # "llama" | "gpt2"
    layers: int
    hidden: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.layers}x{self.hidden}"

    def architecture(self) -> DraftArchitecture:
        heads = max(1, self.hidden // 64)
        return DraftArchitecture(
            kind=FAMILIES[self.family],
            num_layers=self.layers,
            hidden_size=self.hidden,
            num_heads=heads,
            num_kv_heads=heads // 2 if heads % 2 == 0 else heads,
            intermediate_size=3 * self.hidden,
        )


def parse_sizes(text: str, family: str = "llama") -> tuple[DraftSpec, ...]:
    """``LAYERSxHIDDEN`` comma-separated, e.g. ``1x64,2x128,4x256``."""
    specs = []
    for part in text.split(","):
        try:
            layers, hidden = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise InvalidParameterError(f"a draft size is LAYERSxHIDDEN, got {part!r}") from None
        if layers < 1 or hidden < 1:
            raise InvalidParameterError(f"a draft size needs layers and hidden >= 1, got {part!r}")
        specs.append(DraftSpec(family, layers, hidden))
    return tuple(specs)


def draft_folder(out_dir: Path, spec: DraftSpec) -> Path:
    return out_dir / "drafts" / spec.name / "draft"


def distill_drafts(
    target: LlamaLM,
    corpora: tuple[DistillCorpus, DistillCorpus | None],  # (training, held out or None)
    specs: Sequence[DraftSpec],
    out_dir: Path,
    *,
    budget: Budget,
    settings: TrainSettings,
    force: bool = False,
) -> dict[str, float]:
    """Train every draft not trained yet; returns the training seconds of those trained now."""
    train, heldout = corpora
    seconds: dict[str, float] = {}
    for spec in specs:
        if (draft_folder(out_dir, spec) / DRAFT_META_FILE).is_file() and not force:
            continue
        result = distill(
            target,
            (train, DistillCorpus([])),
            spec.architecture(),
            out_dir / "drafts" / spec.name,
            vocab_size=None,
            settings=settings,
            budget=budget,
            heldout_sequences=8,
            training_record={"evidence": spec.name, "budget": str(budget)},
            heldout=heldout,
        )
        seconds[spec.name] = result.state.seconds
    return seconds


def _load(folder: Path, spec: DraftSpec) -> tuple[LanguageModel, ModelDrafter]:
    if spec.family == "gpt2":
        model: LanguageModel = load_hf_model(folder)
        return model, ModelDrafter(model, name=spec.name)
    model = load_model(folder)
    return model, lm_drafter_from_folder(folder, model)


def score_drafts(
    setup: Setup, specs: Sequence[DraftSpec], out_dir: Path, *, max_tokens: int, budget: str
) -> dict[str, Any]:
    target = setup.target
    continuations = make_continuations(target, labelled_prompts(setup), max_tokens)
    curve = measure_forward_curve(target, sizes=(1, 2, 3, 4, 5, 6, 7, 8, 9), repeats=3)
    rows = []
    for spec in specs:
        folder = draft_folder(out_dir, spec)
        model, drafter = _load(folder, spec)
        alphas = estimate_alpha(drafter, continuations, target, (0.0, 1.0))
        draft_cost = measure_forward_curve(model, sizes=(1,), repeats=5).seconds[0]
        relative = draft_cost / curve.seconds[0]
        best_k, speedup = optimal_k(alphas[0].overall, relative, curve)
        parameters = model.info.num_parameters
        rows.append(
            {
                "name": spec.name,
                "family": spec.family,
                "layers": spec.layers,
                "hidden": spec.hidden,
                "parameters": parameters,
                "ratio": round(parameters / target.info.num_parameters, 5),
                "alpha_t0": round(alphas[0].overall, 4),
                "alpha_t1": round(alphas[1].overall, 4),
                "draft_over_target": round(relative, 4),
                "best_k": best_k,
                "predicted_speedup": round(speedup, 4),
            }
        )
    return {
        "budget": budget,  # what each draft was trained for, the same for all
        "target_parameters": target.info.num_parameters,
        "curve_sizes": list(curve.sizes),
        "curve_seconds": [round(s, 6) for s in curve.seconds],
        "drafts": rows,
    }
