"""Weight-only quantized linear layers on PyTorch's CPU kernels, and GGUF blocks mapped onto them.

Kernels (PyTorch's own; nothing hand-written here):

- int4: ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)``.
  ``x`` [rows, in] bf16; ``packed`` from ``_convert_weight_to_int4pack_for_cpu(codes, 1)``
  with ``codes`` [out, in] in 0..15; ``scales_and_zeros`` [in / 32, out, 2] bf16. Each
  weight dequantises as ``(code - 8) * scale + zero`` over groups of 32 inputs (the
  gpt-fast / torchao convention, ``zero = min + 8 * scale``; ``test_quant`` checks it
  against this PyTorch). ``out`` must be a multiple of 16 and ``in`` of 32.
- int8: ``torch.ops.aten._weight_int8pack_mm(x, codes, scales)``: ``codes`` [out, in]
  int8, one bf16 ``scale`` per output row.
- int8, large layers (at least ``SPLIT_MIN_WEIGHTS`` weights: the default model's output
  head): oneDNN's int8 GEMM, ``torch.ops.onednn.qlinear_pointwise``, on the same codes with
  fp32 scales. Its inputs are uint8 too, so each activation row is split into two int8 rows
  (``split_rows``): ``high``, the row scaled to [-127, 127] by its largest magnitude and
  rounded, and ``low``, the rounding remainder times 254, rounded. The kernel multiplies
  both by the weights in one call (integer sums, exact) and the layer adds
  ``high + low / 254`` back up: the activations keep about 15 bits per row, finer than
  bf16's 8 for every entry above 1/128 of the row's largest. Measured on the default model's
  head (49152 x 576) inside an int4 forward, both cores (torch profile of
  ``docs/results/bench-model-guesses-int4/forward-rows.py int4 prof``): 1.2 ms at 1 token
  and 1.1 ms at 3, against int8pack's 1.9 and 2.8; on the small trunk layers the call's
  fixed cost loses to int8pack and int4, hence the size rule. Only on CPUs with VNNI
  (``exact_int8_gemm``): elsewhere oneDNN's 16-bit pairwise sums saturate and the layer
  stays on int8pack.

The int4 and int8pack kernels want bf16 activations: fp32 (or fp16) activations take
PyTorch's slow fallback (10-40x slower on this machine's shapes), so such a layer casts its
input to bf16 and its output back to the trunk's dtype. The oneDNN path takes the trunk's
fp32 rows as they are.

Every kernel computes each row alike whatever the row count (integer sums in oneDNN's
case, and the split is per row), which is what batch invariance
(``spectune.models.llama``) needs of them; ``test_quant`` checks it bit for bit.

GGUF blocks (32 weights along the input dimension, fp16 ``d`` and ``m``):

- Q4_1: ``w = d * q + m`` = ``(q - 8) * d + (m + 8 d)``: scale ``d``, zero ``m + 8 d``.
- Q4_0: ``w = d * (q - 8)``: scale ``d``, zero 0.
  Both map exactly in formula; the kernel stores scale and zero in bf16, so ``d`` (an
  fp16) and ``m + 8 d`` are rounded to 8 significant bits (relative error <= 2^-9), and
  activations are bf16. Those are the only departures from the dequantised model.
- Q8_0 has one scale per block, the int8 kernel one per output row: the block values are
  requantised per row (``scale = max |w_row| / 127``), an error of at most half that
  scale per weight. With ``int4``, Q8_0 tensors (the default model's tied embedding /
  output head) go to the int8 kernel rather than lose four bits.
- Other tensors (F32, F16, other block types) are quantised from their float values:
  int4 asymmetric min/max per group of 32, int8 symmetric per row.

Quantised layers are inference only (no gradients) and CPU only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "GROUP_SIZE",
    "exact_int8_gemm",
    "PRECISIONS",
    "SPLIT_MIN_WEIGHTS",
    "Precision",
    "QUANT_MODES",
    "Int4Codes",
    "Int4Linear",
    "Int8Linear",
    "QuantMode",
    "int4_codes_from_float",
    "int4_codes_from_gguf",
    "int8_codes_from_float",
    "StackedPart",
    "quantize_net",
    "split_rows",
]

GROUP_SIZE = 32  # inputs per int4 group; also the GGUF Q4/Q8 block size
QuantMode = Literal["none", "int8", "int4"]
QUANT_MODES: tuple[QuantMode, ...] = ("none", "int8", "int4")
_KERNEL_DTYPE = torch.bfloat16
# int8 layers with at least this many weights run on oneDNN with split activations (module
# docstring): on the default model only the output head (28M weights; the trunk's largest
# layer has 1.8M, where int8pack is faster).
SPLIT_MIN_WEIGHTS = 1 << 22
_SPLIT_STEPS = 127  # ``high`` in [-127, 127]: int8 codes, stored as uint8 with zero point 128
_LOW_STEPS = 2 * _SPLIT_STEPS  # ``low`` = remainder in [-1/2, 1/2] times 254, in [-127, 127]


@dataclass(frozen=True)
class Precision:
    """How a model runs: the dtype of its activations, norms, embeddings and KV cache, and
    whether its linear layers use weight-only quantised kernels."""

    name: str  # "fp32", "bf16", "int8", "int4": what the CLI's --dtype and reports say
    dtype: torch.dtype
    quantize: QuantMode


# int8 / int4 keep the rest of the model in fp32: measured as fast as a bf16 trunk on the
# default model, with a third less logit error (the kernels see bf16 inputs either way).
PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32, "none"),
        Precision("bf16", torch.bfloat16, "none"),
        Precision("int8", torch.float32, "int8"),
        Precision("int4", torch.float32, "int4"),
    )
}


@dataclass(frozen=True)
class Int4Codes:
    """Group-quantised weights: ``w[o, i] = (codes[o, i] - 8) * scales[o, g] + zeros[o, g]``
    with ``g = i // 32``."""

    codes: Tensor  # [out, in] uint8 in 0..15
    scales: Tensor  # [out, in / 32] fp32
    zeros: Tensor  # [out, in / 32] fp32

    def dequantized(self) -> Tensor:
        """The fp32 weights these codes stand for (before the kernel's bf16 rounding)."""
        scales = self.scales.repeat_interleave(GROUP_SIZE, dim=1)
        zeros = self.zeros.repeat_interleave(GROUP_SIZE, dim=1)
        return (self.codes.float() - 8.0) * scales + zeros


