"""A real PostgreSQL 15 on a free loopback port, for tests of shared optuna storage.

`initdb` refuses root, so the data and socket directories belong to `postgres` and every server
command runs through `runuser -u postgres --`. The server listens on 127.0.0.1 only, with trust
auth, and is stopped (`pg_ctl stop -m immediate`, then the recorded postmaster PID if it is
still alive) when the session ends. Import the fixture explicitly:

    from tests.support.postgres import postgres_url  # noqa: F401
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("TIERPILOT_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def running_postgres(dbname: str = "tierpilot") -> Iterator[str]:
    """Start PostgreSQL, create `dbname`, yield a SQLAlchemy URL; stop it afterwards."""
    if not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None:
        pytest.skip(f"PostgreSQL 15 not installed at {PG_BIN} (run `make setup`)")
    root = Path(tempfile.mkdtemp(prefix="tierpilot-pg-"))
    data, sock, logfile = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    shutil.chown(root, "postgres")
    shutil.chown(sock, "postgres")
    port = _free_port()
    pid: int | None = None
    try:
        r = _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                         "--no-sync", "-E", "UTF8")
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr[-2000:]}")
        opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        r = _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(logfile), "-o", opts, "-w",
                         "-t", "60", "start")
        if r.returncode:
            log = logfile.read_text() if logfile.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr[-1000:]} {log[-2000:]}")
        pid = int((data / "postmaster.pid").read_text().split()[0])
        r = _as_postgres(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", dbname)
        if r.returncode:
            raise RuntimeError(f"createdb failed: {r.stderr[-1000:]}")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{dbname}"
    finally:
        if data.exists():
            _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with running_postgres() as url:
        yield url
