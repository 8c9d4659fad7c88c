"""``spectune watch``: the engines' readers on their fixtures, the window, the advice, a real
``spectune serve`` watched, and endpoints that fail (each one line, watching goes on)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from spectune.cli import main
from spectune.cli.watch import metrics_url
from spectune.drafters.model import ModelDrafter
from spectune.engines.costs import COSTS_FORMAT, StepCosts, load_costs, save_costs
from spectune.engines.llamacpp.metrics import counts_of_timings
from spectune.engines.llamacpp.server import default_server_binary
from spectune.engines.metrics import read_exposition
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.monitor.remote import EndpointError
from spectune.monitor.watch import (
    NO_COSTS_NOTE,
    CostAssumptions,
    Watcher,
    advise,
    kept_by_position,
)
from spectune.records import SpecCounts
from spectune.server import create_app
from spectune.server.engines import DraftSource
from spectune.server.testing import running_server, toy_service, toy_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "watch"


def fixture(engine: str) -> str:
    return (FIXTURES / f"{engine}.prom").read_text()


def test_vllm_reader_gives_the_fixtures_totals() -> None:
    reading = read_exposition(fixture("vllm"))  # detected from the names
    assert reading.engine == "vllm" and reading.k == 3
    c = reading.counts
    assert c is not None
    assert (c.steps, c.num_draft_tokens, c.positions, c.accepted) == (200, 600, 600, 390)
    assert c.accepted_at == [160, 130, 100] and c.tested_at == [200, 200, 200]
    assert c.acceptance_rate == pytest.approx(0.65)
    assert c.accepted_length == pytest.approx(1 + 390 / 200)


def test_sglang_reader_gives_the_fixtures_gauges() -> None:
    reading = read_exposition(fixture("sglang"))
    assert reading.engine == "sglang" and reading.counts is None
    assert reading.reported_acceptance == pytest.approx(0.65)
    assert reading.reported_accepted_length == pytest.approx(2.9)
    report = Watcher(k=3).observe(reading)
    assert report.window == "last batch" and report.acceptance == pytest.approx(0.65)
    # Only the length gauge: acceptance per position tested is (length - 1) / K.
    only_length = "\n".join(
        line for line in fixture("sglang").splitlines() if "spec_accept_rate" not in line
    )
    report = Watcher(k=3).observe(read_exposition(only_length, "sglang"))
    assert report.acceptance == pytest.approx((2.9 - 1) / 3)
    assert Watcher().observe(read_exposition(only_length)).acceptance is None  # no K given


def test_llamacpp_reader_gives_the_recorded_servers_totals() -> None:
    reading = read_exposition(fixture("llamacpp"))
    assert reading.engine == "llamacpp" and reading.k == 4 and reading.counts is not None
    c = reading.counts
    assert (c.steps, c.positions, c.accepted) == (70, 276, 17)
    assert c.accepted_at == [14, 3, 0, 0] and c.tested_at == [70] * 4
    report = Watcher().observe(reading)
    assert report.acceptance == pytest.approx(17 / 276)
    assert report.advice is None  # no measured costs
    # With them (a draft token at 0.3 of a target step, flat verification): the first
    # position, kept by 20% of drafts, does not pay for it (S(1) = 1.2 / 1.3).
    advice = Watcher(flat(0.3)).observe(reading).advice
    assert advice is not None and advice.action == "disable"


def test_an_older_llamacpp_says_its_metrics_hold_no_draft_counts() -> None:
    reading = read_exposition(fixture("llamacpp-nodraft"))
    assert reading.engine == "llamacpp" and reading.counts is None
    assert "no draft counts" in reading.notes[0]
    report = Watcher().observe(reading)
    assert report.acceptance is None and report.advice is None
    timings = counts_of_timings({"draft_n": 604, "draft_n_accepted": 515, "predicted_n": 665})
    assert (timings.positions, timings.accepted) == (604, 515)
    with pytest.raises(EndpointError):
        counts_of_timings({"draft_n": 3, "draft_n_accepted": 4})


def test_a_vllm_without_speculation_and_a_wrong_engine_are_one_line() -> None:
    assert metrics_url("http://gpu:8000/") == "http://gpu:8000/metrics"
    assert metrics_url("http://gpu:8000/custom/path") == "http://gpu:8000/custom/path"
    with pytest.raises(InvalidParameterError):
        metrics_url("gpu:8000")
    plain = "\n".join(line for line in fixture("vllm").splitlines() if "spec_decode" not in line)
    with pytest.raises(EndpointError, match="speculative-config"):
        read_exposition(plain)
    with pytest.raises(EndpointError, match="no vLLM, SGLang"):
        read_exposition("# TYPE up gauge\nup 1\n")
    with pytest.raises(EndpointError, match="not Prometheus text"):
        read_exposition("<html><body>hello</body></html>\n")


def counts(drafts: int, accepted_at: list[int]) -> SpecCounts:
    k = len(accepted_at)
    return SpecCounts(
        steps=drafts,
        num_draft_tokens=drafts * k,
        positions=drafts * k,
        accepted=sum(accepted_at),
        tested_at=[drafts] * k,
        accepted_at=list(accepted_at),
    )


def test_the_window_is_the_difference_and_a_restart_is_a_reset() -> None:
    before, after = counts(100, [80, 60]), counts(150, [120, 70])
    window = after.since(before)
    assert window is not None
    assert (window.steps, window.positions, window.accepted) == (50, 100, 50)
    assert window.accepted_at == [40, 10] and window.acceptance_by_position == (0.8, 0.2)
    assert before.since(after) is None

    watcher = Watcher()
    readings = [before, after, counts(10, [9, 8])]  # the last: the engine restarted
    reports = []
    for c in readings:
        reading = read_exposition(fixture("vllm"))
        reports.append(watcher.observe(type(reading)("vllm", c, reading.measured, k=2)))
    assert [r.window for r in reports] == ["since start", "since last scrape", "since restart"]
    assert reports[1].acceptance == pytest.approx(50 / 100)
    assert reports[2].counts == readings[2]
    assert any("restarted" in note for note in reports[2].notes)


def flat(draft_cost: float, max_k: int = 8, slope: float = 0.0) -> StepCosts:
    return StepCosts(draft_cost, tuple(1.0 + slope * k for k in range(max_k + 1)), "test")


def test_advice_on_hand_computed_cases() -> None:
    costs = flat(0.1)  # v(k) = 1
    kept = kept_by_position(counts(100, [80, 60]), 8)
    assert kept is not None
    # Measured 0.8, 0.6; then decaying by 0.6 / 0.8 = 0.75 per position.
    assert kept[:4] == pytest.approx([0.8, 0.6, 0.45, 0.3375])
    # S(k) = (1 + sum kept[:k]) / (1 + 0.1 k): 1.636, 2.0, 2.192, 2.277, 2.294, 2.269...
    advice = advise(0.7, kept, 2, "vllm", costs)
    assert (advice.action, advice.k) == ("raise", 5)
    assert advice.speedup == pytest.approx((1 + 0.8 + 0.6 + 0.45 + 0.3375 + 0.253125) / 1.5)
    assert advice.current_speedup == pytest.approx(2.4 / 1.2)
    assert advice.change == "--speculative-config '{\"num_speculative_tokens\":5}'"
    assert advise(0.7, kept, 5, "vllm", costs).action == "keep"
    lower = advise(0.7, kept, 8, "llamacpp", costs)
    assert (lower.action, lower.change) == ("lower", "--spec-draft-n-max 5")
    # Without per-position counts: the i.i.d. formula (1 - a^(k+1)) / (1 - a).
    # c = 0.2: S(1) = 1.6 / 1.2 = 1.333, S(2) = 1.96 / 1.4 = 1.4, S(3) = 2.176 / 1.6 = 1.36.
    iid = advise(0.6, None, 4, "sglang", flat(0.2))
    assert iid.k == 2 and iid.speedup == pytest.approx((1 + 0.6 + 0.36) / 1.4)
    assert iid.change == (
        "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3"
    )
    # Acceptance 40% at a draft cost of 0.1 still pays (S(1) = 1.4 / 1.1): only the costs
    # decide; at the cost of a draft as large as the target nothing does.
    assert advise(0.4, None, 4, "vllm", costs).k >= 1
    off = advise(0.9, None, 2, "vllm", flat(1.0, slope=1.0))
    assert (off.action, off.k, off.change) == ("disable", 0, "serve without --speculative-config")


def test_advice_stops_at_the_last_measured_k() -> None:
    # Measured up to K = 3 only: K = 5 would predict more, but nothing measured it.
    costs = StepCosts(0.0, (1.0, 1.02, 1.04, 1.06), "profile.json")
    kept = [0.9] * 8
    advice = advise(0.9, kept, 5, "vllm", costs)
    assert advice.k == 3 and advice.current_speedup is None
    assert "past the measured costs" in advice.reason
    assert advice.as_json()["costs"] == {
        "source": "profile.json",
        "draft_cost": 0.0,
        "verify": [1.0, 1.02, 1.04, 1.06],
    }


def test_no_measured_costs_no_predicted_speedup() -> None:
    """The case that advised 'raise K to 8, predicted 5.77x' from assumed costs: a draft as
    costly as the target at K = 2. Without measured costs, acceptance and one note."""
    reading = read_exposition(vllm_text(300, [250, 200]))
    report = Watcher().observe(reading)
    assert report.advice is None and report.acceptance == pytest.approx(450 / 600)
    assert report.kept_by_position == pytest.approx((250 / 300, 200 / 300))
    assert NO_COSTS_NOTE in report.notes
    assert report.as_json()["advice"] is None
    # The command line's cost flags, left unset, are no costs either.
    assert Watcher(CostAssumptions()).observe(reading).advice is None
    # Measured: the draft costs one target step per token, verification is flat.
    measured = Watcher(flat(1.0, max_k=8)).observe(read_exposition(vllm_text(300, [250, 200])))
    assert measured.advice is not None and measured.advice.action == "disable"
    assert NO_COSTS_NOTE not in measured.notes


def test_a_cost_profile_file_loads_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    save_costs(StepCosts(0.05, (1.0, 1.1, 1.2), "tune", engine="vllm"), path, "spectune tune")
    loaded = load_costs(path)
    assert (loaded.draft_cost, loaded.verify, loaded.engine) == (0.05, (1.0, 1.1, 1.2), "vllm")
    assert loaded.max_k == 2 and loaded.step(2) == pytest.approx(1.3)
    bad = {
        "missing.json": None,
        "text.json": "not json",
        "other.json": json.dumps({"format": "something"}),
        "short.json": json.dumps(
            {"format": COSTS_FORMAT, "version": 1, "draft_cost": 0.1, "verify": [1.0]}
        ),
        "negative.json": json.dumps(
            {"format": COSTS_FORMAT, "version": 1, "draft_cost": -1, "verify": [1.0, 1.1]}
        ),
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(InvalidParameterError) as info:
            load_costs(tmp_path / name)
        assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def served(
    toy_target: LlamaLM, toy_draft: LlamaLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    tokenizer = toy_tokenizer(tmp_path_factory.mktemp("watch-tokenizer"))
    service = toy_service(
        toy_target, tokenizer, draft=DraftSource(ModelDrafter(toy_draft)), api_key="k3y"
    )
    with running_server(create_app(service)) as url:
        yield url


def test_watch_once_json_matches_a_spectune_servers_own_totals(
    served: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client = openai.OpenAI(base_url=served + "/v1", api_key="k3y", max_retries=0, timeout=60)
    drafted = accepted = 0
    for prompt in ("w1 w2 w3", "w4 w5 w4 w5", "w9 w1 w9"):
        result = client.completions.create(model="toy", prompt=prompt, max_tokens=12)
        assert result.usage is not None
        extra = result.usage.model_extra or {}
        drafted, accepted = drafted + extra["drafted"], accepted + extra["accepted"]
    assert drafted > 0
    assert main(["watch", served, "--once", "--json", "--api-key", "k3y"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "spectune" and report["window"] == "since start"
    assert (report["draft_tokens"], report["accepted"]) == (drafted, accepted)
    assert report["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert report["checks"]["fallback frequency"]["status"] != "n/a"
    assert report["k"] == 4  # the toy service's fixed K
    assert report["advice"] is None and NO_COSTS_NOTE in report["notes"]

    assert main(["watch", served, "--once"]) == 2  # no key
    assert "needs an API key" in capsys.readouterr().err


class Canned(http.server.BaseHTTPRequestHandler):
    bodies: list[str] = []  # served in turn, the last one repeated

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = (self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def canned(*bodies: str) -> Iterator[str]:
    Canned.bodies = list(bodies)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def vllm_text(drafts: int, accepted_at: list[int]) -> str:
    lines = [
        f"vllm:spec_decode_num_drafts_total {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total {drafts * len(accepted_at)}",
        f"vllm:spec_decode_num_accepted_tokens_total {sum(accepted_at)}",
    ]
    for j, kept in enumerate(accepted_at):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}} {kept}')
    return "# TYPE vllm:spec_decode_num_drafts_total counter\n" + "\n".join(lines) + "\n"


def test_bad_endpoints_are_one_line_and_watching_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["watch", f"http://127.0.0.1:{port}", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectune: error: cannot connect") and err.count("\n") == 1

    bodies = (
        "<html>not metrics</html>",
        vllm_text(100, [80, 60]),
        "# TYPE up gauge\nup 1\n",  # metrics, none of speculation
        vllm_text(150, [120, 70]),
        vllm_text(10, [9, 8]),  # went backwards: a restart
    )
    with canned(*bodies) as url:
        args = ["watch", url, "--json", "--polls", "5", "--interval", "0.01"]
        assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "not Prometheus text" in lines[0]["error"]
    assert lines[1]["window"] == "since start" and lines[1]["accepted"] == 140
    assert "no vLLM, SGLang" in lines[2]["error"]
    assert lines[3]["window"] == "since last scrape" and lines[3]["accepted"] == 50
    assert lines[3]["acceptance_by_position"] == [0.8, 0.2]
    assert lines[4]["window"] == "since restart" and lines[4]["accepted"] == 17
    assert any("restarted" in note for note in lines[4]["notes"])


def test_live_table_prints_the_advice_and_errors_as_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich's width: no cell wrapped
    with canned("garbage {", vllm_text(100, [30, 10])) as url:
        assert main(["watch", url, "--polls", "2", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "still watching" in out and "acceptance rate" in out
    assert "speedup not predicted" in out and "disable" not in out
    stated = ["--draft-cost", "0.5", "--verify-slope", "0.5"]  # measured by the user
    with canned(vllm_text(100, [30, 10])) as url:
        assert main(["watch", url, "--polls", "1", *stated]) == 0
    out = capsys.readouterr().out
    assert "disable speculation" in out and "serve without --speculative-config" in out


def test_a_cost_profile_on_the_command_line_predicts_a_speedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--costs FILE``: the profile's K = 2 beats plain decoding on these counts (1 + 0.8
    + 0.6 = 2.4 tokens a step over 2 * 0.05 + 1.2 = 1.3 steps: 1.85x); without it, no
    prediction."""
    profile = tmp_path / "costs.json"
    save_costs(StepCosts(0.05, (1.0, 1.1, 1.2), "tune", engine="vllm"), profile)
    text = vllm_text(100, [80, 60])
    with canned(text) as url:
        assert main(["watch", url, "--once", "--json", "--costs", str(profile)]) == 0
        with_costs = json.loads(capsys.readouterr().out)
        assert main(["watch", url, "--once", "--json"]) == 0
        without = json.loads(capsys.readouterr().out)
    advice = with_costs["advice"]
    assert advice["k"] == 2 and advice["predicted_speedup"] == pytest.approx(2.4 / 1.3, abs=1e-3)
    assert advice["costs"]["source"] == str(profile)
    assert NO_COSTS_NOTE not in with_costs["notes"]
    assert without["advice"] is None and NO_COSTS_NOTE in without["notes"]