def fits_int4(out_features: int, in_features: int) -> bool:
    return out_features % 16 == 0 and in_features % GROUP_SIZE == 0


class _WeightOnlyLinear(nn.Module):
    """What both quantised layers share: bf16 kernel inputs, outputs cast back to the
    input's dtype, an optional float bias, and ``.weight`` as float for weight readers."""

    in_features: int
    out_features: int
    bias: Tensor | None

    def _matmul(self, rows: Tensor) -> Tensor:  # [rows, in] float -> [rows, out]
        raise NotImplementedError

    @property
    def weight(self) -> Tensor:
        """The float weights [out, in] the layer multiplies by: the layer applied to the
        identity (so exactly the kernel's values, as it rounds them), for readers of ``.weight``
        such as a feature head sharing the target's output rows."""
        eye = torch.eye(self.in_features)
        weight: Tensor = self._matmul(eye).float().T.contiguous()
        return weight

    def forward(self, x: Tensor) -> Tensor:  # x: [..., in] -> [..., out]
        out = self._matmul(x.reshape(-1, self.in_features))
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(x.dtype)


class Int4Linear(_WeightOnlyLinear):
    """``y = x W^T + b`` with W in int4 groups of 32 (see the module docstring)."""

    def __init__(self, codes: Int4Codes, bias: Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.codes.shape
        if not fits_int4(self.out_features, self.in_features):
            raise ValueError(
                f"int4 layers need out % 16 == 0 and in % 32 == 0, got {tuple(codes.codes.shape)}"
            )
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.to(torch.int32), 1)
        scales_and_zeros = torch.stack((codes.scales, codes.zeros), dim=-1)  # [out, groups, 2]
        self.packed: Tensor
        self.scales_and_zeros: Tensor  # [groups, out, 2] bf16
        self.register_buffer("packed", packed)
        self.register_buffer(
            "scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().to(_KERNEL_DTYPE)
        )
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def _matmul(self, rows: Tensor) -> Tensor:
        out: Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(_KERNEL_DTYPE), self.packed, GROUP_SIZE, self.scales_and_zeros
        )
        return out


