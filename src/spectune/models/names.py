"""The names a command line offers for running a model, as plain strings.

``spectune --help`` builds every subcommand's parser from these without loading torch; the
modules that act on a name (``quant``, ``devices``, ``llama``, ``llamacpp``,
``feature_head``) take it from here, so the parser's choices are the names they accept.
"""

from __future__ import annotations

__all__ = [
    "COMPILED",
    "DEVICES",
    "LAYOUTS",
    "LLAMACPP",
    "PRECISION_NAMES",
    "TARGET_PRECISIONS",
]

PRECISION_NAMES = ("fp32", "bf16", "int8", "int4")  # spectune.models.quant.PRECISIONS' keys
COMPILED = "+compile"  # a precision's suffix: its steps after the prompt run torch.compile'd
LLAMACPP = "llamacpp"  # the runtime's name: --runtime llamacpp; bench's and experiments' label
# What bench --dtype and experiment --precisions take (spectune.drafters.pairing).
TARGET_PRECISIONS = (*PRECISION_NAMES, *(p + COMPILED for p in PRECISION_NAMES), LLAMACPP)
DEVICES = ("auto", "cpu", "cuda")  # --device: auto takes a CUDA GPU where torch sees one
LAYOUTS = ("spectune", "eagle3")  # a feature head's layer layout (spectune.models.feature_head)