def test_watch_help_names_no_assumed_costs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["watch", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--costs FILE" in out and "nan" not in out


def test_spectunes_own_draft_time_sets_the_draft_cost() -> None:
    c = counts(50, [40, 30])  # 100 draft tokens over 50 steps: 2 per step
    c.draft_time, c.target_time, c.step_time = 1.0, 10.0, 11.0
    reading = read_exposition(fixture("vllm"))
    timed = type(reading)("spectune", c, frozenset({"draft_time", "per_position"}), k=2)
    profile = flat(0.9, slope=0.1)  # v(2) = 1.2
    report = Watcher(profile).observe(timed)
    assert report.advice is not None
    # A plain step: (10.0 s / 50 steps) / v(2) = 1/6 s; a draft token: 1.0 s / 100 = 0.01 s.
    assert report.advice.costs.draft_cost == pytest.approx(0.01 * 6)
    assert report.advice.costs.verify == profile.verify
    assert report.checks[1].value == pytest.approx(1.0 / 11.0)  # draft share, measured
    untimed = type(reading)("vllm", c, frozenset({"per_position"}), k=2)
    report = Watcher(profile).observe(untimed)
    assert report.advice is not None and report.advice.costs.draft_cost == 0.9
    assert report.checks[1].status == "n/a"  # vLLM: no draft time
    # Timing without a profile predicts nothing: it has no plain step to compare with.
    assert Watcher().observe(timed).advice is None


def llama_server_binary() -> str | None:
    found = default_server_binary()
    return None if found is None else str(found)


@pytest.mark.skipif(
    llama_server_binary() is None,
    reason="no llama-server binary (set LLAMA_SERVER, put it on PATH, or run "
    "scripts/build-llama-server.sh)",
)
def test_watch_on_a_real_llama_server_with_a_draft_agrees_with_its_responses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gguf_files import Q, write_gguf
    from spectune.engines.llamacpp.server import llama_server
    from spectune.models.toy import toy_config, toy_model

    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    for path, seed, hidden in ((target, 5, 64), (draft, 6, 32)):
        config = toy_config(vocab_size=320, hidden_size=hidden)
        write_gguf(path, toy_model(seed, config=config), Q.Q8_0, vocabulary=True)
    binary = llama_server_binary()
    assert binary is not None
    spec = ("--spec-type", "draft-simple", "--spec-draft-model", str(draft))
    drafted = accepted = 0
    with llama_server(Path(binary), target, spec, threads=1, context=512) as url:
        for prompt in ("a b c", "hello there", "one two one two"):
            body = {"prompt": prompt, "n_predict": 16, "ignore_eos": True, "temperature": 0}
            timings = httpx.post(url + "/completion", json=body, timeout=60).json()["timings"]
            one = counts_of_timings(timings)
            drafted, accepted = drafted + one.positions, accepted + one.accepted
        assert main(["watch", url, "--once", "--json"]) == 0
    assert drafted > 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "llamacpp" and report["window"] == "since start"
    assert (report["draft_tokens"], report["accepted"]) == (drafted, accepted)
    assert report["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert report["checks"]["acceptance rate"]["status"] != "n/a"
    assert report["k"] == 3  # llama.cpp's default --spec-draft-n-max