class Int8Linear(_WeightOnlyLinear):
    """``y = x W^T + b`` with W in int8, one scale per output row: on int8pack with bf16
    inputs, or with ``SPLIT_MIN_WEIGHTS`` weights or more on oneDNN with split activations
    (module docstring), where this PyTorch build has oneDNN's int8 GEMM."""

    def __init__(self, codes: Tensor, scales: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape  # codes: [out, in] int8
        self.codes: Tensor
        self.scales: Tensor
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        self.register_buffer("scales", scales.to(_KERNEL_DTYPE))  # [out]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # oneDNN's packed copy of the codes and its fp32 scales (not buffers: the packed
        # tensor is opaque, and both are rebuilt from ``codes`` and the float scales).
        self.onednn: tuple[Tensor, Tensor, Tensor] | None = None
        if self.codes.numel() >= SPLIT_MIN_WEIGHTS:
            self.onednn = _onednn_pack(self.codes, scales.float())

    def _matmul(self, rows: Tensor) -> Tensor:
        # Inside a compiled graph (``LlamaLM.compile_steps``) the layer stays on int8pack:
        # inductor lowers oneDNN's call only for weights frozen as graph constants, and
        # leaving it out of the graph nearly tripled the compile time (41 s -> 116 s for
        # 1-3 token steps) for no gain at one token. Plain and speculative steps are both
        # compiled, so they still round alike.
        if self.onednn is not None and not torch.compiler.is_compiling():
            return _split_matmul(rows.float(), *self.onednn)
        out: Tensor = torch.ops.aten._weight_int8pack_mm(
            rows.to(_KERNEL_DTYPE), self.codes, self.scales
        )
        return out


@functools.cache
def exact_int8_gemm() -> bool:
    """Whether this CPU multiplies uint8 x int8 with 32-bit sums (VNNI: ``avx512_vnni`` or
    ``avx_vnni``; AMX has it too). Without it oneDNN falls back to ``vpmaddubsw``, whose
    pairwise sums saturate at 16 bits: the split rows' codes (up to 255 x 127, two at a
    time) overflow and the output is wrong by whole units (seen on an AVX2-only AMD EPYC:
    7.07 off on the default head's shape), so the layer stays on int8pack there."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to ask, so not trusted
        return False
    return any(flag in flags.split() for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def _onednn_pack(codes: Tensor, scales: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """(packed codes, fp32 scales [out], zero points [out]) for oneDNN's int8 GEMM, or None
    where this PyTorch build has none or this CPU's int8 sums would saturate
    (``exact_int8_gemm``): the layer then stays on int8pack."""
    if not exact_int8_gemm():
        return None
    try:
        packed = torch.ops.onednn.qlinear_prepack(codes, None)
    except (RuntimeError, AttributeError):  # no oneDNN int8 kernels in this build
        return None
    return packed, scales.contiguous(), torch.zeros(codes.shape[0], dtype=torch.long)


def split_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Each fp32 row [rows, in] as ``peak / 127 * (high + low / 254)``: returns
    (codes [2 * rows, in] uint8, ``high`` rows then ``low`` rows, zero point 128;
    peak [rows, 1], each row's largest magnitude). ``high`` is exact where the row is a
    multiple of ``peak / 127``; the rest is off by at most ``peak / (127 * 254 * 2)``."""
    # A floor for an all-zero row (which then splits into zeros); 127 / 1e-30 stays finite.
    peak = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)
    scaled = rows * (_SPLIT_STEPS / peak)  # [rows, in] in [-127, 127]
    high = scaled.round().clamp_(-_SPLIT_STEPS, _SPLIT_STEPS)
    low = scaled.sub_(high).mul_(_LOW_STEPS).round_().clamp_(-_SPLIT_STEPS, _SPLIT_STEPS)
    return torch.cat((high, low)).add_(128).to(torch.uint8), peak


