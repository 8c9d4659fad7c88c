"""``served_process``: ready once the health URL answers, its log in a file, the whole
process group stopped on the way out, and a process that dies or never answers is one
line naming its log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from spectune.engines.process import EngineStartError, free_port, served_process

# A server whose /health answers 200, with a child process that would outlive it if only
# the leader were stopped; it writes the child's pid where the test reads it.
SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ready_logged_and_stopped_with_its_children(tmp_path: Path) -> None:
    port, pid_file, log = free_port(), tmp_path / "child.pid", tmp_path / "server.log"
    command = [sys.executable, "-c", SERVER, str(port), str(pid_file)]
    url = f"http://127.0.0.1:{port}/health"
    with served_process(command, health_url=url, log=log, name="toy", ready_within=60):
        child = int(pid_file.read_text())
        assert alive(child)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:  # reaped by init, not by us
        time.sleep(0.1)
    assert not alive(child)
    assert "serving" in log.read_text()


def test_a_process_that_dies_or_never_answers_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "dies.log"
    dies = [sys.executable, "-c", "print('bad flag: --nope'); raise SystemExit(3)"]
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(EngineStartError) as info:
        with served_process(dies, health_url=url, log=log, name="toy", ready_within=60):
            pass
    message = str(info.value)
    assert "exited (3)" in message and "bad flag: --nope" in message and str(log) in message
    silent = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(EngineStartError, match="not ready after 1 s"):
        with served_process(silent, health_url=url, log=log, name="toy", ready_within=1):
            pass
