"""Benchmark: the agent under hostile targets, against the Deployment's 1 GiB memory limit.

Each attack runs in a fresh child process (so its peak RSS is its own): one agent with default
settings scrapes 20 good vLLM + LMCache pods (payloads rendered by bench/scrape.py) and one
attacker, for 3 cycles. Printed per attack: the child's peak RSS against 1 GiB, the median cycle
wall time (and its ratio to the no-attack run in the same table), the reason the attacker is down,
and whether the 20 good pods' tier numbers are exactly those of the no-attack run.

Also printed: the parser's cost on the line that freezes a backtracking regex parser (`junk{` + `a="1"  ` x n)
at 16, 32, 64, 128 labels, as time per line and the growth ratio 128/16 (linear: about 8x the
length, so about 8x the time; backtracking regexes take 29 s at 16 labels and hours at 20).

Targets: every attack survived, peak RSS < 1 GiB, good pods unchanged, a reason for the attacker.

The cardinality budget (`--budget` runs only this part): one pod with 10,000 `model_name` values
(4 counters each, 40k samples, under `sample_limit`) beside the 20 good pods, scraped 3 times by
an agent without a budget (`max_models_per_target: 0, max_series_per_target: 0`, the reference)
and by one with the default budget, each in its own process. Printed per run: the series in
/metrics, its size, the median render time of /metrics (`generate_latest`, 5 renders), the median
cycle, peak RSS, and the ratios budget/none.
The servers listen on 127.0.0.1 only.

Run: .venv/bin/python bench/hostile.py [--only NAME ...] [--budget | --no-budget] [--list]
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from helpers.hostile_children import BUDGET_CHILD, CHILD  # bench/ is on the path from here

GOOD_PODS = 20
CYCLES = 3
LIMIT_MB = 1024.0
SECRET = "AKIAIOSFODNN7EXAMPLE"


def _gzip_without_trailer(body: bytes) -> bytes:
    """gzip cut at a line boundary, as a proxy that gave up mid-stream forwards it: no trailer."""
    import zlib

    cut = body[: body.rfind(b"\n", 0, len(body) // 2) + 1]
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    return comp.compress(cut) + comp.flush(zlib.Z_SYNC_FLUSH)


def _impossible(payload: str) -> str:
    """Negative and 1e308 counters and a non-monotone TTFT histogram in an otherwise good payload."""
    import re

    out = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", r"\g<1> -550", payload, flags=re.MULTILINE)
    out = re.sub(r"^(vllm:prefix_cache_queries_total\{[^}]*\}) \S+$", r"\g<1> 1e308", out, flags=re.MULTILINE)
    return re.sub(r'^(vllm:time_to_first_token_seconds_bucket\{[^}]*le="0.001"[^}]*\}) \S+$', r"\g<1> 1e9", out,
                  flags=re.MULTILINE)


def attacks(payload: str = "") -> dict[str, dict]:
    """name -> route: body (bytes, optional headers) or a behaviour (redirect, drip, huge).
    `payload`: a good vLLM page the data attacks start from."""
    many = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n' for i in range(250_000))
    return {
        "none": {},
        "freezing line (40 labels)": {"body": ("ok 1\n" + freezing_line(40) + "\n").encode()},
        "8 MB label value": {"body": ('x{a="' + "v" * (8 << 20) + '"} 1\n').encode()},
        "250k series (15 MB)": {"body": many.encode()},
        "50 copies of a series": {"body": ('vllm:prefix_cache_hits_total{engine="0",model_name="m"} 5\n' * 50)
                                  .encode()},
        "100 labels": {"body": ("vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(100))
                                + "} 1\n").encode()},
        "50 MB body": {"huge": 50 << 20},
        "slow drip": {"drip": True},
        "redirect to a metadata service": {"redirect": "/latest/meta-data/iam"},
        "HTML with a secret": {"body": f"<html>{SECRET}</html>\n".encode()},
        "gzip without its trailer": {"body": _gzip_without_trailer(payload.encode()),
                                     "headers": {"Content-Encoding": "gzip"}},
        "gzip, empty body": {"body": b"", "headers": {"Content-Encoding": "gzip"}},
        "negative, 1e308, bad buckets": {"body": _impossible(payload).encode()},
        "OpenMetrics without # EOF": {"body": payload.encode(),
                                      "headers": {"Content-Type": "application/openmetrics-text; version=1.0.0"}},
        "value 1_000_000": {"body": (payload + "vllm:num_requests_running 1_000_000\n").encode()},
        'histogram with le="abc"': {"body": payload.replace('le="0.005"', 'le="abc"').encode()},
        # a good page behind a URL whose password holds "@" and ":" and whose query has ?%74oken=:
        # the attacker is up, and the secret must appear nowhere
        "credentials: p@ss:w, ?%74oken=": {"body": payload.encode(), "credentials": True},
    }


BUDGET_ATTACK = "10,000 model names (40k samples)"
BUDGET_MODELS = 10_000


def many_models(n: int = BUDGET_MODELS) -> str:
    out = []
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "request_success"):
        out.append(f"# TYPE vllm:{name}_total counter")
        out.extend(f'vllm:{name}_total{{engine="0",model_name="model-{i:05d}"}} {(i + 1) * 10}' for i in range(n))
    return "\n".join(out) + "\n"


def serve(good: list[str], routes: dict[str, dict]) -> tuple[http.server.ThreadingHTTPServer, int]:
    closing = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes, status: int = 200, headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in {"Content-Type": "text/plain; version=0.0.4", **(headers or {})}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts[0] == "good":
                self._send(good[int(parts[1])].encode())
                return
            if parts[0] == "latest":  # the "metadata service": must never be asked
                self._send(f"{SECRET}\n".encode())
                return
            route = routes[json.loads(bytes.fromhex(parts[1]))]
            try:
                if "redirect" in route:
                    self._send(b"", 302, {"Location": f"http://127.0.0.2:{self.server.server_port}"
                                                      f"{route['redirect']}"})
                elif "huge" in route:
                    self.send_response(200)
                    self.end_headers()
                    chunk = b"# filler " + b"." * 1014 + b"\n"
                    for _ in range(route["huge"] // len(chunk)):
                        self.wfile.write(chunk)
                    self.close_connection = True
                elif "drip" in route:
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    while not closing.wait(0.5):
                        self.wfile.write(b"#")
                        self.wfile.flush()
                else:
                    self._send(route["body"], headers=route.get("headers"))
            except OSError:
                pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.closing = closing  # type: ignore[attr-defined]
    return httpd, httpd.server_address[1]


def budget_figures(port: int) -> None:
    rows = {}
    for bounded in (False, True):
        out = subprocess.run([sys.executable, "-c", BUDGET_CHILD, str(ROOT), str(port), str(GOOD_PODS),
                              BUDGET_ATTACK, str(CYCLES), "1" if bounded else "0"],
                             capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            print(f"budget run ({'default' if bounded else 'none'}) CRASHED: {out.stderr.strip()[-300:]}")
            return
        rows[bounded] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"cardinality budget: one pod with {BUDGET_MODELS:,} model names ({4 * BUDGET_MODELS:,} samples) + "
          f"{GOOD_PODS} good pods, {CYCLES} cycles")
    print(f"{'budget':24s} {'series':>8s} {'attacker':>9s} {'/metrics':>9s} {'render':>8s} {'cycle':>8s} "
          f"{'rows':>7s} {'peak RSS':>9s}  attacker")
    for bounded, r in rows.items():
        name = "default (16 models)" if bounded else "none (reference)"
        print(f"{name:24s} {r['series']:8,d} {r['attacker_series']:9,d} {r['bytes'] / 1e6:7.2f}MB "
              f"{r['render_ms']:6.0f}ms {r['cycle_ms']:6.0f}ms {r['store_rows']:7,d} {r['rss_mb']:7.0f}MB  "
              f"{'up' if r['up'] else 'down'}, {r['models']} models, {','.join(r['warnings']) or '-'}")
    a, b = rows[False], rows[True]
    print(f"budget / none: series {b['series'] / a['series']:.3f}x, /metrics size {b['bytes'] / a['bytes']:.3f}x, "
          f"render {b['render_ms'] / a['render_ms']:.3f}x, cycle {b['cycle_ms'] / a['cycle_ms']:.2f}x, "
          f"peak RSS {b['rss_mb'] / a['rss_mb']:.2f}x")


def run_child(port: int, attack: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(port), str(GOOD_PODS), attack, str(CYCLES)],
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        return {"crashed": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def freezing_line(labels: int) -> str:
    return "junk{" + 'a="1"  ' * labels


def parser_figures() -> None:
    from agent.collect.parse import ParseError, parse

    per_line = {}
    for n in (16, 32, 64, 128):
        text = freezing_line(n) + "\n"
        reps = 2000
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            for _ in range(reps):
                try:
                    parse(text)
                except ParseError:
                    pass
            best = min(best, (time.process_time() - t) / reps)
        per_line[n] = best
    cells = ", ".join(f"{n} labels {per_line[n] * 1e6:.1f} us" for n in per_line)
    length = len(freezing_line(128)) / len(freezing_line(16))
    print(f"parser on the freezing line: {cells}; growth 128/16 = {per_line[128] / per_line[16]:.1f}x for "
          f"{length:.1f}x the length (a backtracking regex parser: 29 s at 16 labels)")


EXAMPLES = """examples:
  .venv/bin/python bench/hostile.py                       # every attack, then the cardinality budget
  .venv/bin/python bench/hostile.py --list                # the attacks' names
  .venv/bin/python bench/hostile.py --only gzip --only histogram  # attacks naming gzip or histogram
  .venv/bin/python bench/hostile.py --budget              # only the cardinality budget
  .venv/bin/python bench/hostile.py --no-budget           # the attacks and the parser, not the budget
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/hostile.py", description=__doc__, epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only the attacks whose name contains NAME (case-insensitive; repeatable; the "
                         "no-attack reference always runs)")
    ap.add_argument("--list", action="store_true", help="print the attacks' names and exit")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--budget", action="store_true", help="run only the cardinality budget")
    part.add_argument("--no-budget", action="store_true", help="skip the cardinality budget")
    args = ap.parse_args(argv)
    names = list(attacks())
    if args.only:
        args.selected = [n for n in names if n == "none" or any(o.lower() in n.lower() for o in args.only)]
        if args.selected == ["none"]:
            ap.error(f"--only {' '.join(args.only)}: no attack matches (see --list)")
    else:
        args.selected = names
    return args