def _split_matmul(rows: Tensor, packed: Tensor, scales: Tensor, zero_points: Tensor) -> Tensor:
    """rows [rows, in] fp32 -> [rows, out] fp32 on oneDNN (module docstring). A row of
    infinities or NaN gives a non-finite output row: the peak multiplies it back."""
    codes, peak = split_rows(rows)
    # The kernel's own scale turns codes back into high / low: (code - 128) / 127.
    both: Tensor = torch.ops.onednn.qlinear_pointwise(
        codes,
        1.0 / _SPLIT_STEPS,
        128,
        packed,
        scales,
        zero_points,
        None,
        1.0,
        0,
        torch.float32,
        "none",
        [],
        "",
    )  # [2 * rows, out]
    count = rows.shape[0]
    return both[:count].add_(both[count:], alpha=1.0 / _LOW_STEPS).mul_(peak)


class StackedPart(nn.Module):
    """Outputs ``start:stop`` of a stacked layer: what a fused-away layer's name now holds,
    so a caller of the old layer still gets its outputs (the fast path calls the stacked
    layer once)."""

    def __init__(self, stacked: _WeightOnlyLinear, start: int, stop: int) -> None:
        super().__init__()
        self.stacked = [stacked]  # a list: not registered again as a submodule
        self.start, self.stop = start, stop
        self.in_features = stacked.in_features
        self.out_features = stop - start

    @property
    def weight(self) -> Tensor:
        weight: Tensor = self.stacked[0].weight[self.start : self.stop]
        return weight

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.stacked[0](x)[..., self.start : self.stop]
        return out


