"""``spectune tune --engine vllm``: measure vLLM's speculation configurations on real vLLM
servers (``spectune.engines.vllm.tune``) and write a ready ``--speculative-config`` with a
batch-size schedule, the cost profile ``watch --costs`` reads, a report and a plot."""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

from spectune.cli.common import parse_numbers
from spectune.cli.paths import distinct_outputs, output_file, write_text
from spectune.errors import InvalidParameterError

__all__ = ["add_args", "run_vllm"]

DEFAULT_LEVELS, QUICK_LEVELS = (1, 2, 4, 8), (1, 2)
DEFAULT_PER_CELL, QUICK_PER_CELL = 8, 4


def add_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "--engine vllm", "measure vLLM's own speculation configurations (needs make vllm)"
    )
    group.add_argument(
        "--concurrency",
        default=None,
        help="clients sending each batch at once, the batch sizes the schedule covers "
        "(1,2,4,8; --quick: 1,2)",
    )
    group.add_argument(
        "--per-cell",
        type=int,
        default=None,
        help="prompts per batch, at least the largest --concurrency (8; --quick: 4)",
    )
    group.add_argument("--stream", action="store_true", help="stream every answer (SSE)")
    group.add_argument(
        "--methods", default="ngram,suffix", help="vLLM's model-free methods to grid"
    )
    group.add_argument("--k", default="2,4", help="K values of ngram, suffix, a draft model")
    group.add_argument(
        "--ngram-lookup", default="2:4", help="prompt_lookup_min:max pairs for ngram"
    )
    group.add_argument("--suffix-depth", default="24", help="suffix tree depths")
    group.add_argument("--suffix-min-prob", default="0.1", help="suffix min token probs")
    group.add_argument(
        "--suffix-cache",
        default="on,off",
        help="suffix decoding's global cache of earlier answers: on, off or both",
    )
    group.add_argument(
        "--eagle-head",
        type=Path,
        default=None,
        help="an EAGLE-3 head folder (spectune convert --draft HEAD --target FOLDER)",
    )
    group.add_argument("--eagle-k", default="1,2,3,4", help="K values of the EAGLE-3 head")
    group.add_argument(
        "--draft-model", type=Path, default=None, help="a draft model folder (Hugging Face)"
    )
    group.add_argument(
        "--no-builtins",
        action="store_true",
        help="leave out vLLM's ngram and suffix at their defaults (measured for comparison)",
    )
    group.add_argument(
        "--noise-z",
        type=float,
        default=2.0,
        help="standard errors a gain over off must clear at a concurrency to speculate there",
    )
    group.add_argument(
        "--quick",
        action="store_true",
        help="the CI-sized grid: K=3, one setting per method, no built-ins, concurrency 1,2",
    )
    group.add_argument("--costs", type=Path, default=None, help="cost profile (OUT-costs.json)")
    group.add_argument("--plot", type=Path, default=None, help="speedup plot (OUT with .png)")


def _pairs(text: str) -> tuple[tuple[int, int], ...]:
    pairs = []
    for item in text.split(","):
        low, sep, high = item.strip().partition(":")
        if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
            raise InvalidParameterError(
                f"--ngram-lookup wants MIN:MAX pairs with 1 <= MIN <= MAX, got {item!r}"
            )
        pairs.append((int(low), int(high)))
    return tuple(pairs)


def _cache(text: str) -> tuple[bool, ...]:
    values = [v.strip() for v in text.split(",")]
    if not values or any(v not in ("on", "off") for v in values):
        raise InvalidParameterError(f"--suffix-cache takes on, off or on,off; got {text!r}")
    return tuple(v == "on" for v in dict.fromkeys(values))


def _folder(path: Path | None, flag: str, speculators: bool) -> Path | None:
    """A model folder vLLM loads: config.json, and for a head the speculators format."""
    if path is None:
        return None
    config = path / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidParameterError(f"{flag} {path}: no readable config.json") from None
    is_head = isinstance(data, dict) and data.get("speculators_model_type") == "eagle3"
    if speculators and not is_head:
        raise InvalidParameterError(
            f"{flag} {path} is not a vLLM EAGLE-3 head (write one with spectune convert --draft)"
        )
    if not speculators and is_head:
        raise InvalidParameterError(f"--draft-model {path} is an EAGLE-3 head: use --eagle-head")
    return path.resolve()


