"""``spectune bench``: spectune against plain decoding and transformers, side by side.

Layout by role: ``plan`` (configuration, prompts, budget), ``systems`` (what is compared),
``assemble`` (loading models and building systems), ``runner`` (interleaved timing),
``summary`` (numbers and the analytic bound), ``report`` / ``plots`` (outputs), ``live``
(the progress view), ``suite`` (the whole run).
"""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.bench.assemble import Workbench, build_systems, load_workbench, random_draft
    from spectune.bench.plan import BenchConfig, BenchPrompt, load_bench_prompts
    from spectune.bench.runner import Measurement, Schedule, run_interleaved
    from spectune.bench.suite import run_suite
    from spectune.bench.summary import Mismatch, Row, summarize
    from spectune.bench.systems import CallResult, HFSystem, SpectuneSystem, System, SystemInfo
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.bench.assemble": [
                "Workbench",
                "build_systems",
                "load_workbench",
                "random_draft",
            ],
            "spectune.bench.plan": ["BenchConfig", "BenchPrompt", "load_bench_prompts"],
            "spectune.bench.runner": ["Measurement", "Schedule", "run_interleaved"],
            "spectune.bench.suite": ["run_suite"],
            "spectune.bench.summary": ["Mismatch", "Row", "summarize"],
            "spectune.bench.systems": [
                "CallResult",
                "HFSystem",
                "SpectuneSystem",
                "System",
                "SystemInfo",
            ],
        },
    )

__all__ = [
    "BenchConfig",
    "BenchPrompt",
    "CallResult",
    "HFSystem",
    "Measurement",
    "Mismatch",
    "Row",
    "Schedule",
    "SpectuneSystem",
    "System",
    "SystemInfo",
    "Workbench",
    "build_systems",
    "load_bench_prompts",
    "load_workbench",
    "random_draft",
    "run_interleaved",
    "run_suite",
    "summarize",
]
