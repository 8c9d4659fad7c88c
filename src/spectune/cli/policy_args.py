"""``--policy``, ``--policy-file``, ``--policy-opt``, ``--trace``: shared by the subcommands
that decode (``generate`` here; the server and the benchmark may use it too)."""

from __future__ import annotations

import argparse

from spectune.control.config import (
    DEFAULT_POLICY,
    POLICIES,
    PolicySpec,
    merge_options,
    parse_policy_opts,
    policy_spec,
)
from spectune.records import validate_k

__all__ = ["add_policy_args", "policy_spec_from_args"]


def add_policy_args(parser: argparse.ArgumentParser, *, trace: bool = True) -> None:
    parser.add_argument(
        "-k",
        "--k",
        type=int,
        default=None,
        help="draft tokens per step: fixed K for --policy fixed, else the policy's largest "
        "starting K (initial_k, default 4): threshold starts there; cost starts at the K in "
        "1..initial_k that the machine's verification curve predicts best (often 1-3 on a CPU)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help=f"K policy (default: the policy file's, else {DEFAULT_POLICY})",
    )
    parser.add_argument("--policy-file", default=None, help="TOML file with the policy options")
    parser.add_argument(
        "--policy-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one policy option, e.g. raise_above=0.85 or local.bad_steps=6 (repeatable)",
    )
    if trace:
        parser.add_argument("--trace", default=None, help="write a JSON-lines step trace here")


def policy_spec_from_args(args: argparse.Namespace) -> PolicySpec:
    """The file, then ``-k`` (K of ``fixed``, initial K of the others), then ``--policy-opt``."""
    spec = policy_spec(args.policy, args.policy_file)
    options = dict(spec.options)
    k = getattr(args, "k", None)
    if k is not None:
        options = merge_options(
            options, {"k" if spec.name == "fixed" else "initial_k": validate_k(k)}
        )
    return PolicySpec(spec.name, merge_options(options, parse_policy_opts(args.policy_opt)))
