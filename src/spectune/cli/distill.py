"""``spectune distill``: train a draft for a target on the target's own outputs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.common import add_device_arg, add_threads_arg, set_threads
from spectune.cli.paths import output_folder
from spectune.distill.settings import PRECISIONS
from spectune.distill.sources import read_prompt_files, read_reference_chats
from spectune.errors import InvalidParameterError
from spectune.models.names import LAYOUTS

if TYPE_CHECKING:
    from spectune.distill.data import DistillCorpus
    from spectune.distill.train import CurvePoint, TrainState

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "distill",
        help="distil a draft model for a target (self-distillation, KL to the target)",
        description="Generate (and cache) the target's continuations of a prompt corpus, "
        "then train a small LM or an EAGLE-style feature head to match the target's "
        "next-token distributions.",
    )
    parser.add_argument("--target", default="default", help="target model (default, .gguf, folder)")
    parser.add_argument(
        "--corpus",
        action="append",
        type=Path,
        default=[],
        help="JSONL prompts (messages / question / instruction / text) or a text file; repeatable",
    )
    parser.add_argument(
        "--answers",
        type=Path,
        default=None,
        help="train on a target answer corpus (`spectune corpus --out`) instead of --corpus; "
        "its held-out answers are the held-out set",
    )
    parser.add_argument(
        "--answer-shards", type=int, default=None, help="use the first N answer shards"
    )
    parser.add_argument(
        "--feature-layers",
        type=_layers,
        default=(),
        help="target layers a feature head fuses (EAGLE-3), e.g. 2,15,29 or 'auto' "
        "(low, middle, last); default: the last hidden state only",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="spectune",
        help="a feature head's layer: spectune (fc, then a Llama layer) or eagle3 (vLLM's "
        "EAGLE-3 layer, which 'spectune convert --draft' writes for vLLM)",
    )
    parser.add_argument(
        "--unroll",
        type=int,
        default=1,
        help="draft positions trained per position, feeding the head its own features "
        "(training-time test); 1 = first draft token only",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--kind",
        choices=("lm", "gpt2", "feature"),
        default="feature",
        help="lm: a Llama-style LM; gpt2: a GPT-2-style LM (another architecture family, "
        "same tokenizer); feature: an EAGLE-style head",
    )
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (lm)")
    parser.add_argument("--hidden", type=int, default=256, help="width (lm)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (lm)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (lm)")
    parser.add_argument("--ffn", type=int, default=768, help="MLP width")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="reduced draft vocabulary: the N most frequent corpus tokens (default: full)",
    )
    parser.add_argument("--generate", type=int, default=512, help="prompts the target continues")
    parser.add_argument(
        "--reference",
        type=int,
        default=0,
        help="chats whose reference replies are teacher-forced (cheaper than generating)",
    )
    parser.add_argument(
        "--task-mix",
        action="store_true",
        help="rewrap prompts as translation/summary/context-QA tasks",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="longest continuation the target writes per prompt",
    )
    parser.add_argument(
        "--gen-batch", type=int, default=32, help="prompts the target continues together"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the target's continuations and features are cached and reused (default: "
        "$SPECTUNE_CACHE/distill, SPECTUNE_CACHE defaulting to ~/.cache/spectune)",
    )
    parser.add_argument("--steps", type=int, default=None, help="budget: optimizer steps")
    parser.add_argument("--tokens", type=int, default=None, help="budget: training positions")
    parser.add_argument("--minutes", type=float, default=None, help="budget: wall minutes")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument(
        "--batch-tokens", type=int, default=2048, help="training positions per optimizer step"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=100,
        help="optimizer steps between held-out acceptance checks",
    )
    parser.add_argument("--heldout", type=int, default=48, help="held-out sequences")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order")
    add_threads_arg(parser)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="compute precision of the teacher pass that caches states (--answers) and of "
        "training: bf16 autocasts both (weights and optimizer stay fp32); on a CPU with bf16 "
        "units (AMX) the teacher pass runs about 4x faster; each precision has its own cache",
    )
    add_device_arg(parser)
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint")
    parser.add_argument(
        "--features-only",
        action="store_true",
        help="with --answers: build (or complete) the cached teacher pass and stop, so "
        "several training runs can then share it",
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from this feature draft (its weights, layers and vocabulary) instead of "
        "a fresh head: train a shipped draft further on more data",
    )
    parser.add_argument(
        "--follow-cache",
        action="store_true",
        help="re-read the cached corpus at every epoch (train while another job generates)",
    )
    parser.set_defaults(run=run)


def _layers(text: str) -> tuple[int, ...] | str:
    if text == "auto":
        return text
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        message = f"expected comma-separated layer numbers or 'auto', got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def _feature_layers(
    value: tuple[int, ...] | str, num_layers: int, layout: str = "spectune"
) -> tuple[int, ...]:
    """'auto': a low, a middle and the last layer (EAGLE-3's choice of three); for the
    eagle3 layout, vLLM's own choice for a Llama (``vllm_default_layers``)."""
    from spectune.engines.vllm.eagle3 import vllm_default_layers

    if value == "auto":
        if layout == "eagle3":
            return vllm_default_layers(num_layers)
        return (2, num_layers // 2, num_layers - 1)
    assert isinstance(value, tuple)
    if list(value) != sorted(set(value)) or not all(0 <= i < num_layers for i in value):
        raise InvalidParameterError(
            f"--feature-layers must be ascending layer numbers in [0, {num_layers}), got {value}"
        )
    if layout == "eagle3" and value[-1] == num_layers - 1:
        raise InvalidParameterError(
            f"--layout eagle3 cannot read the last layer ({num_layers - 1}): spectune takes "
            "it after the final norm and vLLM before it"
        )
    return value


def _layers_of_draft(folder: Path) -> tuple[int, ...]:
    """The target layers the feature draft in ``folder`` reads."""
    from spectune.drafters.loading import read_draft_meta

    meta = read_draft_meta(folder)
    if meta is None or meta.kind != "feature":
        raise InvalidParameterError(f"--init-from {folder} is not a feature-draft folder")
    return tuple(int(i) for i in meta.data["head"].get("feature_layers", ()))


def _progress() -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=False,
    )


def run(args: argparse.Namespace) -> int:
    from spectune.distill.data import DistillCorpus, GenerationSettings, build_answer_features
    from spectune.distill.models import DraftArchitecture
    from spectune.distill.pipeline import CorpusPlan, build_corpora, distill
    from spectune.distill.train import Budget, TrainSettings
    from spectune.drafters.pairing import load_target
    from spectune.models.devices import resolve_device
    from spectune.models.llama import LlamaLM

    if args.features_only and args.answers is None:
        raise InvalidParameterError("--features-only caches the teacher pass of --answers")
    if not (args.steps or args.tokens or args.minutes or args.features_only):
        raise InvalidParameterError("give a budget: --steps, --tokens and/or --minutes")
    set_threads(args.threads)
    if bool(args.corpus) == (args.answers is not None):
        raise InvalidParameterError("give either --corpus files or an --answers corpus folder")
    if args.feature_layers and args.kind != "feature":
        raise InvalidParameterError("--feature-layers is for --kind feature")
    if args.layout == "eagle3" and args.kind != "feature":
        raise InvalidParameterError("--layout is for --kind feature")
    if args.layout == "eagle3" and args.init_from is not None:
        raise InvalidParameterError("--init-from continues a head in its own layout; drop --layout")
    if args.layout == "eagle3" and not args.feature_layers:
        raise InvalidParameterError("--layout eagle3 reads several layers: give --feature-layers")
    layers_arg = args.feature_layers
    if args.init_from is not None:
        if args.kind != "feature":
            raise InvalidParameterError("--init-from continues a feature draft (--kind feature)")
        drafts_layers = _layers_of_draft(args.init_from)  # refuses a folder of another kind
        layers_arg = layers_arg or drafts_layers
    if args.answer_shards is not None and args.answer_shards < 1:
        raise InvalidParameterError(f"--answer-shards must be >= 1, got {args.answer_shards}")
    if args.heldout < 1:
        raise InvalidParameterError("--heldout must be >= 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise InvalidParameterError("--vocab-size must be >= 1")
    inputs = [("--answers", args.answers), *(("--corpus", path) for path in args.corpus)]
    output_folder(args.out, "--out", inputs)
    if args.cache_dir is None:
        args.cache_dir = Path(os.environ.get("SPECTUNE_CACHE", "~/.cache/spectune")).expanduser()
        args.cache_dir /= "distill"
    output_folder(args.cache_dir, "--cache-dir", inputs)
    # Every setting is checked (by its dataclass) before the target loads.
    plan = CorpusPlan(
        paths=tuple(args.corpus),
        cache_dir=args.cache_dir,
        generate=args.generate,
        reference=args.reference,
        task_mix=args.task_mix,
        seed=args.seed,
        settings=GenerationSettings(max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch),
    )
    arch = DraftArchitecture(
        kind=args.kind,
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.ffn,
        unroll=args.unroll,
        layout=args.layout,
    )
    settings = TrainSettings(
        learning_rate=args.lr,
        batch_tokens=args.batch_tokens,
        eval_every=args.eval_every,
        seed=args.seed,
        precision=args.precision,
    )
    budget = Budget(
        max_steps=args.steps,
        max_tokens=args.tokens,
        max_minutes=0.0 if args.features_only else args.minutes,  # no training to budget
    )
    # The target scores (or generates) the corpus on --device and the draft trains there.
    device = resolve_device(args.device)
    if args.answers is None:  # the corpus files are read (and checked) before the target
        if plan.generate > 0:
            read_prompt_files(plan.paths, task_mix=plan.task_mix, seed=plan.seed)
        if plan.reference > 0:
            read_reference_chats(plan.paths, seed=plan.seed)
    target = load_target(args.target, device=device)
    if not isinstance(target.model, LlamaLM):
        raise InvalidParameterError("distillation needs a target on the native runtime")
    feature_layers = _feature_layers(layers_arg, target.model.net.cfg.num_layers, args.layout)
    arch = dataclasses.replace(arch, feature_layers=feature_layers)
    with _progress() as progress:
        tasks: dict[str, Any] = {}

        def on_corpus(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total, stats="")
            progress.update(tasks[stage], completed=done)

        given_heldout: DistillCorpus | None = None
        if args.answers is not None:
            # Features are cached per answer shard, keyed by what the head reads.
            key = "-".join(map(str, feature_layers)) or "last"
            key += "" if args.precision == "fp32" else f"-{args.precision}"
            generated, given_heldout = build_answer_features(
                target.model,
                args.answers,
                args.cache_dir / "answer-features" / f"{args.answers.resolve().name}-{key}",
                layers=feature_layers,
                max_shards=args.answer_shards,
                precision=args.precision,
                on_shard=lambda done, total: on_corpus("features", done, total),
            )
            reference, folders = DistillCorpus([]), list[Path]()
            if args.features_only:
                counts = {
                    "training_positions": generated.num_training_positions,
                    "training_answers": len(generated),
                    "heldout_answers": len(given_heldout),
                }
                progress.console.print(json.dumps(counts))
                return 0
        else:
            generated, reference, folders = build_corpora(target, plan, on_corpus)
        refresh = None
        if args.follow_cache and args.answers is None:
            generated_folder = folders[0] if plan.generate > 0 else None
            reference_folder = folders[-1] if plan.reference > 0 else None

            def refresh() -> tuple[DistillCorpus, DistillCorpus]:
                return (
                    DistillCorpus.load(generated_folder) if generated_folder else generated,
                    DistillCorpus.load(reference_folder) if reference_folder else reference,
                )

        train_task = progress.add_task("train", total=1000, stats="")
        heldout = {"top1": float("nan")}

        def on_step(state: TrainState, loss: float, tokens_per_second: float) -> None:
            fraction = budget.fraction(state.step, state.tokens, state.seconds)
            progress.update(
                train_task,
                completed=int(1000 * min(1.0, fraction)),
                stats=f"step {state.step}  {tokens_per_second:,.0f} tok/s  loss {loss:.3f}  "
                f"held-out acc {heldout['top1']:.3f}",
            )

        def on_eval(point: CurvePoint) -> None:
            heldout["top1"] = point.heldout_top1
            later = " ".join(f"{a:.3f}" for a in point.heldout_top1_by_position[1:])
            progress.console.print(
                f"step {point.step:>6}  positions {point.tokens:>9,}  held-out KL "
                f"{point.heldout_kl:.3f}  acceptance (teacher-forced) {point.heldout_top1:.3f}"
                + (f"  later draft positions {later}" if later else "")
            )

        result = distill(
            target.model,
            (generated, reference),
            arch,
            args.out,
            vocab_size=args.vocab_size,
            settings=settings,
            budget=budget,
            heldout_sequences=args.heldout,
            training_record={"command": args.command_line},
            heldout=given_heldout,
            resume=args.resume,
            init_from=args.init_from,
            device=device,
            refresh=refresh,
            on_step=on_step,
            on_eval=on_eval,
        )
    ratio = result.trainable_parameters / target.model.info.num_parameters
    print(
        json.dumps(
            {
                "draft": str(result.folder),
                "kind": args.kind,
                "trainable_parameters": result.trainable_parameters,
                "parameter_ratio": round(ratio, 4),
                "vocab_subset_size": result.vocab_subset_size,
                "steps": result.state.step,
                "positions": result.state.tokens,
                "heldout_acceptance": result.state.curve[-1].heldout_top1,
            },
            indent=2,
        )
    )
    return 0
