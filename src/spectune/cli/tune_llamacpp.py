"""``spectune tune --engine llamacpp``: measure a real ``llama-server``'s speculation flags on
the prompts and keep the fastest (``spectune.engines.llamacpp.tuning``); writes the flags as
JSON."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from spectune.cli.common import parse_numbers, round_robin
from spectune.cli.paths import executable, output_file, write_text
from spectune.engines.llamacpp.server import BUILT_BINARY, default_server_binary
from spectune.engines.names import engine_arg
from spectune.errors import InvalidParameterError
from spectune.models.machine import LoadMeter

__all__ = ["add_args", "run_llamacpp"]


def add_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "--engine llamacpp", "measure llama-server's own speculation flags instead"
    )
    group.add_argument(
        "--engine",
        type=engine_arg(("spectune", "llamacpp", "vllm")),
        metavar="{spectune,llamacpp,vllm}",
        default="spectune",
        help="spectune: fit spectune's K policy (default); llamacpp: start llama-server with "
        "each flag set and keep the fastest measured",
    )
    group.add_argument(
        "--server-binary",
        type=Path,
        default=None,
        help="llama-server to run (default: $LLAMA_SERVER, llama-server on PATH, or "
        f"{BUILT_BINARY} from scripts/build-llama-server.sh)",
    )
    group.add_argument("--n-max", default="1,2,3,4,6,8", help="--spec-draft-n-max values")
    group.add_argument("--p-min", default="0,0.5,0.8", help="--spec-draft-p-min values")
    group.add_argument(
        "--no-ngram", action="store_true", help="leave out ngram-simple prompt lookup"
    )
    group.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of the confirmation"
    )
    group.add_argument(
        "--finalists",
        type=int,
        default=3,
        help="best screened flag sets confirmed beside off and llama.cpp's defaults",
    )


def _check(args: argparse.Namespace) -> tuple[Path, Path, Path | None, list[int], list[float]]:
    """Every setting, before anything is converted or started: the server binary, the
    target, the draft as given (``check_draft``), the --n-max and --p-min grids."""
    from spectune.engines.llamacpp.flags import check_draft
    from spectune.models.loading import resolve_model_path

    if args.trace:
        raise InvalidParameterError("--engine llamacpp replays prompts, not --trace files")
    if args.draft == "none":
        raise InvalidParameterError("tuning needs a drafter (--draft: a .gguf, a folder, ngram)")
    if parse_numbers(args.temperatures, float, "--temperatures") != (0.0,):
        raise InvalidParameterError("--engine llamacpp measures greedy decoding (--temperatures 0)")
    n_max = list(parse_numbers(args.n_max, int, "--n-max"))
    p_min = list(parse_numbers(args.p_min, float, "--p-min"))
    if any(n < 1 for n in n_max) or any(not 0 <= p <= 1 for p in p_min):
        raise InvalidParameterError("--n-max values must be >= 1 and --p-min values in [0, 1]")
    for name in ("rounds", "finalists", "confirm_prompts", "limit_per_category"):
        if getattr(args, name) < 1:
            raise InvalidParameterError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_tokens < 2:
        raise InvalidParameterError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    target = resolve_model_path(args.target)
    if target.suffix != ".gguf":
        raise InvalidParameterError(f"--target {args.target}: llama-server loads a .gguf file")
    draft = check_draft(args.draft)
    return _server_binary(args), target, draft, n_max, p_min


def _server_binary(args: argparse.Namespace) -> Path:
    """``--server-binary`` or the default one, as a program that can be started."""
    binary: Path | None = args.server_binary or default_server_binary()
    if binary is None or not binary.exists():
        raise InvalidParameterError(
            f"no llama-server at {binary}; build one with scripts/build-llama-server.sh or "
            "give --server-binary"
            if binary is not None
            else "no llama-server found; build one with scripts/build-llama-server.sh, or give "
            "--server-binary / set LLAMA_SERVER"
        )
    return executable(binary, "--server-binary")


def run_llamacpp(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from spectune.engines.llamacpp.flags import draft_gguf
    from spectune.engines.llamacpp.tuning import flag_grid, tune_llamacpp
    from spectune.prompts import load_prompts

    binary, target, draft_source, n_max, p_min = _check(args)
    out = output_file(
        args.out or Path("llamacpp-flags.json"), "--out", [("--prompts", args.prompts)]
    )
    categories = tuple(c.strip() for c in args.categories.split(",")) if args.categories else None
    screen = load_prompts(
        args.prompts, categories=categories, split="dev", limit_per_category=args.limit_per_category
    )
    confirm = round_robin(
        load_prompts(args.prompts, categories=categories, split="test"), args.confirm_prompts
    )
    draft = draft_gguf(draft_source, target)
    candidates = flag_grid(draft, n_max, p_min, ngram=not args.no_ngram)
    if len(candidates) < 2:
        raise InvalidParameterError("nothing to tune: no draft model and --no-ngram")
    threads = args.threads or os.cpu_count() or 1
    console = Console()
    console.print(
        f"{len(candidates)} llama-server flag sets on {target.name}, {threads} thread(s) each; "
        f"screening on {len(screen)} dev prompts, confirming the best {args.finalists} with off "
        f"and llama.cpp's defaults on {len(confirm)} test prompts x {args.rounds} rounds, "
        f"{args.max_tokens} tokens each"
    )
    requests = len(candidates) * len(screen) + (args.finalists + 2) * len(confirm) * args.rounds
    meter = LoadMeter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("starting servers", total=requests)
        result = tune_llamacpp(
            binary,
            target,
            candidates,
            screen,
            confirm,
            max_tokens=args.max_tokens,
            rounds=args.rounds,
            finalists=args.finalists,
            threads=threads,
            on_start=lambda c: bar.update(task, description=f"starting: {c.name}"),
            progress=lambda: bar.update(task, advance=1, description="replaying prompts"),
        )
    load = meter.stop()
    data = result.to_json()
    data["machine_load"] = load.as_json()
    winner = result.winner
    data["command"] = shlex.join(["llama-server", "--model", str(target), *winner["args"]])
    data["written_by"] = args.command_line
    write_text(out, json.dumps(data, indent=2) + "\n")
    _table(console, "screening (dev prompts, one pass)", result.screen)
    _table(console, "confirmation (held-apart test prompts, interleaved)", result.confirm)
    console.print(result.verdict)
    if load.busy:
        console.print(f"note: {load.line('the tuning')}")
    console.print(f"flags: {data['command']}")
    console.print(f"wrote {out}")
    return 0


def _table(console: Any, title: str, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("flags", no_wrap=True)
    for column in ("tokens/s", "vs off", "accepted", "greedy = off"):
        table.add_column(column, justify="right")
    for row in rows:
        speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
        if row["speedup_spread"] is not None:
            speedup += f" ±{row['speedup_spread']:.2f}"
        table.add_row(
            row["name"],
            f"{row['tokens_per_second']:.1f}",
            speedup,
            "-" if row["acceptance"] is None else f"{row['acceptance']:.0%}",
            f"{row['greedy_equal']}/{row['requests']}",
        )
    console.print(table)
