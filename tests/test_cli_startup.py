"""``spectune --help`` starts without torch: the parsers read plain names, and those names
are the ones the modules that act on them accept."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "numba", "fastapi", "matplotlib")


def _imported_after(code: str) -> list[str]:
    loaded = f"[n for n in {HEAVY!r} if n in sys.modules]"
    probe = f"import json, sys\n{code}\nprint(json.dumps({loaded}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    names: list[str] = json.loads(result.stdout)
    return names


def test_the_parsers_import_no_heavy_library() -> None:
    assert _imported_after("import spectune.cli; spectune.cli.build_parser()") == []


def test_import_spectune_loads_its_names_on_first_use() -> None:
    assert _imported_after("import spectune") == []
    assert "torch" in _imported_after("import spectune; spectune.SpeculativeEngine")


def test_the_parsers_choices_are_the_names_the_runtime_takes() -> None:
    from spectune.control import registry
    from spectune.control.config import POLICIES
    from spectune.drafters.pairing import TARGET_PRECISIONS
    from spectune.models.names import PRECISION_NAMES
    from spectune.models.names import TARGET_PRECISIONS as NAMED_TARGET_PRECISIONS
    from spectune.models.quant import PRECISIONS

    assert tuple(PRECISIONS) == PRECISION_NAMES
    assert TARGET_PRECISIONS == NAMED_TARGET_PRECISIONS
    assert tuple(registry._POLICIES) == POLICIES  # the policies make_policy builds


LAZY_PACKAGES = (
    "spectune",
    "spectune.bench",
    "spectune.control",
    "spectune.decode",
    "spectune.drafters",
    "spectune.models",
    "spectune.monitor",
    "spectune.verify",
)


def test_every_lazily_exported_name_resolves() -> None:
    """A package lists its names twice (for mypy, and for loading on first use): each name
    in ``__all__`` must load."""
    import importlib

    for name in LAZY_PACKAGES:
        package = importlib.import_module(name)
        missing = [member for member in package.__all__ if not hasattr(package, member)]
        assert not missing, f"{name} does not load {missing}"
