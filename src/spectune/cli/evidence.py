"""``spectune experiment evidence``: measure the seed's practice rules, write one report.

Stages (``--stages``, default all) are cached as ``stage-<name>.json`` in ``--out-dir`` and
skipped when present with the same settings, so an interrupted run resumes; ``--force``
measures the chosen stages again. Stages not chosen but cached still feed the report.
``--toy`` runs every stage on the toy models in seconds (to check the command works).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.cli.paths import output_file, output_folder
from spectune.errors import InvalidParameterError
from spectune.experiments.evidence.stages import StageRun, run_stage, stage_path

if TYPE_CHECKING:
    from spectune.experiments.common import Setup

__all__ = ["STAGES", "add_arguments", "run"]

STAGES = ("temperature", "position", "policies", "memory", "costs", "tree", "drafts", "tuned")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evidence (the practice rules, measured)")
    group.add_argument(
        "--out-dir", type=Path, default=Path("docs/evidence"), help="stage files, drafts, plots"
    )
    group.add_argument(
        "--report", type=Path, default=None, help="the Markdown report (default: OUT_DIR.md)"
    )
    group.add_argument(
        "--stages", default=",".join(STAGES), help=f"comma-separated, from {','.join(STAGES)}"
    )
    group.add_argument("--force", action="store_true", help="measure the chosen stages again")
    group.add_argument(
        "--distill-minutes", type=float, default=10.0, help="training budget of each draft"
    )
    group.add_argument(
        "--draft-sizes",
        default="1x64,2x128,4x256,8x384",
        help="Llama-style drafts to distil, LAYERSxHIDDEN (about 1/40 to 1/4 of SmolLM2-135M)",
    )
    group.add_argument(
        "--family-size", default="4x256", help="the GPT-2-style draft's LAYERSxHIDDEN"
    )
    group.add_argument(
        "--answers",
        type=Path,
        default=Path("corpus/smollm2-135m-instruct"),
        help="target answer corpus the drafts are distilled on (`spectune corpus`)",
    )
    group.add_argument(
        "--answer-shards",
        type=int,
        default=None,
        help="use the first N shards of the answer corpus (default: all)",
    )
    group.add_argument(
        "--tune-report", type=Path, default=None, help="a `spectune tune` report JSON"
    )
    group.add_argument("--long-tokens", type=int, default=512, help="a long output's length")


def run(args: argparse.Namespace) -> int:
    from spectune.experiments.common import load_setup, toy_setup

    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown or not stages:
        raise InvalidParameterError(f"--stages: unknown {unknown}; choose from {','.join(STAGES)}")
    if args.distill_minutes <= 0 or args.long_tokens < 8:
        raise InvalidParameterError("--distill-minutes must be > 0 and --long-tokens >= 8")
    if args.answer_shards is not None and args.answer_shards < 1:
        raise InvalidParameterError("--answer-shards must be >= 1")
    from spectune.experiments.evidence.drafts import parse_sizes

    for sizes in (args.draft_sizes, args.family_size):
        parse_sizes(sizes)  # a bad size fails before anything loads
    # Every file is checked before a model loads and any stage runs: a stage's results
    # are written as it ends, so a late error would leave a half-made run behind.
    tune_report = None if args.tune_report is None else _read_tune_report(args.tune_report)
    inputs = [("--tune-report", args.tune_report), ("--answers", args.answers)]
    out_dir = output_folder(args.out_dir, "--out-dir", inputs)
    report = output_file(
        args.report or out_dir.with_suffix(".md"), "--report", inputs, make_parents=True
    )
    # The stage files this run reads (a chosen stage with --force is measured anew).
    cached = {
        name: None if args.force and name in stages else _cached(out_dir, name) for name in STAGES
    }
    drafts_to_measure = "drafts" in stages and cached["drafts"] is None
    if drafts_to_measure and not args.toy and not args.answers.is_dir():
        raise InvalidParameterError(
            f"--answers {args.answers}: no answer corpus (make one with `spectune corpus`)"
        )
    if args.toy and args.threads is None:
        import torch

        torch.set_num_threads(1)  # toy models: threads only add contention
    setup = (
        toy_setup(num_prompts=2)
        if args.toy
        else load_setup(args.target, args.draft, per_category=args.per_category, split="test")
    )
    if drafts_to_measure:
        _target_net(setup)  # distilling needs the native runtime: say so before any stage
    common = {
        "toy": args.toy,
        "setup": setup.description,
        "per_category": None if args.toy else args.per_category,
    }
    measures = _measures(args, setup, out_dir, tune_report)
    runs: list[StageRun] = []
    for name in STAGES:
        if name in stages and name in measures:
            settings, measure = measures[name]
            print(f"stage {name} ...", flush=True)
            done = run_stage(out_dir, name, {**common, **settings}, measure, force=args.force)
            print(f"stage {name}: " + ("cached" if done.cached else f"{done.seconds:.0f} s"))
            runs.append(done)
        elif (record := cached[name]) is not None:
            runs.append(record)
    _write(args, runs, report, setup)
    return 0


def _read_tune_report(path: Path) -> dict[str, Any]:
    """``--tune-report``: a JSON object (``spectune tune --report`` writes one)."""
    if not path.is_file():
        raise InvalidParameterError(f"--tune-report {path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidParameterError(f"--tune-report {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidParameterError(f"--tune-report {path} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidParameterError(f"--tune-report {path} is not a `spectune tune` report")
    return data


def _cached(out_dir: Path, name: str) -> StageRun | None:
    """A stage's file in ``out_dir`` as read back, or None where there is none; one that
    is not a stage record is a one-line error (measure it again with ``--force``)."""
    path = stage_path(out_dir, name)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return StageRun(name, record["data"], float(record["seconds"]), cached=True)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise InvalidParameterError(
            f"{path} is not a stage record ({type(exc).__name__}: {exc}); measure it again "
            f"with --stages {name} --force"
        ) from None


def _measures(
    args: argparse.Namespace, setup: Setup, out_dir: Path, tune_report: dict[str, Any] | None
) -> dict[str, tuple[dict[str, Any], Callable[[], dict[str, Any]]]]:
    from spectune.experiments.evidence import measure
    from spectune.experiments.trees import tree_vs_chain

    toy = args.toy
    tokens = args.max_tokens or (12 if toy else 128)
    long_tokens = 32 if toy else args.long_tokens
    sweep = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    ks = (1, 2, 4) if toy else (1, 2, 3, 4, 6)
    policy_temps = (0.0, 1.0)
    memory_ks, nodes = ((1, 4), (4, 8)) if toy else ((1, 2, 4, 8), (4, 8, 16))
    budgets = (4,) if toy else (4, 8)
    found: dict[str, tuple[dict[str, Any], Callable[[], dict[str, Any]]]] = {
        "temperature": (
            {"temperatures": sweep, "max_tokens": tokens},
            lambda: measure.acceptance_by_temperature(setup, sweep, tokens),
        ),
        "position": (
            {"k": 4, "long_tokens": long_tokens, "window": long_tokens // 8},
            lambda: measure.acceptance_by_position(
                setup, k=4, long_tokens=long_tokens, window=long_tokens // 8
            ),
        ),
        "policies": (
            {"temperatures": policy_temps, "ks": ks, "max_tokens": tokens},
            lambda: measure.policies(setup, temperatures=policy_temps, ks=ks, max_tokens=tokens),
        ),
        "memory": (
            {"ks": memory_ks, "tree_nodes": nodes, "max_tokens": 8 if toy else 32},
            lambda: measure.verify_memory(
                setup, ks=memory_ks, tree_nodes=nodes, max_tokens=8 if toy else 32
            ),
        ),
        "costs": ({"max_tokens": tokens}, lambda: measure.costs(setup, max_tokens=tokens)),
        "tree": (
            {"budgets": budgets, "widths": (2,), "temperatures": (0.0,), "max_tokens": tokens},
            lambda: {
                "rows": [
                    r.as_dict()
                    for r in tree_vs_chain(
                        setup, budgets=budgets, widths=(2,), temperatures=(0.0,), max_tokens=tokens
                    )
                ]
            },
        ),
        "drafts": _drafts_stage(args, setup, out_dir, tokens),
    }
    if tune_report is not None:
        keep = ("parameters", "predicted", "confirm", "command")
        tuned = {"source": str(args.tune_report), **{k: tune_report.get(k) for k in keep}}
        found["tuned"] = ({"tune_report": str(args.tune_report)}, lambda: tuned)
    return found


def _drafts_stage(
    args: argparse.Namespace, setup: Setup, out_dir: Path, tokens: int
) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    from spectune.distill.train import Budget, TrainSettings
    from spectune.experiments.evidence.drafts import distill_drafts, parse_sizes, score_drafts

    if args.toy:
        specs = (*parse_sizes("1x4,1x16,2x32"), *parse_sizes("1x16", "gpt2"))
        budget, label = Budget(max_steps=20), "20 optimizer steps"
        settings = TrainSettings(learning_rate=3e-3, warmup_steps=5, batch_tokens=512)
    else:
        specs = (*parse_sizes(args.draft_sizes), *parse_sizes(args.family_size, "gpt2"))
        budget, label = Budget(max_minutes=args.distill_minutes), f"{args.distill_minutes:g} min"
        settings = TrainSettings()

    def measure() -> dict[str, Any]:
        # Trained drafts and corpus features are large and rebuilt by the command: keep
        # them out of git wherever the output folder is.
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / ".gitignore").write_text("drafts/\nanswer-features/\n", encoding="utf-8")
        distill_drafts(
            _target_net(setup),
            _corpora(args, setup, out_dir),
            specs,
            out_dir,
            budget=budget,
            settings=settings,
            force=args.force,
        )
        return score_drafts(setup, specs, out_dir, max_tokens=tokens, budget=label)

    names = [s.name for s in specs]
    return {"drafts": names, "budget": label, "answer_shards": args.answer_shards}, measure


def _target_net(setup: Setup) -> Any:
    from spectune.models.llama import LlamaLM

    if not isinstance(setup.target, LlamaLM):
        raise InvalidParameterError("distilling drafts needs a target on the native runtime")
    return setup.target


def _corpora(args: argparse.Namespace, setup: Setup, out_dir: Path) -> tuple[Any, Any]:
    """(training corpus, held-out corpus or None): the toy target's own continuations of
    random prompts, or the answer corpus's features."""
    from spectune.distill.data import GenerationSettings, build_answer_features
    from spectune.distill.data import corpus_from_token_ids as from_ids

    target = _target_net(setup)
    if args.toy:
        import torch

        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 64, (6,), generator=generator).tolist() for _ in range(48)]
        return from_ids(
            target, prompts, GenerationSettings(max_new_tokens=16, batch_size=24, top_k=16)
        ), None
    if not args.answers.is_dir():
        raise InvalidParameterError(
            f"--answers {args.answers}: no answer corpus (make one with `spectune corpus`)"
        )
    return build_answer_features(
        target,
        args.answers,
        out_dir / "answer-features" / args.answers.resolve().name,
        max_shards=args.answer_shards,
    )


def _write(args: argparse.Namespace, runs: list[StageRun], report: Path, setup: Setup) -> None:
    from spectune.experiments.evidence.report import write_plots, write_report
    from spectune.experiments.evidence.rules import judge_all

    findings = judge_all({r.name: r.data for r in runs})
    plots = write_plots({r.name: r.data for r in runs}, args.out_dir)
    words = shlex.split(args.command_line)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--stages":
            skip = True
        elif word != "--force" and not word.startswith("--stages="):
            kept.append(word)
    stage_command = shlex.join(kept).replace("{", "{{").replace("}", "}}")
    write_report(
        report,
        findings,
        runs,
        command=args.command_line,
        stage_command=stage_command + " --stages {stages} --force",
        setup=setup.description,
        plots=plots,
        plot_dir=os.path.relpath(args.out_dir, report.parent),
    )
    width = max(len(f.title) for f in findings)
    for f in findings:
        print(f"{f.title:<{width}}  {f.verdict}")
    print(f"report: {report}")
