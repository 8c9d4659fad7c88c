"""Policy configuration: a policy name and its options, from a TOML file and the CLI.

A policy file names the policy and sets any of its options; tables configure the
fallback checks::

    name = "threshold"          # threshold | cost | fixed
    initial_k = 4
    checks = ["global", "local"]

    [local]
    bad_steps = 6

    [global]
    max_draft_ratio = 0.5

On the command line, ``--policy-opt key=value`` overrides one option (``local.bad_steps=6``
reaches into a table); the value is read as a TOML value (``0.85``, ``true``,
``["local"]``) and as a plain string when it is not one. Options land in frozen
dataclasses (``options_into``), so a misspelt key or a wrong type is a one-line error,
never a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from spectune.errors import InvalidParameterError

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "PolicySpec",
    "load_policy_file",
    "merge_options",
    "options_into",
    "parse_policy_opts",
    "policy_spec",
]

T = TypeVar("T")

# The policy a request gets when none is named. ``cost`` measured best or tied on the default
# pair for every drafter (docs/results/bench-eagle3-t0: T = 0, smollm2-draft 1.18x against
# threshold's 1.06x, suffix 1.38x against 1.27x, ngram 1.25x against 1.19x; tied at T = 0.7).
DEFAULT_POLICY = "cost"
POLICIES = ("threshold", "cost", "fixed")  # the names make_policy builds (control.registry)


@dataclass(frozen=True)
class PolicySpec:
    """Which policy to build and with which options (nested: tables for the checks)."""

    name: str = DEFAULT_POLICY
    options: Mapping[str, Any] = field(default_factory=dict)


def load_policy_file(path: str | Path) -> PolicySpec:
    """Read a TOML policy file; ``name`` picks the policy (default: ``DEFAULT_POLICY``)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise InvalidParameterError(f"cannot read policy file {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"policy file {path} is not valid TOML: {exc}") from exc
    name = data.pop("name", DEFAULT_POLICY)
    if not isinstance(name, str):
        raise InvalidParameterError(f"policy file {path}: 'name' must be a string")
    return PolicySpec(name, data)


def parse_policy_opts(items: Sequence[str]) -> dict[str, Any]:
    """``["raise_above=0.85", "local.bad_steps=6"]`` -> nested options."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidParameterError(f"--policy-opt wants key=value, got {item!r}")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word: take it as a string
        *tables, leaf = key.split(".")
        target = options
        for table in tables:
            target = target.setdefault(table, {})
            if not isinstance(target, dict):
                raise InvalidParameterError(f"--policy-opt {key}: {table} is not a table")
        target[leaf] = value
    return options


def merge_options(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: tables merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in overrides.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = merge_options(old, value)
        else:
            merged[key] = value
    return merged


def policy_spec(
    name: str | None = None,
    file: str | Path | None = None,
    opts: Sequence[str] = (),
) -> PolicySpec:
    """The CLI's view: a file (optional), its name overridden by ``name``, then ``opts``."""
    spec = load_policy_file(file) if file is not None else PolicySpec()
    return PolicySpec(
        name if name is not None else spec.name,
        merge_options(spec.options, parse_policy_opts(opts)),
    )


def options_into(cls: type[T], options: Mapping[str, Any], where: str) -> T:
    """Build the frozen options dataclass ``cls`` from a mapping, checking keys and types.

    Range checks are the dataclass's own (its ``__post_init__``).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidParameterError(
            f"unknown {where} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values = {key: _coerce(value, hints[key], f"{where}.{key}") for key, value in options.items()}
    return cls(**values)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif typing.get_origin(hint) is tuple:  # tuple[str, ...]
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arm in typing.get_args(hint):
            if arm is type(None) and value is None:
                return None
            if arm is not type(None):
                try:
                    return _coerce(value, arm, name)
                except InvalidParameterError:
                    continue
    elif hint is str and isinstance(value, str):
        return value
    raise InvalidParameterError(f"option {name} must be {_describe(hint)}, got {value!r}")


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, str(hint)
    )
