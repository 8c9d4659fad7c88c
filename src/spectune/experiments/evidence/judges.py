"""How each rule is judged: one function per rule, ``(template, stage data) -> Finding``.

A ``Finding`` is one report section: the rule as the seed states it, what was measured
(with the figures it rests on, read from the stage data and nothing else), and a verdict:

- ``holds``: the measurement agrees with the rule, number included;
- ``holds with a different number``: the direction holds, the number does not (the
  measured one is given);
- ``does not hold here``: the measurement goes the other way on this target and machine;
- ``inconclusive at this budget``: measured, but the measurement cannot tell the cases the
  rule separates apart (no distilled draft got good enough to pay, say), with what would;
- ``not run``: the stage it needs was not run (or had nothing to measure).

The table of rules, with the criterion each verdict follows, is ``rules.RULES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spectune.control.costs import CostCurve, expected_tokens_per_step

__all__ = [
    "NOT_RUN",
    "VERDICTS",
    "Finding",
    "Stages",
    "finished",
    "code",
    "disable",
    "draft_size",
    "family",
    "hot_k",
    "k_bands",
    "memory",
    "pause",
    "position",
    "start_k",
    "temperature",
    "tiny_draft",
    "trees",
    "tuned",
]

HOLDS = "holds"
DIFFERENT = "holds with a different number"
FAILS = "does not hold here"
INCONCLUSIVE = "inconclusive at this budget"
NOT_RUN = "not run"
VERDICTS = (HOLDS, DIFFERENT, FAILS, INCONCLUSIVE, NOT_RUN)
# Said where the drafts stage cannot decide: the drafts need a larger training budget.
_MORE_BUDGET = " A larger `--distill-minutes` (or a GPU) would decide it."

Stages = Mapping[str, Mapping[str, Any]]  # stage name -> its data


@dataclass(frozen=True)
class Finding:
    key: str
    title: str
    rule: str  # as the seed states it
    stages: tuple[str, ...]  # the stages whose files hold the figures
    criterion: str = ""  # how the verdict is decided, in words
    verdict: str = NOT_RUN
    measured: str = ""  # the finding in words, figures included
    figures: Mapping[str, float] = field(default_factory=dict)  # read from the stage data
    plot: str | None = None  # PNG file name beside the report


def _in_range(value: float, low: float, high: float, *, direction_holds: bool) -> str:
    if low <= value <= high:
        return HOLDS
    return DIFFERENT if direction_holds else FAILS


def _rate(accepted: float, drafted: float) -> float:
    return accepted / drafted if drafted else 0.0


def temperature(f: Finding, s: Stages) -> Finding:
    data = s["temperature"]
    by_t = dict(zip(data["temperatures"], data["alpha"], strict=True))
    hot = [a for t, a in by_t.items() if t > 1.0]
    if 0.0 not in by_t or not hot:
        return f
    cold, hot_mean = by_t[0.0], sum(hot) / len(hot)
    cost = 1.0 - hot_mean / cold if cold else 0.0
    at_one = by_t.get(1.0)
    text = (
        f"alpha {cold:.1%} at T = 0, {hot_mean:.1%} averaged over T > 1 "
        f"({', '.join(f'{a:.1%} at T = {t:g}' for t, a in by_t.items() if t > 1.0)}): "
        f"T > 1 costs {cost:.0%} of the greedy acceptance"
    )
    if at_one is not None:
        text += f" ({1.0 - hot_mean / at_one:.0%} against T = 1, {at_one:.1%})" if at_one else ""
    figures = {"alpha_t0": cold, "alpha_above_1": hot_mean, "cost": cost}
    verdict = _in_range(cost, 0.10, 0.20, direction_holds=cost > 0)
    return finished(f, verdict, text + ".", figures, "temperature.png")


def code(f: Finding, s: Stages) -> Finding:
    data = s["temperature"]
    cats = data["per_category"]
    chat = "multi_turn_chat" if "multi_turn_chat" in cats else "chat"
    if "code" not in cats or chat not in cats:
        return f
    index = data["temperatures"].index(0.0) if 0.0 in data["temperatures"] else 0
    t = data["temperatures"][index]
    code, talk = cats["code"][index], cats[chat][index]
    gap = 1.0 - code / talk if talk else 0.0
    counts = data["per_category_positions"]
    side = f"{gap:.0%} below" if gap >= 0 else f"{-gap:.0%} above"
    text = (
        f"alpha at T = {t:g}: code {code:.1%} over {counts.get('code', 0)} positions, {chat} "
        f"{talk:.1%} over {counts.get(chat, 0)} (code {side} chat; every category in the plot)."
    )
    verdict = HOLDS if code < talk else FAILS
    return finished(f, verdict, text, {"code": code, "chat": talk}, "categories.png")


def position(f: Finding, s: Stages) -> Finding:
    data = s["position"]
    drafted, accepted = data["drafted_long"], data["accepted_long"]
    if not data["long_outputs"] or len(drafted) < 2:
        f2 = finished(
            f,
            NOT_RUN,
            f"no output reached {data['long_tokens']} tokens "
            f"(lengths {data['output_lengths']}): nothing to measure.",
            {"long_outputs": 0.0},
        )
        return f2
    quarter = max(1, len(drafted) // 4)
    early = _rate(sum(accepted[:quarter]), sum(drafted[:quarter]))
    late = _rate(sum(accepted[-quarter:]), sum(drafted[-quarter:]))
    end = data["window_starts"][-quarter]
    text = (
        f"over {data['long_outputs']} outputs of {data['long_tokens']}+ tokens (K = "
        f"{data['k']}, T = 0): acceptance {early:.1%} in the first quarter, {late:.1%} "
        f"from token {end} on ({late - early:+.1%})."
    )
    verdict = HOLDS if late < early else FAILS
    figures = {"early": early, "late": late, "long_outputs": float(data["long_outputs"])}
    return finished(f, verdict, text, figures, "position.png")


def trees(f: Finding, s: Stages) -> Finding:
    rows = [r for r in s["tree"]["rows"] if r["temperature"] == 0.0] or s["tree"]["rows"]
    if not rows:
        return f
    best = max(rows, key=lambda r: r["speed_gain"])
    text = (
        f"best at T = {best['temperature']:g}: a width-{best['width']} tree of "
        f"{best['budget']} nodes against a chain of K = {best['budget']} (equal target "
        f"tokens per step): tokens/s {best['speed_gain']:+.0%}, mean accepted length "
        f"{best['accepted_length_gain']:+.0%}."
    )
    gain = best["speed_gain"]
    verdict = _in_range(gain, 0.15, 0.30, direction_holds=gain > 0)
    figures = {"speed_gain": gain, "accepted_length_gain": best["accepted_length_gain"]}
    return finished(f, verdict, text, figures, "trees.png")


def _fixed(s: Stages, temperature: float) -> list[Mapping[str, Any]]:
    rows = s["policies"]["rows"]
    return [r for r in rows if r["temperature"] == temperature and r["fixed_k"]]


def _row(s: Stages, temperature: float, policy: str) -> Mapping[str, Any]:
    rows = s["policies"]["rows"]
    return next(r for r in rows if r["temperature"] == temperature and r["policy"] == policy)


def start_k(f: Finding, s: Stages) -> Finding:
    fixed = _fixed(s, 0.0)
    if not fixed:
        return f
    best = max(fixed, key=lambda r: r["tokens_per_second"])
    plain = _row(s, 0.0, "plain")["tokens_per_second"]
    rates = ", ".join(f"K={r['fixed_k']} {r['tokens_per_second'] / plain:.2f}x" for r in fixed)
    text = f"fastest fixed K at T = 0: K = {best['fixed_k']} (against plain: {rates})."
    verdict = HOLDS if 3 <= best["fixed_k"] <= 4 else DIFFERENT
    return finished(f, verdict, text, {"best_k": float(best["fixed_k"])}, "policies.png")


def k_bands(f: Finding, s: Stages) -> Finding:
    fixed = _fixed(s, 0.0)
    if not fixed:
        return f
    best = max(fixed, key=lambda r: r["tokens_per_second"])
    rule = _row(s, 0.0, "threshold")
    ratio = rule["tokens_per_second"] / best["tokens_per_second"]
    bands = ", ".join(f"K={r['fixed_k']} {r['acceptance']:.0%}" for r in fixed)
    text = (
        f"the seed's controller (mean K {rule['mean_k']:.2f}) runs at {ratio:.2f}x the best "
        f"fixed K (K = {best['fixed_k']}) at T = 0; accepted/drafted at each fixed K: {bands}."
    )
    verdict = HOLDS if ratio >= 0.95 else FAILS
    figures = {"threshold_over_best_fixed": ratio, "mean_k": rule["mean_k"]}
    return finished(f, verdict, text, figures, "policies.png")


def hot_k(f: Finding, s: Stages) -> Finding:
    temps = [t for t in s["policies"]["temperatures"] if t > 0.7]
    if not temps or not _fixed(s, 0.0) or not _fixed(s, temps[0]):
        return f
    hot = temps[0]
    cold_k = max(_fixed(s, 0.0), key=lambda r: r["tokens_per_second"])["fixed_k"]
    hot_k = max(_fixed(s, hot), key=lambda r: r["tokens_per_second"])["fixed_k"]
    text = f"fastest fixed K: {cold_k} at T = 0, {hot_k} at T = {hot:g}."
    drop = cold_k - hot_k
    verdict = HOLDS if drop == 1 else DIFFERENT if drop > 1 else FAILS
    return finished(
        f, verdict, text, {"k_t0": float(cold_k), "k_hot": float(hot_k)}, "policies.png"
    )


def pause(f: Finding, s: Stages) -> Finding:
    lines, figures, verdicts = [], {}, []
    for t in s["policies"]["temperatures"]:
        rule, pause = _row(s, t, "threshold"), _row(s, t, "threshold+pause")
        ratio = pause["tokens_per_second"] / rule["tokens_per_second"]
        k1 = next((r for r in _fixed(s, t) if r["fixed_k"] == 1), None)
        plain = _row(s, t, "plain")["tokens_per_second"]
        lines.append(
            f"T = {t:g}: with the pause {ratio:.2f}x the controller without it "
            f"({pause['paused_steps']} paused steps)"
            + (
                f"; K = 1 at {k1['acceptance']:.0%} acceptance runs "
                f"{k1['tokens_per_second'] / plain:.2f}x plain"
                if k1
                else ""
            )
        )
        figures[f"pause_over_no_pause_t{t:g}"] = ratio
        verdicts.append(ratio >= 0.98)
    verdict = HOLDS if all(verdicts) else FAILS
    return finished(f, verdict, "; ".join(lines) + ".", figures, "policies.png")


def disable(f: Finding, s: Stages) -> Finding:
    costs, temp = s["costs"], s.get("temperature")
    if temp is None or 0.0 not in temp["temperatures"]:
        return f
    alpha = temp["alpha"][temp["temperatures"].index(0.0)]
    curve = CostCurve(tuple(costs["curve_sizes"]), tuple(costs["curve_seconds"]))
    # Break-even draft cost per token at K: E_K = K * c + v(K)  ->  c = (E_K - v(K)) / K.
    breakeven = max(
        (expected_tokens_per_step(alpha, k) - curve.relative(k)) / k for k in range(1, 9)
    )
    text = (
        f"with alpha {alpha:.1%} (T = 0) and the measured verification-cost curve, "
        f"speculation stops paying when one draft token costs more than {breakeven:.0%} of a "
        f"one-token target step (at the best K); this draft costs "
        f"{costs['draft_over_target']:.1%} of a target step."
    )
    verdict = _in_range(breakeven, 0.4, 0.6, direction_holds=breakeven > 0)
    figures = {
        "breakeven": breakeven,
        "alpha_t0": alpha,
        "draft_over_target": costs["draft_over_target"],
    }
    return finished(f, verdict, text, figures)


def memory(f: Finding, s: Stages) -> Finding:
    rows = [r for r in s["memory"]["rows"] if r["mean_peak_bytes"] is not None]
    if not rows:
        return f
    parts, growing = [], True
    for kind in ("chain", "tree"):
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["draft_tokens"])
        peaks = [r["mean_peak_bytes"] for r in mine]
        growing &= all(a <= b for a, b in zip(peaks, peaks[1:], strict=False))
        if mine:
            parts.append(
                f"{kind}: "
                + ", ".join(
                    f"{r['draft_tokens']} -> {r['mean_peak_bytes'] / 1e6:.2f} MB" for r in mine
                )
            )
    device = s["memory"]["device"]
    text = f"mean verification peak per step ({device}): " + "; ".join(parts) + "."
    if device == "cpu":
        text += (
            " On the CPU the figure is computed from the verification's tensor shapes (logits, "
            "probabilities at T > 0, attention mask): a lower bound that grows with the tokens "
            "verified; on CUDA it is the allocator's peak above resident memory "
            "(spectune.models.devices.VerifyMemory)."
        )
    first = rows[0]["mean_peak_bytes"]
    return finished(
        f, HOLDS if growing else FAILS, text, {"first_peak_bytes": float(first)}, "memory.png"
    )


def tuned(f: Finding, s: Stages) -> Finding:
    data = s["tuned"]
    if not data.get("parameters"):
        return f
    changed = [p for p in data["parameters"] if p["seed"] != p["tuned"]]
    listed = "; ".join(f"{p['option']}: seed {p['seed']} -> tuned {p['tuned']}" for p in changed)
    predicted = data.get("predicted", {})
    tuned, seed = predicted.get("tuned", {}), predicted.get("seed", {})
    text = (
        f"`spectune tune` changed {len(changed)} of {len(data['parameters'])} options"
        + (f" ({listed})" if listed else "")
        + (
            f"; predicted speedup {tuned['speedup']:.2f}x tuned against {seed['speedup']:.2f}x seed"
            if "speedup" in tuned and "speedup" in seed
            else ""
        )
        + "."
    )
    verdict = HOLDS if not changed else DIFFERENT
    return finished(f, verdict, text, {"changed": float(len(changed))})


def finished(
    f: Finding,
    verdict: str,
    measured: str,
    figures: Mapping[str, float],
    plot: str | None = None,
) -> Finding:
    return dataclasses.replace(
        f, verdict=verdict, measured=measured, figures=dict(figures), plot=plot
    )


def _drafts(s: Stages, family: str) -> list[Mapping[str, Any]]:
    return sorted(
        (d for d in s["drafts"]["drafts"] if d["family"] == family), key=lambda d: d["ratio"]
    )


def draft_size(f: Finding, s: Stages) -> Finding:
    drafts = _drafts(s, "llama")
    if not drafts:
        return f
    best = max(drafts, key=lambda d: d["predicted_speedup"])
    listed = ", ".join(
        f"1/{1 / d['ratio']:.0f}: alpha {d['alpha_t0']:.1%}, {d['predicted_speedup']:.2f}x"
        for d in drafts
    )
    text = (
        f"drafts distilled on equal budgets ({s['drafts']['budget']} each); size as a "
        f"share of the target's parameters, greedy alpha on the test split, predicted speedup "
        f"at the best K from the measured costs: {listed}."
    )
    verdict = HOLDS if 0.1 <= best["ratio"] <= 0.25 else DIFFERENT
    if best["predicted_speedup"] <= 1.0:
        by_alpha = max(drafts, key=lambda d: d["alpha_t0"])
        text += (
            f" No draft pays at this budget (a tie at plain decoding's speed); by acceptance "
            f"the best is 1/{1 / by_alpha['ratio']:.0f}." + _MORE_BUDGET
        )
        verdict = INCONCLUSIVE
    else:
        text += f" Best: 1/{1 / best['ratio']:.0f}."
    figures = {"best_ratio": best["ratio"], "best_speedup": best["predicted_speedup"]}
    return finished(f, verdict, text, figures, "drafts.png")


def tiny_draft(f: Finding, s: Stages) -> Finding:
    tiny = [d for d in _drafts(s, "llama") if d["ratio"] < 0.05]
    if not tiny:
        return f
    top = max(d["alpha_t0"] for d in tiny)
    listed = ", ".join(f"1/{1 / d['ratio']:.0f}: {d['alpha_t0']:.1%}" for d in tiny)
    text = f"greedy alpha of the drafts under 1/20 of the target: {listed}."
    verdict = HOLDS if top < 0.5 else FAILS
    larger = [d["alpha_t0"] for d in _drafts(s, "llama") if d["ratio"] >= 0.05]
    if verdict == HOLDS and (not larger or max(larger) < 0.5):
        # Under 50% says nothing about size when the larger drafts are under it too.
        best = f"{max(larger):.1%}" if larger else "none measured"
        text += f" The larger drafts are under 50% too (best {best})." + _MORE_BUDGET
        verdict = INCONCLUSIVE
    return finished(f, verdict, text, {"max_alpha_under_1_20": top}, "drafts.png")


def family(f: Finding, s: Stages) -> Finding:
    others = _drafts(s, "gpt2")
    if not others:
        return f
    other = others[0]
    same = min(_drafts(s, "llama"), key=lambda d: abs(d["parameters"] - other["parameters"]))
    loss = 1.0 - other["alpha_t0"] / same["alpha_t0"] if same["alpha_t0"] else 0.0
    text = (
        f"at about equal size ({same['parameters']:,} parameters Llama-style, "
        f"{other['parameters']:,} GPT-2-style), same tokenizer, same distillation "
        f"budget: greedy alpha {same['alpha_t0']:.1%} against {other['alpha_t0']:.1%}: the "
        f"other family loses {loss:.0%}."
    )
    verdict = _in_range(loss, 0.15, 0.25, direction_holds=loss > 0)
    return finished(f, verdict, text, {"loss": loss}, "drafts.png")
