"""A real Prometheus (Debian's `/usr/bin/prometheus`) on a free loopback port, for tests.

Usage, as a context manager::

    from tests.support.prometheus import run_prometheus
    with run_prometheus(["127.0.0.1:9400"], tmp_path) as prom:
        prom.wait_for("tierpilot_target_up")
        value = prom.query_value('sum(tierpilot_kv_hit_tokens_total)')

or through the `prometheus_factory` fixture (import it into your test module or conftest)::

    from tests.support.prometheus import prometheus_factory  # noqa: F401
    def test_x(prometheus_factory):
        prom = prometheus_factory(["127.0.0.1:9400"])

The server scrapes every target each second, keeps its data in a temporary folder, and is killed
(exactly its own PID) at teardown. `start` waits until Prometheus is ready and, unless told not
to, until every target has been scraped once (an `up` sample exists for each).
"""
from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

PROMETHEUS_BIN = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _range_free(base: int, n: int) -> bool:
    """Whether ports base .. base + n - 1 on 127.0.0.1 could all be bound a moment ago."""
    socks: list[socket.socket] = []
    try:
        for i in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", base + i))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_range(n: int) -> int:
    """A base port on 127.0.0.1 with n consecutive ports free a moment ago (vLLM's data-parallel
    ranks publish KV events on port + rank)."""
    for _ in range(200):
        base = free_port()
        if base + n >= 65535:
            continue
        if _range_free(base, n):
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def fixed_port_range(n: int, seed: int | None = None) -> int:
    """A base port below the kernel's ephemeral range with n consecutive ports free a moment ago:
    for a program given fixed ports to bind later (`--pods-port`). Ephemeral ports are handed to
    every outgoing connection on the machine, so on a busy one a range picked there is soon taken."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(seed)
    for _ in range(200):
        base = rng.randrange(10000, max(low - n, 10001))
        if _range_free(base, n):
            return base
    raise RuntimeError(f"no {n} consecutive free ports below {low}")


class PrometheusError(RuntimeError):
    """Prometheus did not start, or a query failed."""


@dataclass
class PrometheusServer:
    """A running Prometheus process and helpers to query it over its HTTP API."""

    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    targets: tuple[str, ...]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- HTTP API --------------------------------------------------------------------------
    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>; returns the `data` member or raises PrometheusError."""
        query = urllib.parse.urlencode(params)
        req = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise PrometheusError(f"GET {req} -> HTTP {exc.code}: {detail}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"GET {req} -> {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        """Instant query; returns the result list (vector: [{'metric': {...}, 'value': [ts, 'v']}])."""
        data = self.api("query", query=promql)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_value(self, promql: str) -> float | None:
        """The single value of an instant query, None when empty; raises if several series."""
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{promql!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """Instant query as {value of `label`: float value}."""
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(promql)}

    def wait_for(self, promql: str, timeout: float = 20.0, min_series: int = 1) -> list[dict]:
        """Poll `promql` until it returns at least `min_series` series; return them."""
        deadline = time.monotonic() + timeout
        last: list[dict] = []
        while time.monotonic() < deadline:
            last = self.query(promql)
            if len(last) >= min_series:
                return last
            time.sleep(0.25)
        raise PrometheusError(
            f"{promql!r} gave {len(last)} series (< {min_series}) after {timeout}s; log tail:\n"
            + self.log_tail()
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def write_config(
    path: Path,
    targets: Sequence[str],
    scrape_interval: str = "1s",
    job: str = "tierpilot",
    rule_files: Sequence[Path] = (),
    metrics_path: str = "/metrics",
    static_configs: Sequence[dict] | None = None,
    scrape_configs: Sequence[dict] | None = None,
) -> None:
    """`static_configs` (each {"targets": [...], "labels": {...}}) replaces the plain target list,
    e.g. to attach the `pod` label Kubernetes service discovery would; `scrape_configs` replaces
    the whole job list (e.g. the jobs the Prometheus Operator generates)."""
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": metrics_path,
                "scrape_timeout": scrape_interval,
                "static_configs": list(static_configs) if static_configs is not None
                else [{"targets": list(targets)}],
            }
        ],
    }
    if scrape_configs is not None:
        config["scrape_configs"] = list(scrape_configs)
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def start_prometheus(
    targets: Sequence[str],
    workdir: Path,
    *,
    scrape_interval: str = "1s",
    job: str = "tierpilot",
    rule_files: Sequence[Path] = (),
    wait_for_first_scrape: bool = True,
    timeout: float = 30.0,
    static_configs: Sequence[dict] | None = None,
    scrape_configs: Sequence[dict] | None = None,
) -> PrometheusServer:
    """Start Prometheus scraping `targets` ("host:port"); wait for readiness and first samples."""
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip(f"prometheus binary not found at {PROMETHEUS_BIN}; run `make setup`")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    write_config(config, targets, scrape_interval, job, rule_files, static_configs=static_configs,
                 scrape_configs=scrape_configs)
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probing and binding
        port = free_port()
        data = workdir / f"data-{port}"
        log_path = workdir / f"prometheus-{port}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS_BIN,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        server = PrometheusServer(port, proc, workdir, tuple(targets), log_path)
        if _wait_ready(server, timeout):
            break
        last_error = server.log_tail()
        server.stop()
    else:
        raise PrometheusError(f"prometheus did not become ready; log tail:\n{last_error}")
    if wait_for_first_scrape and targets:
        try:
            server.wait_for("up", timeout=timeout, min_series=len(targets))
        except Exception:
            server.stop()
            raise
    return server


def _wait_ready(server: PrometheusServer, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def run_prometheus(targets: Sequence[str], workdir: Path | None = None, **kwargs) -> Iterator[PrometheusServer]:
    """Context manager around `start_prometheus`; always stops the server."""
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tierpilot-prom-")
        workdir = Path(tmp.name)
    server = start_prometheus(targets, workdir, **kwargs)
    try:
        yield server
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator:
    """Factory fixture: `prometheus_factory(targets, **kwargs) -> PrometheusServer`, stopped at teardown."""
    servers: list[PrometheusServer] = []

    def factory(targets: Sequence[str], **kwargs) -> PrometheusServer:
        server = start_prometheus(targets, tmp_path / f"prom{len(servers)}", **kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()