def _grid(args: argparse.Namespace) -> Any:
    from spectune.engines.vllm.tune_grid import MODEL_FREE, Grid

    methods = tuple(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
    unknown = [m for m in methods if m not in MODEL_FREE]
    if unknown:
        raise InvalidParameterError(f"--methods takes {', '.join(MODEL_FREE)}; got {unknown}")
    k = parse_numbers(args.k, int, "--k")
    eagle_k = parse_numbers(args.eagle_k, int, "--eagle-k")
    depth = parse_numbers(args.suffix_depth, int, "--suffix-depth")
    prob = parse_numbers(args.suffix_min_prob, float, "--suffix-min-prob")
    if min(k) < 1 or min(eagle_k) < 1 or min(depth) < 1 or not all(0 <= p <= 1 for p in prob):
        raise InvalidParameterError(
            "--k, --eagle-k and --suffix-depth values must be >= 1, --suffix-min-prob in [0, 1]"
        )
    grid = Grid(
        methods=methods,
        k=k,
        ngram_lookup=_pairs(args.ngram_lookup),
        suffix_depth=depth,
        suffix_min_prob=prob,
        suffix_cache=_cache(args.suffix_cache),
        eagle_head=_folder(args.eagle_head, "--eagle-head", speculators=True),
        eagle_k=eagle_k,
        draft_model=_folder(args.draft_model, "--draft-model", speculators=False),
        builtins=not args.no_builtins,
    )
    return grid.quick() if args.quick else grid


def _target(ref: str) -> tuple[Path, bool]:
    """The folder vLLM serves, and whether it must be converted first (``default`` or a
    GGUF: into spectune's cache, once)."""
    from spectune.engines.hf_folder import check_source
    from spectune.models.cache_dir import derived_path
    from spectune.models.loading import resolve_model_path

    path = resolve_model_path(ref)
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve(), False
    out = derived_path(path, "vllm-target")
    check_source(ref, out)
    return out, True


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting, before any model is converted or any server started."""
    from spectune.engines.vllm.setup import find_vllm_python
    from spectune.engines.vllm.tune import allot
    from spectune.engines.vllm.tune_grid import candidates
    from spectune.prompts import load_prompts

    if args.trace:
        raise InvalidParameterError("--engine vllm measures prompts, not --trace files")
    if getattr(args, "chat_template", None) is not None:
        raise InvalidParameterError(
            "--chat-template applies to spectune's engine; vLLM applies the model folder's "
            "own chat template"
        )
    if args.draft is not None:
        raise InvalidParameterError(
            "--engine vllm takes its drafts as --eagle-head, --draft-model or --methods"
        )
    temperatures = parse_numbers(args.temperatures, float, "--temperatures")
    if len(temperatures) != 1 or not temperatures[0] >= 0:
        raise InvalidParameterError("--engine vllm measures one temperature (>= 0)")
    if args.max_tokens < 2:
        raise InvalidParameterError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    if args.rounds < 1:
        raise InvalidParameterError("--rounds must be >= 1")
    if not args.noise_z >= 0:
        raise InvalidParameterError("--noise-z must be >= 0")
    levels = (
        parse_numbers(args.concurrency, int, "--concurrency")
        if args.concurrency
        else (QUICK_LEVELS if args.quick else DEFAULT_LEVELS)
    )
    if min(levels) < 1 or max(levels) > 256 or len(set(levels)) != len(levels):
        raise InvalidParameterError("--concurrency values must be distinct, in 1..256")
    levels = tuple(sorted(levels))
    per_cell = args.per_cell or (QUICK_PER_CELL if args.quick else DEFAULT_PER_CELL)
    if per_cell < max(levels):
        raise InvalidParameterError(
            f"--per-cell {per_cell} is under the largest --concurrency {max(levels)}: "
            "that many clients would never be busy at once"
        )
    grid = _grid(args)
    found = candidates(grid)
    if len(found) < 2:
        raise InvalidParameterError("nothing to tune: no --methods, --eagle-head or --draft-model")
    categories = tuple(c.strip() for c in args.categories.split(",")) if args.categories else None
    dev = load_prompts(args.prompts, categories=categories, split="dev")
    test = load_prompts(args.prompts, categories=categories, split="test")
    try:
        screen = allot(dev, levels, per_cell)[0]
        confirm = allot(test, levels, per_cell, args.rounds)
    except ValueError as exc:
        raise InvalidParameterError(
            f"the prompt set's dev split ({len(dev)}) screens and its test split ({len(test)}) "
            f"confirms, each batch with prompts of its own: {exc}; lower --per-cell, "
            "--rounds or the --concurrency levels"
        ) from None
    out = args.out or Path("vllm-speculative-config.json")
    paths = {
        "out": out,
        "report": Path(args.report or out.with_name(out.stem + "-report.md")),
        "costs": args.costs or out.with_name(out.stem + "-costs.json"),
        "plot": args.plot or out.with_suffix(".png"),
    }
    inputs = [("--prompts", args.prompts)]
    named = [
        ("--out", paths["out"]),
        ("--report", paths["report"]),
        ("the report's JSON", paths["report"].with_suffix(".json")),
        ("--costs", paths["costs"]),
        ("--plot", paths["plot"]),
    ]
    for flag, path in named:
        output_file(path, flag, inputs)
    distinct_outputs(named)
    find_vllm_python()  # no vLLM: one line naming make vllm
    target, convert = _target(args.target)
    return {
        "levels": levels,
        "temperature": temperatures[0],
        "candidates": tuple(found),
        "screen": screen,
        "confirm": tuple(confirm),
        "target": target,
        "convert": convert,
        **paths,
    }


def run_vllm(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from spectune.engines.costs import save_costs
    from spectune.engines.hf_folder import convert_target
    from spectune.engines.vllm.tune import TunePlan, check_config, tune_vllm
    from spectune.models.machine import LoadMeter

    checked = _check(args)
    console = Console()
    target: Path = checked["target"]
    if checked["convert"]:
        console.print(f"converting {args.target} for vLLM into {target}")
        convert_target(args.target, target)
    plan = TunePlan(
        target=target,
        candidates=checked["candidates"],
        levels=checked["levels"],
        screen_cells=checked["screen"],
        confirm_cells=checked["confirm"],
        max_tokens=args.max_tokens,
        temperature=checked["temperature"],
        stream=args.stream,
        noise_z=args.noise_z,
        log_dir=Path(tempfile.mkdtemp(prefix="spectune-vllm-tune-")),
    )
    builtins = sum(c.builtin for c in plan.candidates)
    console.print(
        f"{len(plan.candidates)} vLLM configurations on {target.name}: screening on "
        f"{len(plan.screen_cells) * len(plan.screen_cells[plan.levels[0]])} dev prompts, "
        f"then off, the best as a schedule and {builtins} built-in(s) on held-apart prompts, "
        f"{len(plan.confirm_cells)} round(s); concurrency {','.join(map(str, plan.levels))}, "
        f"{args.max_tokens} tokens each; server logs in {plan.log_dir}"
    )
    batches = len(plan.levels) * (len(plan.candidates) + (2 + builtins) * len(plan.confirm_cells))
    meter = LoadMeter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("starting", total=batches)
        result = tune_vllm(
            plan,
            on_start=lambda what: bar.update(task, description=what),
            on_batch=lambda: bar.update(task, advance=1),
        )
    load = meter.stop()
    config = result.speculative_config
    notes = []
    if config is not None and config != result.confirm_configs.get("schedule"):
        console.print("starting vLLM with the schedule as written (the guard changed it)")
        check_config(plan, config)
        notes.append("vLLM started with the written config and answered")
    if load.busy:
        notes.append(load.line("the tuning"))
    data = result.to_json()
    data["machine_load"] = load.as_json()
    data["written_by"] = args.command_line
    data["notes"] = notes
    write_text(checked["out"], json.dumps(config, indent=2) + "\n")
    if result.costs is not None:
        measured_by = (
            f"{args.command_line}: v(K) fitted at concurrency 1 through vLLM; plain step "
            f"{1000 * result.screen['off'][1].seconds / result.screen['off'][1].tokens:.1f} ms"
        )
        save_costs(result.costs, checked["costs"], measured_by)
        data["costs_file"] = str(checked["costs"])
    from spectune.cli.tune_vllm_report import markdown, plot, print_tables

    plot(data, checked["plot"])
    write_text(checked["report"], markdown(data))
    write_text(checked["report"].with_suffix(".json"), json.dumps(data, indent=2) + "\n")
    print_tables(console, data)
    for note in notes:
        console.print(f"note: {note}")
    if config is None:
        schedule = data["schedule"]
        why = schedule["reason"] if schedule else "nothing beat off in the screen"
        console.print(f"keep speculation off: {why} (wrote null to {checked['out']})")
    else:
        flag = json.dumps(config, separators=(",", ":"))
        console.print(f"--speculative-config {shlex.quote(flag)}")
        console.print(f"wrote {checked['out']}")
    if result.costs is not None:
        console.print(f"wrote {checked['costs']} (watch --costs, the proposer's cost policy)")
    console.print(f"wrote {checked['report']}, its JSON and {checked['plot']}")
    return 0
