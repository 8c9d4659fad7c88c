"""Runtimes side by side: one target at several precisions (fp32, bf16, int8, int4).

For each precision, against the fp32 model as it runs today (the dequantised GGUF):

- logit error: max and mean absolute difference of the prefill logits over every prompt
  position;
- greedy agreement: plain greedy generations compared token for token with fp32's
  (identical generations, and the mean share of tokens before the first difference);
- decode tokens/s of plain decoding, prompts interleaved across precisions (each prompt is
  decoded by every precision in turn, alternating the order) so machine drift hits all,
  after one untimed short decode per runtime (a compiled step compiles there);
- the verification-cost curve: forward seconds over 1..16 tokens after a cached prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from spectune.control.costs import CostCurve, measure_forward_curve
from spectune.decode.engine import SpeculativeEngine
from spectune.models.base import LanguageModel
from spectune.sampling import SamplingParams

__all__ = ["CURVE_SIZES", "RuntimeResult", "compare_runtimes"]

CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class RuntimeResult:
    precision: str
    tokens: int  # generated over all prompts
    decode_seconds: float
    max_logit_error: float  # vs the reference precision, over every prefill position
    mean_logit_error: float
    identical: int  # prompts whose greedy generation equals the reference's
    prompts: int
    prefix_agreement: float  # mean share of tokens before the first difference
    curve: CostCurve

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "precision": self.precision,
            "tokens": self.tokens,
            "decode_seconds": round(self.decode_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "max_logit_error": round(self.max_logit_error, 5),
            "mean_logit_error": round(self.mean_logit_error, 5),
            "identical_generations": self.identical,
            "prompts": self.prompts,
            "prefix_agreement": round(self.prefix_agreement, 4),
            "curve": {"sizes": list(self.curve.sizes), "seconds": list(self.curve.seconds)},
            "curve_relative": [round(s / self.curve.seconds[0], 3) for s in self.curve.seconds],
        }


def _prefix_share(tokens: Sequence[int], reference: Sequence[int]) -> float:
    length = max(len(tokens), len(reference), 1)
    same = 0
    for a, b in zip(tokens, reference, strict=False):
        if a != b:
            break
        same += 1
    return same / length


@torch.inference_mode()
def _prefill_logits(model: LanguageModel, prompt: Sequence[int]) -> torch.Tensor:
    cache = model.new_cache(capacity=len(prompt))
    return model.forward(torch.tensor([list(prompt)]), cache).logits[0].float()


def compare_runtimes(
    models: dict[str, LanguageModel],  # precision name -> model; the first is the reference
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    curve_repeats: int = 5,
) -> list[RuntimeResult]:
    names = list(models)
    reference = names[0]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    generated: dict[str, list[list[int]]] = {n: [] for n in names}
    seconds = dict.fromkeys(names, 0.0)
    errors: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for name in names:  # untimed: a first step's set-up (a compiled step's compile) is no decoding
        SpeculativeEngine(models[name], None).run(list(prompts[0]), replace(params, max_tokens=4))
    for index, prompt in enumerate(prompts):
        reference_logits = _prefill_logits(models[reference], prompt)
        for name in names:
            errors[name].append((_prefill_logits(models[name], prompt) - reference_logits).abs())
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            generation = SpeculativeEngine(models[name], None).run(list(prompt), params)
            generated[name].append(list(generation.tokens))
            seconds[name] += generation.decode_time
    results = []
    for name in names:
        diffs = torch.cat([e.flatten() for e in errors[name]])
        pairs = list(zip(generated[name], generated[reference], strict=True))
        results.append(
            RuntimeResult(
                precision=name,
                tokens=sum(len(g) for g in generated[name]),
                decode_seconds=seconds[name],
                max_logit_error=float(diffs.max()),
                mean_logit_error=float(diffs.mean()),
                identical=sum(a == b for a, b in pairs),
                prompts=len(pairs),
                prefix_agreement=sum(_prefix_share(a, b) for a, b in pairs) / max(1, len(pairs)),
                curve=measure_forward_curve(models[name], CURVE_SIZES, repeats=curve_repeats),
            )
        )
    return results
