"""The seed's rules, in report order: statement, stages, judge and criterion of each
(the judges are in ``judges``), and ``judge_all``, which turns stage data into findings."""

from __future__ import annotations

from collections.abc import Callable

from spectune.experiments.evidence.judges import (
    NOT_RUN,
    VERDICTS,
    Finding,
    Stages,
    code,
    disable,
    draft_size,
    family,
    finished,
    hot_k,
    k_bands,
    memory,
    pause,
    position,
    start_k,
    temperature,
    tiny_draft,
    trees,
    tuned,
)

__all__ = ["RULES", "VERDICTS", "Finding", "judge_all"]

Judge = Callable[[Finding, Stages], Finding]


def _rule(
    key: str, title: str, statement: str, stages: tuple[str, ...], judge: Judge, criterion: str
) -> tuple[Finding, Judge]:
    return Finding(key, title, statement, stages, criterion=criterion), judge


RULES: tuple[tuple[Finding, Judge], ...] = (
    _rule(
        "draft-size",
        "Draft size",
        "Drafts of 1/10 to 1/4 of the target's size work best.",
        ("drafts",),
        draft_size,
        "holds when the draft with the best predicted speedup is 1/10 to 1/4 of the target; "
        "otherwise the best share is the different number",
    ),
    _rule(
        "tiny-draft",
        "Very small drafts",
        "Under 1/20 of the target's size, acceptance falls below 50%.",
        ("drafts",),
        tiny_draft,
        "holds when every draft under 1/20 of the target has greedy alpha below 50%",
    ),
    _rule(
        "family",
        "Architecture family",
        "A draft from another architecture family loses 15-25% acceptance.",
        ("drafts",),
        family,
        "holds when the GPT-2-style draft's greedy alpha is 15-25% below the Llama-style draft's "
        "nearest in size; a different number when it is lower by another share; does not hold when"
        " it is not lower",
    ),
    _rule(
        "temperature",
        "Temperature",
        "T > 1 costs 10-20% acceptance.",
        ("temperature",),
        temperature,
        "the cost is 1 - (mean alpha over the measured T > 1) / (alpha at T = 0); holds at 10-20%,"
        " a different number when positive elsewhere, does not hold when not positive",
    ),
    _rule(
        "code",
        "Code against chat",
        "Code is accepted less often than chat.",
        ("temperature",),
        code,
        "holds when code's greedy alpha is below multi-turn chat's",
    ),
    _rule(
        "position",
        "Long outputs",
        "Acceptance falls late in long outputs.",
        ("position",),
        position,
        "over outputs that reach the long length, holds when acceptance in the last quarter of "
        "positions is below the first quarter's",
    ),
    _rule(
        "trees",
        "Trees",
        "Trees add 15-30%.",
        ("tree",),
        trees,
        "the best tokens/s gain of a tree over a chain of equal target cost at T = 0; holds at "
        "15-30%, a different number when positive elsewhere, does not hold when not positive",
    ),
    _rule(
        "start-k",
        "Initial K",
        "Start K at 3-4.",
        ("policies",),
        start_k,
        "holds when the fastest fixed K at T = 0 is 3 or 4; otherwise that K is the different "
        "number",
    ),
    _rule(
        "k-bands",
        "Raising and lowering K",
        "Raise K above 80% acceptance, lower it below 60%.",
        ("policies",),
        k_bands,
        "holds when the seed's threshold controller runs within 5% of the fastest fixed K at T = 0"
        " (tokens/s)",
    ),
    _rule(
        "hot-k",
        "K at high temperature",
        "Use K - 1 above T = 0.7.",
        ("policies",),
        hot_k,
        "holds when the fastest fixed K above T = 0.7 is one below the fastest at T = 0; a "
        "different number when lower by more; does not hold when not lower",
    ),
    _rule(
        "pause",
        "Pausing",
        "Pause speculation after 5 steps under 50% acceptance.",
        ("policies",),
        pause,
        "holds when the controller with the pause runs at 98% or more of its speed without the "
        "pause at every temperature measured",
    ),
    _rule(
        "disable",
        "Disabling",
        "Disable speculation when drafting costs over 50% of a target step.",
        ("costs", "temperature"),
        disable,
        "the break-even draft cost max over K of (E[tokens per step] - v(K)) / K from alpha at T ="
        " 0 and the measured cost curve v; holds within 40-60% of a target step, otherwise it is "
        "the different number",
    ),
    _rule(
        "memory",
        "Verification peak memory",
        "Verification needs more memory as K and the tree grow (verify_peak_bytes).",
        ("memory",),
        memory,
        "holds when the mean peak grows (never falls) with chain K and with tree nodes",
    ),
    _rule(
        "tuned",
        "Tuned thresholds",
        "The seed's thresholds suit this workload and machine (against `spectune tune`'s).",
        ("tuned",),
        tuned,
        "holds when `spectune tune` kept every seed value; otherwise the changed values are the "
        "different numbers",
    ),
)


def judge_all(stages: Stages) -> list[Finding]:
    """One finding per rule; a rule whose stages did not run is ``not run``."""
    findings = []
    for template, judge in RULES:
        if not all(name in stages for name in template.stages):
            findings.append(finished(template, NOT_RUN, "not measured: the stage did not run.", {}))
            continue
        finding = judge(template, stages)
        if not finding.measured:  # the stage ran without what this rule needs
            note = "not measured: the stage ran but measured nothing this rule reads."
            finding = finished(template, NOT_RUN, note, {})
        findings.append(finding)
    return findings
