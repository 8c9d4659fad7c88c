"""Soak and fault test of the server, as a serving team runs it before shipping
(the server process: ``soak_server``; one client request: ``soak_clients``).

Bounded in time and traffic, loopback only (127.0.0.1). The server runs in its own
process (so SIGTERM is real); this process is the clients. In order:

1. Start-up faults: ``spectune serve`` on a corrupt GGUF and on a truncated safetensors
   folder must exit 2 with one ``spectune: error:`` line.
2. References: every prompt's greedy answer, each request sent alone.
3. Soak: ``clients`` threads (= the server's ``max_requests``, the concurrency limit) send
   mixed traffic for ``seconds``: streaming or not, greedy or sampled, completions or
   chat; a share of them disconnects at random (a read timeout, or a stream closed after a
   few events). Each request's drafter misbehaves with probability ``fault_rate``: it
   raises, returns NaN probabilities, or hangs for ``hang_seconds`` (past the server's
   draft deadline). Afterwards every row must be free again.
4. SIGTERM with requests in flight: each must finish or end with a clean error (an
   OpenAI error body or an in-band stream error), requests sent after it must be refused
   (a 503 while the server drains, a refused connection once it has closed), and the
   server must exit 0.

The report: requests sent, answered, disconnected by their clients, cancelled (the
server's count), errors by kind, fallbacks by kind, RSS at start and end of the soak
(growth must stay under ``rss_bound_mb``), and how many greedy answers were compared with
their single-request answer (all must equal). ``python -m spectune.server.soak`` prints
it (``--help``: the options; ``--target default`` runs the real model); exit status 1 if
an expectation failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from spectune.server.soak_clients import Job, send

__all__ = ["SoakConfig", "SoakReport", "main", "run_soak"]

RETRY_AFTER_429 = 0.25  # seconds a client waits after a 429 (the server's cancel poll)
TOY_PROMPTS = tuple(" ".join(f"w{(i * 7 + j) % 50}" for j in range(3 + i % 5)) for i in range(8))


@dataclass(frozen=True)
class SoakConfig:
    target: str = "toy"  # "toy" (a seeded tiny model), or a model reference ("default", ...)
    draft: str = "toy"  # "toy" (a perturbed copy of the toy target), "ngram", or a reference
    seconds: float = 20.0  # of mixed traffic
    clients: int = 8  # concurrent clients: the server's max_requests
    max_batch: int = 4
    max_tokens: int = 24
    disconnect_rate: float = 0.15
    fault_rate: float = 0.15  # requests whose drafter raises, returns NaN or hangs
    hang_seconds: float = 1.0
    draft_deadline: float = 0.25  # the server's (seconds)
    sigterm_requests: int = 6
    sigterm_max_tokens: int = 200
    drain_seconds: float = 30.0  # the server's --drain-seconds
    rss_bound_mb: float = 64.0
    seed: int = 0
    startup_checks: bool = True


@dataclass
class SoakReport:
    config: SoakConfig
    sent: int = 0
    answered: int = 0
    disconnected: int = 0  # clients that went away on purpose
    # 429s: a client that went away and came straight back may find its old request not
    # yet cancelled (it is, at the next step), so the limit is briefly full; expected.
    rate_limited: int = 0
    cancelled: float = 0.0  # the server's spectune_cancelled_requests_total
    errors: Counter[str] = field(default_factory=Counter)
    fallbacks: dict[str, float] = field(default_factory=dict)
    greedy_compared: int = 0
    greedy_mismatches: int = 0
    rows_freed: bool = False
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    sigterm: Counter[str] = field(default_factory=Counter)  # finished, clean_error, unclean
    finished_after_signal: int = 0  # in-flight requests answered after the SIGTERM
    refused_after_sigterm: int = 0
    accepted_after_sigterm: int = 0
    exit_code: int | None = None
    startup: dict[str, str] = field(default_factory=dict)  # case -> outcome ("ok" or why)
    seconds: float = 0.0

    def problems(self) -> list[str]:
        """The expectations that failed (empty: the soak passed)."""
        found = []
        if self.errors:
            found.append(f"errors: {dict(self.errors)}")
        if self.greedy_mismatches:
            found.append(f"{self.greedy_mismatches} greedy answers differ from single requests")
        if not self.greedy_compared:
            found.append("no greedy answer was compared")
        if not self.rows_freed:
            found.append("rows still busy after the traffic stopped")
        if self.rss_end_mb - self.rss_start_mb > self.config.rss_bound_mb:
            found.append(f"RSS grew by more than {self.config.rss_bound_mb} MiB")
        if (
            any(kind.startswith("unclean") for kind in self.sigterm)
            or not self.finished_after_signal
            or self.accepted_after_sigterm
            or self.exit_code != 0
        ):
            found.append(
                f"SIGTERM: {dict(self.sigterm)}, {self.accepted_after_sigterm} accepted "
                f"after it, exit code {self.exit_code}"
            )
        found += [f"start-up {case}: {what}" for case, what in self.startup.items() if what != "ok"]
        return found

    def lines(self) -> list[str]:
        c = self.config
        return [
            f"soak: {c.target} target, {c.draft} draft, {c.clients} clients, batch {c.max_batch}, "
            f"{c.seconds:g} s of traffic, {self.seconds:.0f} s in all",
            f"requests sent {self.sent}, answered {self.answered}, disconnected by the client "
            f"{self.disconnected}, cancelled by the server {self.cancelled:.0f}, refused at "
            f"the limit (429) {self.rate_limited}",
            f"errors by kind: {dict(self.errors) or 'none'}",
            f"fallback steps by kind: {self.fallbacks or 'none'}",
            f"greedy answers equal to the single-request answer: "
            f"{self.greedy_compared - self.greedy_mismatches}/{self.greedy_compared}",
            f"rows free after the traffic: {self.rows_freed}",
            f"RSS start {self.rss_start_mb:.1f} MiB, end {self.rss_end_mb:.1f} MiB "
            f"(growth {self.rss_end_mb - self.rss_start_mb:+.1f}, bound {c.rss_bound_mb:g})",
            f"SIGTERM with {sum(self.sigterm.values())} in flight: {dict(self.sigterm)} "
            f"({self.finished_after_signal} answered after the signal); new requests after "
            f"it: {self.refused_after_sigterm} refused, {self.accepted_after_sigterm} "
            f"accepted; exit code {self.exit_code}",
            f"start-up faults: {self.startup or 'not run'}",
            "PASS" if not self.problems() else "FAIL: " + "; ".join(self.problems()),
        ]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    values = {}
    for line in httpx.get(url + "/metrics", headers=headers, timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _startup_checks(report: SoakReport) -> None:
    from spectune.models.loading import save_native
    from spectune.models.toy import toy_model

    with tempfile.TemporaryDirectory(prefix="spectune-soak-startup-") as scratch:
        corrupt = Path(scratch) / "corrupt.gguf"
        corrupt.write_bytes(b"GGUF" + b"\x00garbage" * 10)
        truncated = Path(scratch) / "truncated"
        save_native(toy_model(0), truncated)
        weights = truncated / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        for case, path in (("corrupt gguf", corrupt), ("truncated safetensors", truncated)):
            argv = [
                sys.executable,
                "-c",
                "import sys; from spectune.cli import main; sys.exit(main())",
            ]
            done = subprocess.run(
                [*argv, "serve", "--target", str(path), "--port", "0"],
                capture_output=True,
                text=True,
                timeout=300,
                env=_child_env(),
            )
            err = done.stderr.strip()
            good = done.returncode == 2 and "\n" not in err and err.startswith("spectune: error:")
            report.startup[case] = "ok" if good else f"exit {done.returncode}: {err[-200:]!r}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    source = str(Path(__file__).resolve().parents[2])  # this checkout's src/
    env["PYTHONPATH"] = os.pathsep.join([source, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _start_server(config: SoakConfig) -> tuple[subprocess.Popen[str], str]:
    code = "import json, sys; from spectune.server.soak import SoakConfig; "
    code += "from spectune.server.soak_server import serve; "
    code += "serve(SoakConfig(**json.loads(sys.argv[1])))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(dataclasses.asdict(config))],
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # blocks until the server has bound its port
    if not line.startswith("PORT "):
        process.kill()
        process.wait()
        process.stdout.close()
        raise RuntimeError(f"the soak server did not start: {line!r}")
    url = f"http://127.0.0.1:{int(line.split()[1])}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            process.wait()
            process.stdout.close()
            raise RuntimeError("the soak server did not answer /health")
        time.sleep(0.1)


def _prompts(config: SoakConfig) -> tuple[str, ...]:
    if config.target == "toy":
        return TOY_PROMPTS
    from spectune.prompts import load_prompts

    chosen = load_prompts(split="dev", limit_per_category=2)
    return tuple(p.messages[-1]["content"] for p in chosen)


def _soak(url: str, config: SoakConfig, prompts: Sequence[str], report: SoakReport) -> None:
    # 2. Single-request greedy answers: the reference for every greedy answer under load.
    reference: dict[tuple[bool, int], str] = {}
    for chat in (False, True):
        for index in range(len(prompts)):
            job = Job(chat, index, False, True, False, 0)
            outcome, text = send(url, job, prompts, config.max_tokens, random.Random(0))
            if outcome != "answered" or text is None:
                raise RuntimeError(f"reference request failed: {outcome}")
            reference[(chat, index)] = text
    lock = threading.Lock()
    stop_at = time.monotonic() + config.seconds

    def client(number: int) -> None:
        rng = random.Random(config.seed * 1000 + number)
        while time.monotonic() < stop_at:
            job = Job(
                chat=rng.random() < 0.5,
                prompt=rng.randrange(len(prompts)),
                stream=rng.random() < 0.5,
                greedy=rng.random() < 0.5,
                disconnect=rng.random() < config.disconnect_rate,
                seed=rng.randrange(2**31),
            )
            outcome, text = send(url, job, prompts, config.max_tokens, rng)
            with lock:
                report.sent += 1
                if outcome == "answered":
                    report.answered += 1
                    if job.greedy:
                        report.greedy_compared += 1
                        report.greedy_mismatches += text != reference[(job.chat, job.prompt)]
                elif outcome == "disconnected":
                    report.disconnected += 1
                elif outcome.startswith("http 429"):
                    report.rate_limited += 1
                else:
                    report.errors[outcome] += 1
            if outcome.startswith("http 429"):
                time.sleep(RETRY_AFTER_429)  # as a client that honours the limit would

    threads = [threading.Thread(target=client, args=(i,)) for i in range(config.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _wait_idle(url: str, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        health = httpx.get(url + "/health", timeout=5).json()
        if health["running"] == 0 and health["waiting"] == 0:
            return True
        time.sleep(0.05)
    return False


def _sigterm(
    process: subprocess.Popen[str], url: str, config: SoakConfig, report: SoakReport
) -> None:
    """Requests in flight, then SIGTERM: each finishes or fails cleanly; then nothing is
    accepted, and the server exits 0."""
    outcomes: list[str] = []
    lock = threading.Lock()
    signalled = [float("inf")]

    def in_flight(number: int) -> None:
        job = Job(number % 2 == 0, number % len(TOY_PROMPTS), number % 3 == 0, True, False, 0)
        outcome, _ = send(url, job, _prompts(config), config.sigterm_max_tokens, random.Random(0))
        kind = "finished" if outcome == "answered" else f"unclean ({outcome})"
        if outcome.startswith(("http 4", "http 5", "stream error")):
            kind = "clean_error"
        with lock:
            outcomes.append(kind)
            report.finished_after_signal += kind == "finished" and time.monotonic() > signalled[0]

    threads = [
        threading.Thread(target=in_flight, args=(i,)) for i in range(config.sigterm_requests)
    ]
    for thread in threads:
        thread.start()
    wait_until = time.monotonic() + 30
    while time.monotonic() < wait_until:  # until every request is in the server's hands
        health = httpx.get(url + "/health", timeout=5).json()
        in_server = health["running"] + health["waiting"]
        if in_server >= config.sigterm_requests:
            break
        with lock:
            answered = len(outcomes)
        if answered and in_server:
            break  # a short answer (EOS) ended before the last one arrived: signal now
        time.sleep(0.02)
    signalled[0] = time.monotonic()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    body = {"model": "toy", "prompt": TOY_PROMPTS[0], "max_tokens": 4}
    for _ in range(3):  # new requests after the signal: a 503 while it drains
        try:
            refused = httpx.post(url + "/v1/completions", json=body, timeout=5).status_code == 503
        except httpx.HTTPError:
            refused = True  # the listener has closed (or closed without an answer)
        report.refused_after_sigterm += refused
        report.accepted_after_sigterm += not refused
    for thread in threads:
        thread.join(config.drain_seconds + 60)
    try:
        report.exit_code = process.wait(config.drain_seconds + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        report.exit_code = None
    report.sigterm.update(outcomes)


def run_soak(config: SoakConfig) -> SoakReport:
    report = SoakReport(config)
    start = time.monotonic()
    if config.startup_checks:
        _startup_checks(report)
    process, url = _start_server(config)
    try:
        prompts = _prompts(config)
        report.rss_start_mb = _rss_mb(process.pid)
        _soak(url, config, prompts, report)
        report.rows_freed = _wait_idle(url)
        report.rss_end_mb = _rss_mb(process.pid)
        values = _metrics(url)
        report.cancelled = values.get("spectune_cancelled_requests_total", 0.0)
        prefix = 'spectune_spec_decode_fallback_steps_total{kind="'
        report.fallbacks = {
            name[len(prefix) : -2]: value
            for name, value in values.items()
            if name.startswith(prefix) and value
        }
        _sigterm(process, url, config, report)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    report.seconds = time.monotonic() - start
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectune.server.soak", description=__doc__)
    defaults = SoakConfig()
    for spec in dataclasses.fields(SoakConfig):
        flag = "--" + spec.name.replace("_", "-")
        default = getattr(defaults, spec.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args(argv)
    report = run_soak(SoakConfig(**vars(args)))
    for line in report.lines():
        print(line)
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