def int4_codes_from_float(weight: Tensor) -> Int4Codes:
    """Asymmetric min/max int4 over groups of 32 inputs. weight: [out, in]."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, in / 32]
    scales = (high - low).clamp(min=1e-8) / 15.0
    codes = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
    return Int4Codes(
        codes.reshape(out_features, in_features).to(torch.uint8), scales, low + 8.0 * scales
    )


def int8_codes_from_float(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8. weight: [out, in] -> (codes [out, in] int8, scales [out])."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    codes = (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    return codes, scales


def int4_codes_from_gguf(blocks: np.ndarray, kind: str) -> Int4Codes:
    """Q4_0 / Q4_1 tensor bytes as stored in the file ([out, in / 32 * block bytes] uint8)
    -> the same weights as int4 codes with scales and zeros (exact: module docstring)."""
    header = {"Q4_0": 2, "Q4_1": 4}[kind]  # fp16 d, then (Q4_1 only) fp16 m
    out_features = blocks.shape[0]
    per_block = blocks.reshape(out_features, -1, header + GROUP_SIZE // 2)  # [out, groups, bytes]
    d = per_block[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [out, groups]
    packed = per_block[..., header:]  # [out, groups, 16]: element j low nibble, j + 16 high
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1)  # [out, groups, 32]
    if kind == "Q4_1":
        m = per_block[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zeros = m + 8.0 * d
    else:
        zeros = np.zeros_like(d)
    return Int4Codes(
        torch.from_numpy(codes.reshape(out_features, -1).astype(np.uint8)),
        torch.from_numpy(d),
        torch.from_numpy(zeros),
    )


Codes = Int4Codes | tuple[Tensor, Tensor]  # int4 codes, or int8 (codes, per-row scales)
_SIBLINGS = (("qkv", ("q_proj", "k_proj", "v_proj")), ("gate_up", ("gate_proj", "up_proj")))


def quantize_net(
    net: nn.Module,
    mode: QuantMode,
    *,
    int4_sources: dict[str, Int4Codes] | None = None,
    int8_names: frozenset[str] = frozenset(),
) -> int:
    """Replace ``net``'s ``nn.Linear`` layers by quantised ones, in place; returns how many.

    ``int4_sources`` maps a layer's name to codes read from a file (used instead of
    quantising its float weight, in ``int4`` mode); layers named in ``int8_names`` use the
    int8 kernel even in ``int4`` mode (Q8_0 tensors). A layer whose shape the int4 kernel
    cannot take falls back to int8. Tied weights are untied: the embedding keeps its float
    table for lookups.

    Sibling projections that read one input are then stacked into one layer: an attention
    block's q, k and v (its ``qkv``) and an MLP's gate and up (its ``gate_up``), where all
    siblings got the same kernel. Each kernel call has a fixed cost (the bf16 casts, the
    call), a good part of a small model's one-token step; the stacked layer computes every
    output as the separate ones did (``test_quant``), and the old names keep answering
    with their slice (``StackedPart``).
    """
    if mode == "none":
        return 0
    sources = int4_sources or {}
    codes: dict[int, tuple[Codes, Tensor | None]] = {}  # id(new layer) -> what built it
    for parent_name, parent in list(net.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            bias = None if child.bias is None else child.bias.float()
            made: Codes
            if mode == "int4" and name in sources:
                made = sources[name]
            elif mode == "int4" and name not in int8_names and fits_int4(*child.weight.shape):
                made = int4_codes_from_float(child.weight)
            else:
                made = int8_codes_from_float(child.weight)
            layer = _layer(made, bias)
            codes[id(layer)] = (made, bias)
            setattr(parent, child_name, layer)
    for module in net.modules():
        for slot, names in _SIBLINGS:
            if getattr(module, slot, False) is None:
                parts = [codes.get(id(getattr(module, name))) for name in names]
                _stack(module, slot, names, parts)
    return len(codes)


def _layer(codes: Codes, bias: Tensor | None) -> _WeightOnlyLinear:
    if isinstance(codes, Int4Codes):
        return Int4Linear(codes, bias)
    return Int8Linear(*codes, bias)


def _stack(
    module: nn.Module,
    slot: str,
    names: tuple[str, ...],
    parts: list[tuple[Codes, Tensor | None] | None],
) -> None:
    """Set ``module.<slot>`` to one layer over the siblings ``names`` (quantised from
    ``parts``) and their names to slices of it; nothing when they differ in kernel."""
    found = [part for part in parts if part is not None]
    if len(found) != len(names) or len({type(c) for c, _ in found}) != 1:
        return
    sizes = [getattr(module, name).out_features for name in names]
    biases = [
        torch.zeros(size) if bias is None else bias
        for (_, bias), size in zip(found, sizes, strict=True)
    ]
    bias = torch.cat(biases) if any(b is not None for _, b in found) else None
    first = found[0][0]
    stacked_codes: Codes
    if isinstance(first, Int4Codes):
        int4 = [c for c, _ in found if isinstance(c, Int4Codes)]
        stacked_codes = Int4Codes(
            torch.cat([c.codes for c in int4]),
            torch.cat([c.scales for c in int4]),
            torch.cat([c.zeros for c in int4]),
        )
    else:
        int8 = [c for c, _ in found if not isinstance(c, Int4Codes)]
        stacked_codes = (torch.cat([c for c, _ in int8]), torch.cat([s for _, s in int8]))
    stacked = _layer(stacked_codes, bias)
    setattr(module, slot, stacked)
    start = 0
    for name, size in zip(names, sizes, strict=True):
        setattr(module, name, StackedPart(stacked, start, start + size))
        start += size
