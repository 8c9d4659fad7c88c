"""Many tenants against one server: is the suffix history's memory bounded across keys?

Starts `spectune serve` (the default target, the suffix drafter, tenant-scoped history of
--history-tokens in all) with --tenants API keys, then sends --per-tenant chat requests
per key, a few clients at a time, each tenant's prompts its own (a shipped prompt plus the
tenant's name). After every --report-every requests it prints the server's RSS and the
history's size from /metrics (spectune_suffix_history_tokens, _tenants).

    python docs/results/serving/tenant-soak.py --tenants 200 --per-tenant 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from spectune.prompts import load_prompts
from spectune.server.soak import _metrics, _rss_mb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--per-tenant", type=int, default=5)
    parser.add_argument("--history-tokens", type=int, default=8192)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--report-every", type=int, default=100)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    prompts = [p.messages[-1]["content"] for p in load_prompts()]
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "keys"
        keys.write_text("".join(f"key-{i} tenant-{i}\n" for i in range(args.tenants)))
        server = subprocess.Popen(
            [sys.executable, "-m", "spectune", "serve", "--draft", "suffix",
             "--api-keys", str(keys), "--port", str(args.port), "--threads", str(args.threads),
             "--suffix-history-tokens", str(args.history_tokens), "--max-batch", "8",
             "--log-level", "warning"],
        )  # fmt: skip
        url = f"http://127.0.0.1:{args.port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            auth = {"Authorization": "Bearer key-0"}

            def ask(number: int) -> int:
                tenant = number % args.tenants
                prompt = prompts[(number // args.tenants) % len(prompts)]
                content = f"{prompt} (for tenant-{tenant})"
                body = {
                    "model": "default",
                    "messages": [{"role": "user", "content": content}],
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                }
                reply = httpx.post(
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer key-{tenant}"},
                    timeout=300,
                )
                return reply.status_code

            total = args.tenants * args.per_tenant
            start = time.monotonic()
            print(f"requests  RSS MB  history tokens  tenants held  ({args.tenants} keys, "
                  f"bound {args.history_tokens} tokens, {args.threads} threads)")  # fmt: skip
            with ThreadPoolExecutor(args.clients) as pool:
                for first in range(0, total, args.report_every):
                    numbers = range(first, min(total, first + args.report_every))
                    statuses = list(pool.map(ask, numbers))
                    bad = [s for s in statuses if s != 200]
                    time.sleep(0.5)  # outputs are filed as the engine drops each drafter
                    seen = _metrics(url, auth)
                    print(
                        f"{numbers[-1] + 1:8d}  {_rss_mb(server.pid):6.0f}  "
                        f"{seen.get('spectune_suffix_history_tokens', 0):14.0f}  "
                        f"{seen.get('spectune_suffix_history_tenants', 0):12.0f}"
                        + (f"  {len(bad)} failed" if bad else ""),
                        flush=True,
                    )
            print(f"{total} requests in {time.monotonic() - start:.0f} s")
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
