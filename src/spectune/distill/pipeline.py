"""``spectune distill`` end to end: corpus -> vocabulary -> draft -> training -> folder.

Kept apart from the CLI so tests and scripts drive the same steps with plain arguments.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from spectune.distill.data import (
    DistillCorpus,
    GenerationSettings,
    build_corpus,
    corpus_key,
)
from spectune.distill.export import save_feature_draft, save_gpt2_draft, save_lm_draft
from spectune.distill.models import (
    DraftArchitecture,
    FeatureDraftModel,
    GPT2DraftModel,
    LMDraftModel,
    TrainableDraft,
)
from spectune.distill.sources import read_prompt_files, read_reference_chats
from spectune.distill.train import Budget, CurvePoint, TrainSettings, TrainState, train
from spectune.drafters.loading import load_feature_head, read_draft_meta
from spectune.drafters.pairing import Loaded
from spectune.drafters.reduced import top_token_subset
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM, LlamaTransformer

__all__ = [
    "CorpusPlan",
    "DistillResult",
    "build_corpora",
    "distill",
    "lineage_curves",
    "plot_curve",
    "plot_draft_curve",
]


@dataclass(frozen=True)
class CorpusPlan:
    paths: tuple[Path, ...]
    cache_dir: Path
    generate: int = 512  # prompts the target continues (self-distillation)
    reference: int = 0  # chats with a reference reply, teacher-forced
    task_mix: bool = False
    seed: int = 0
    settings: GenerationSettings = GenerationSettings()

    def __post_init__(self) -> None:
        if self.generate < 0 or self.reference < 0:
            raise InvalidParameterError("--generate and --reference must be >= 0")
        if self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise InvalidParameterError(f"the cache folder {self.cache_dir} is a file")


@dataclass(frozen=True)
class DistillResult:
    folder: Path
    state: TrainState
    trainable_parameters: int
    vocab_subset_size: int | None


ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)


def build_corpora(
    target: Loaded, plan: CorpusPlan, on_progress: ProgressFn | None = None
) -> tuple[DistillCorpus, DistillCorpus, list[Path]]:
    """(generated corpus, teacher-forced corpus, their cache folders), each corpus built
    once and cached on disk."""
    folders: list[Path] = []
    if not isinstance(target.model, LlamaLM):
        raise InvalidParameterError("distillation needs a target on the native runtime")
    generated = DistillCorpus([])
    reference = DistillCorpus([])
    if plan.generate > 0:
        items = read_prompt_files(list(plan.paths), task_mix=plan.task_mix, seed=plan.seed)
        folder = plan.cache_dir / corpus_key(target.path, items, plan.settings)
        folders.append(folder)
        generated = build_corpus(
            target.model,
            target.tokenizer,
            items,
            folder,
            plan.settings,
            limit=plan.generate,
            on_progress=lambda d, t, _: on_progress and on_progress("generate", d, t),
        )
    if plan.reference > 0:
        chats = read_reference_chats(list(plan.paths), seed=plan.seed)
        settings = GenerationSettings(
            max_new_tokens=0,
            max_prompt_tokens=plan.settings.max_prompt_tokens,
            batch_size=16,
            top_k=plan.settings.top_k,
            shard_sequences=128,
        )
        folder = plan.cache_dir / corpus_key(target.path, chats, settings)
        folders.append(folder)
        reference = build_corpus(
            target.model,
            target.tokenizer,
            chats,
            folder,
            settings,
            limit=plan.reference,
            on_progress=lambda d, t, _: on_progress and on_progress("teacher-force", d, t),
        )
    return generated, reference, folders


def column_map(vocab_subset: Tensor | None, vocab_size: int) -> Tensor:
    """[vocab] draft output column of every token id, -1 where the draft cannot propose it."""
    if vocab_subset is None:
        return torch.arange(vocab_size)
    columns = torch.full((vocab_size,), -1, dtype=torch.long)
    columns[vocab_subset] = torch.arange(vocab_subset.shape[0])
    return columns


def distill(
    model: LlamaLM,
    corpora: tuple[DistillCorpus, DistillCorpus],
    arch: DraftArchitecture,
    out: Path,
    *,
    vocab_size: int | None,
    settings: TrainSettings,
    budget: Budget,
    heldout_sequences: int,
    training_record: dict[str, Any],
    heldout: DistillCorpus | None = None,
    resume: bool = False,
    init_from: Path | None = None,
    device: torch.device | None = None,
    refresh: Callable[[], tuple[DistillCorpus, DistillCorpus]] | None = None,
    on_step: Callable[[TrainState, float, float], None] | None = None,
    on_eval: Callable[[CurvePoint], None] | None = None,
) -> DistillResult:
    generated, reference = corpora
    # Held out: given (an answer corpus holds out by id), else the head of the
    # self-generated corpus (what drafts will face at run time).
    held = 0  # leading sequences of the source that are held out, not trained on
    if heldout is None:
        source = generated if len(generated) else reference
        _, heldout = source.split(heldout_sequences)
        held = len(heldout)
    rng = random.Random(settings.seed)

    def training_set(generated: DistillCorpus, reference: DistillCorpus) -> DistillCorpus:
        if len(generated):
            sequences = generated.sequences[held:] + reference.sequences
        else:
            sequences = reference.sequences[held:]
        rng.shuffle(sequences)
        return DistillCorpus(sequences)

    corpus = training_set(generated, reference)
    if len(corpus) == 0 or len(heldout) == 0:
        raise InvalidParameterError("the corpus is too small to hold out sequences for checks")
    reload = None if refresh is None else (lambda: training_set(*refresh()))

    net = model.net
    full_vocab = net.cfg.vocab_size
    subset: Tensor | None = None
    if vocab_size is not None and vocab_size < full_vocab and init_from is None:
        always = sorted(set(net.cfg.eos_token_ids))
        subset = top_token_subset(corpus.token_counts(full_vocab), vocab_size, always)
    generator = torch.Generator().manual_seed(settings.seed)
    draft: TrainableDraft
    if init_from is not None:
        warm = _warm_start(init_from, arch, net, vocab_size)
        head_cfg = warm.head.cfg  # a warm start keeps the head's width and layout
        arch = replace(arch, intermediate_size=head_cfg.intermediate_size, layout=head_cfg.layout)
        draft, subset = warm, warm.vocab_subset
        # The lineage: where it started and how that draft was trained (its own lineage too).
        before = read_draft_meta(init_from)
        training_record = {
            **training_record,
            "initialised_from": str(init_from),
            "previous_training": None if before is None else before.data.get("training"),
        }
    elif arch.kind == "feature":
        draft = FeatureDraftModel.create(arch, net, subset, generator)
    elif arch.kind == "lm":
        draft = LMDraftModel.create(arch, net.cfg, subset, generator)
    elif arch.kind == "gpt2":
        if subset is not None:
            raise InvalidParameterError("a gpt2 draft keeps the full vocabulary (no --vocab-size)")
        draft = GPT2DraftModel.create(arch, net.cfg, generator)
    else:
        raise InvalidParameterError(f"unknown draft kind {arch.kind!r} (lm, gpt2 or feature)")
    trainable = sum(p.numel() for p in draft.module().parameters() if p.requires_grad)
    checkpoint = out / "checkpoint"
    if not resume:
        shutil.rmtree(checkpoint, ignore_errors=True)  # a fresh run never continues an old one

    draft.module().to("cpu" if device is None else device)  # train() brings the data there
    state = train(
        draft,
        corpus,
        heldout,
        column_map(subset, full_vocab),
        settings,
        budget,
        checkpoint=checkpoint,
        on_step=on_step,
        on_eval=on_eval,
        reload=reload,
    )
    draft.module().to("cpu")  # drafts are saved (and run) from the CPU
    record = {
        **training_record,
        "architecture": arch.record(),
        "settings": asdict(settings),
        "budget": asdict(budget),
        "corpus_positions": corpus.num_training_positions,
        "heldout_sequences": len(heldout),
        "curve": [asdict(p) for p in state.curve],
    }
    folder = out / "draft"
    if isinstance(draft, FeatureDraftModel):
        save_feature_draft(folder, draft, net, model.info.name, record)
    elif isinstance(draft, LMDraftModel):
        save_lm_draft(folder, draft, net, model.info.name, record)
    elif isinstance(draft, GPT2DraftModel):
        save_gpt2_draft(folder, draft, net, model.info.name, record)
    plot_draft_curve(folder, out / "learning_curve.png")
    return DistillResult(folder, state, trainable, None if subset is None else len(subset))


def _warm_start(
    folder: Path, arch: DraftArchitecture, net: LlamaTransformer, vocab_size: int | None
) -> FeatureDraftModel:
    """The feature draft in ``folder``, to be trained further: its weights and its reduced
    vocabulary are kept (more data for a trained head, without starting over)."""
    if arch.kind != "feature":
        raise InvalidParameterError("--init-from continues a feature draft (--kind feature)")
    head, subset = load_feature_head(folder, net)
    if head.cfg.feature_layers != arch.feature_layers:
        raise InvalidParameterError(
            f"{folder} reads target layers {list(head.cfg.feature_layers)}, "
            f"not {list(arch.feature_layers)}"
        )
    kept = net.cfg.vocab_size if subset is None else len(subset)
    if vocab_size is not None and vocab_size != kept:
        raise InvalidParameterError(
            f"{folder} drafts over {kept} tokens; --vocab-size {vocab_size} would change that"
        )
    return FeatureDraftModel(head, subset, unroll=arch.unroll)


def lineage_curves(training: dict[str, Any]) -> list[list[CurvePoint]]:
    """The learning curves of a draft's training record, oldest stage first: a draft
    trained ``--init-from`` another carries that one's record (``previous_training``)."""
    stages: list[list[CurvePoint]] = []
    record: dict[str, Any] | None = training
    while record is not None:
        stages.insert(0, [CurvePoint(**p) for p in record.get("curve", [])])
        record = record.get("previous_training")
    return stages


