"""The proposer's options: the ``spectune`` table of vLLM's ``--additional-config``.

vLLM forwards a custom proposer nothing but its ``VllmConfig``, and the speculative config
refuses keys it does not know; ``--additional-config`` is the free-form table vLLM passes
through untouched (``VllmConfig.additional_config``). So::

    --speculative-config '{"method": "custom_class",
                           "model": "spectune.engines.vllm.proposer.SpectuneProposer",
                           "num_speculative_tokens": 4}'
    --additional-config '{"spectune": {"policy": "threshold", "trace": "/tmp/run.jsonl",
                                       "metrics_port": 9400}}'

``num_speculative_tokens`` bounds every K (vLLM sizes its buffers by it). Every option,
with its default:

- ``drafter``         ``suffix`` (the shipped corpus index of the default target, plus each
                      request's own prompt and output, plus earlier outputs when
                      ``history``), ``suffix:INDEX`` (a shipped index name or an index
                      file), ``suffix:none`` (no corpus), or ``ngram`` (prompt lookup).
- ``history``         true: suffix drafting also looks up the outputs of earlier requests.
- ``policy``          ``threshold`` | ``cost`` | ``fixed``; default ``cost`` when ``costs``
                      is given, else ``threshold``. ``cost`` needs ``costs``: in a batch,
                      a request's target time is the whole batch's step, so the curve is
                      not learned from it.
- ``policy_options``  the policy's options, as in a policy file (``spectune tune`` writes
                      one). Defaults here: ``max_k`` = ``num_speculative_tokens``,
                      ``initial_k`` = min(4, that); the checks ``["local"]`` for
                      ``threshold``, none for ``cost`` and ``fixed`` (the engine-wide
                      check below replaces the per-request ``global`` one);
                      ``max_verify_groups`` 1 (vLLM verifies a draft in one pass).
- ``costs``           a cost profile file (``spectune.engines.costs``: v(K) measured on
                      the deployment) for ``cost``.
- ``global``          the engine-wide draft-time check (``DraftShareConfig``).
- ``trace``           a file for spectune's JSON-lines step trace (``spectune report``).
- ``metrics_port``    serve spectune's counters at ``http://127.0.0.1:PORT/metrics``
                      (``spectune watch`` reads them); none when absent.
- ``patch_sampler``   true: on steps where no row has a draft token, vLLM's rejection
                      sampler skips the noise it draws for recovered tokens
                      (``spectune.engines.vllm.patches``; output unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spectune.control.config import options_into
from spectune.control.fallback import GlobalFallbackConfig
from spectune.errors import InvalidParameterError
from spectune.records import validate_k

__all__ = ["PROPOSER_CLASS", "DraftShareConfig", "ProposerSettings", "parse_settings"]

PROPOSER_CLASS = "spectune.engines.vllm.proposer.SpectuneProposer"
POLICIES = ("threshold", "cost", "fixed")


@dataclass(frozen=True)
class DraftShareConfig(GlobalFallbackConfig):
    """The engine-wide fallback (``spectune.engines.vllm.controller.DraftShareCheck``):
    the per-request check's limit (``max_draft_ratio``: the proposer may take at most this
    share of a target step), smoothing and warm-up, and how often a held engine probes."""

    probe_every: int = 32  # held steps between probe steps that measure again

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.probe_every < 1:
            raise InvalidParameterError(f"global.probe_every must be >= 1, got {self.probe_every}")


@dataclass(frozen=True)
class _Scalars:
    drafter: str = "suffix"
    history: bool = True
    policy: str | None = None
    costs: str | None = None
    trace: str | None = None
    metrics_port: int | None = None
    patch_sampler: bool = True


@dataclass(frozen=True)
class ProposerSettings:
    """The parsed options (module docstring)."""

    max_k: int  # vLLM's num_speculative_tokens
    drafter: str = "suffix"
    history: bool = True
    policy: str = "threshold"
    policy_options: Mapping[str, Any] = field(default_factory=dict)  # defaults merged in
    costs: str | None = None
    draft_share: DraftShareConfig = field(default_factory=DraftShareConfig)
    trace: str | None = None
    metrics_port: int | None = None
    patch_sampler: bool = True


def _policy_defaults(policy: str, max_k: int) -> dict[str, Any]:
    if policy == "fixed":
        return {"k": max_k}
    defaults: dict[str, Any] = {"max_k": max_k, "initial_k": min(4, max_k)}
    if policy == "threshold":
        defaults["checks"] = ["local"]
    else:
        defaults.update(checks=[], max_verify_groups=1)
    return defaults


def parse_settings(options: object, max_k: int) -> ProposerSettings:
    """The ``spectune`` table (None or absent: every default); ``InvalidParameterError``
    naming the first bad option."""
    validate_k(max_k)
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise InvalidParameterError("additional_config.spectune must be a table of options")
    table = dict(options)
    policy_options = table.pop("policy_options", {})
    draft_share = table.pop("global", {})
    for name, value in (("policy_options", policy_options), ("global", draft_share)):
        if not isinstance(value, Mapping):
            raise InvalidParameterError(f"spectune option {name} must be a table")
    scalars = options_into(_Scalars, table, "spectune")
    drafter = scalars.drafter
    if drafter not in ("suffix", "ngram") and not drafter.startswith("suffix:"):
        raise InvalidParameterError(
            f"spectune option drafter must be suffix, suffix:INDEX or ngram, got {drafter!r}"
        )
    policy = scalars.policy or ("cost" if scalars.costs else "threshold")
    if policy not in POLICIES:
        raise InvalidParameterError(
            f"spectune option policy must be one of {', '.join(POLICIES)}, got {policy!r}"
        )
    if policy == "cost" and scalars.costs is None:
        raise InvalidParameterError(
            "policy cost needs a cost profile measured on the deployment (option costs)"
        )
    port = scalars.metrics_port
    if port is not None and not 0 < port < 2**16:
        raise InvalidParameterError(
            f"spectune option metrics_port must be in [1, 65535], got {port}"
        )
    return ProposerSettings(
        max_k=max_k,
        drafter=drafter,
        history=scalars.history,
        policy=policy,
        policy_options={**_policy_defaults(policy, max_k), **policy_options},
        costs=scalars.costs,
        draft_share=options_into(DraftShareConfig, draft_share, "global"),
        trace=scalars.trace,
        metrics_port=port,
        patch_sampler=scalars.patch_sampler,
    )
