"""The server's Prometheus metrics, in a registry the app owns (never the global one).

HTTP and scheduling here (requests by status, latency, time to first token, batch sizes,
running and waiting requests, the suffix history's size); the speculation metrics
(``spectune_spec_decode_*``: drafted, accepted, per position, fallbacks, rates) come from
``spectune.monitor`` on the same registry. Plain counters and histograms, as vLLM does:
rates are derived by the scraper or by the monitor's gauges.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from spectune.server.output import SpeculationUsage

__all__ = ["ServerMetrics"]

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "spectune_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "spectune_request_seconds",
            "time from request to last token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "spectune_time_to_first_token_seconds",
            "time from request to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("spectune_prompt_tokens", "prompt tokens", registry=r)
        self.completion_tokens = Counter(
            "spectune_completion_tokens", "generated tokens", registry=r
        )
        self.cancelled = Counter(
            "spectune_cancelled_requests", "requests cancelled (client gone)", registry=r
        )
        self.steps = Counter("spectune_batch_steps", "batched engine steps", registry=r)
        self.batch_size = Histogram(
            "spectune_batch_size",
            "sequences per engine step",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.step_seconds = Histogram(
            "spectune_step_seconds",
            "wall time of one engine step",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("spectune_running_requests", "requests in the batch", registry=r)
        self.waiting = Gauge("spectune_waiting_requests", "requests queued", registry=r)
        self.history_tokens = Gauge(
            "spectune_suffix_history_tokens",
            "tokens of earlier outputs held for suffix drafting, all tenants",
            registry=r,
        )
        self.history_tenants = Gauge(
            "spectune_suffix_history_tenants", "tenants with a history store", registry=r
        )

    def observe_step(self, batch_size: int, seconds: float) -> None:
        self.steps.inc()
        self.batch_size.observe(batch_size)
        self.step_seconds.observe(seconds)

    def observe_request(self, prompt_tokens: int, usage: SpeculationUsage) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(usage.completion_tokens)