def main(argv: list[str] | None = None) -> None:
    from scrape import render_payload

    args = parse_args(argv)
    if args.list:
        print("\n".join(n for n in attacks() if n != "none"))
        return
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} (wall times scale with other work)")
    if not args.budget:
        parser_figures()
    good = [render_payload(i) for i in range(GOOD_PODS)]
    if args.budget:
        run_budget(good)
        return
    routes = {k: v for k, v in attacks(good[0]).items() if k in args.selected}
    httpd, port = serve(good, routes)
    print(f"{GOOD_PODS} good pods + 1 attacker, {CYCLES} cycles per attack, default settings; limit {LIMIT_MB:.0f} MB")
    rows = []
    reference = None
    try:
        for name in routes:
            r = run_child(port, name)
            if name == "none":
                reference = r
            rows.append((name, r))
    finally:
        httpd.closing.set()  # type: ignore[attr-defined]
        httpd.shutdown()
    report(rows, reference, routes)
    if not args.no_budget:
        run_budget(good)


def report(rows: list[tuple[str, dict]], reference: dict | None, routes: dict[str, dict]) -> None:
    base_ms = reference["cycle_ms"] if reference and "cycle_ms" in reference else None
    print(f"{'attack':34s} {'peak RSS':>9s} {'cycle':>9s} {'vs none':>8s}  {'attacker':18s} good pods  leak")
    survived = True
    for name, r in rows:
        if "crashed" in r:
            survived = False
            print(f"{name:34s} CRASHED: {r['crashed']}")
            continue
        same = reference is not None and r["good"] == reference["good"] and r["good_up"]
        expect_up = name == "none" or routes[name].get("credentials")
        ok = r["rss_mb"] < LIMIT_MB and same and not r["leaked"] and (
            r["reason"] == "up" if expect_up and name != "none" else expect_up or r["reason"] not in ("", "up"))
        survived &= ok
        ratio = f"{r['cycle_ms'] / base_ms:.2f}x" if base_ms else "-"
        print(f"{name:34s} {r['rss_mb']:7.0f}MB {r['cycle_ms']:7.0f}ms {ratio:>8s}  {r['reason'] or '-':18s} "
              f"{'unchanged' if same else 'CHANGED':9s}  {'LEAK' if r['leaked'] else 'no'}")
    peak = max((r["rss_mb"] for _, r in rows if "rss_mb" in r), default=0.0)
    print(f"worst peak RSS {peak:.0f} MB of {LIMIT_MB:.0f} MB ({peak / LIMIT_MB:.0%}); "
          f"target: every attack survived, < 1 GiB, good pods unchanged -> {'OK' if survived else 'MISSED'}")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, the servers)")


def run_budget(good: list[str]) -> None:
    httpd, port = serve(good, {BUDGET_ATTACK: {"body": many_models().encode()}})
    try:
        budget_figures(port)
    finally:
        httpd.closing.set()  # type: ignore[attr-defined]
        httpd.shutdown()


if __name__ == "__main__":
    main()