def plot_curve(
    curve: list[CurvePoint], path: Path, earlier: Sequence[list[CurvePoint]] = ()
) -> None:
    """Held-out acceptance per draft position against training positions; ``earlier``
    stages (a warm start's lineage) come first on the same axis, each stage's positions
    added to those before it, with a dotted line where a stage begins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    stages = [*earlier, curve]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    positions = max((len(p.heldout_top1_by_position) for c in stages for p in c), default=1) or 1
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    offset = 0
    for number, stage in enumerate(stages):
        if number:
            ax.axvline(offset, color="0.6", linestyle=":", linewidth=1)
            height = 0.97 - 0.05 * (number % 2)  # alternate: short stages sit close together
            ax.annotate(f" stage {number + 1}", (offset, height), fontsize=8, color="0.4", va="top")
        for index in range(positions):
            points = [
                (
                    offset + p.tokens,
                    p.heldout_top1_by_position[index]
                    if p.heldout_top1_by_position
                    else p.heldout_top1,
                )
                for p in stage
                if index < max(1, len(p.heldout_top1_by_position))
            ]
            if not points:
                continue
            label = "first draft token" if index == 0 else f"draft token {index + 1} (own features)"
            ax.plot(
                *zip(*points, strict=True),
                marker="o",
                markersize=3,
                color=colours[index % len(colours)],
                label=label if number == len(stages) - 1 else None,
            )
        offset += stage[-1].tokens if stage else 0
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("training positions seen (all stages)")
    ax.set_ylabel("held-out greedy acceptance\n(teacher-forced prefix)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if positions > 1:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_draft_curve(folder: Path, path: Path) -> None:
    """``plot_curve`` of the draft folder's recorded training, its whole lineage."""
    meta = read_draft_meta(folder)
    if meta is None or "training" not in meta.data:
        raise InvalidParameterError(f"{folder} records no training")
    *earlier, last = lineage_curves(meta.data["training"])
    plot_curve(last, path, earlier)
