"""An emulated Curvine master over real files: a quota on a shared directory (vLLM's `fs` KV tier, or
any L2 on files), evicted as Curvine's quota eviction does it, with Curvine's master metrics on
`/metrics`.

vLLM's `fs` tier never deletes a file. In the seed deployment its directory is a Curvine mount, and
Curvine's master keeps the pool under its quota. Here the files are on a local directory, and this
master plays Curvine's part: it learns of every file written or opened under the root (inotify,
plus a scan for files it missed), reports each to the LRU or LFU tracker as Curvine's master reports
an access, and, when usage reaches the high watermark, deletes files down to the low watermark
(emulator/cluster/curvine_quota.py). With no under-filesystem behind the pool, Curvine's `free` and
`delete` modes both remove the bytes, so the files are unlinked; an engine then misses them and
recomputes.

    master = CurvineMaster(Path("/mnt/l2"), QuotaConfig(capacity_bytes=2 << 30, policy="lfu"))
    with CurvineMasterServer(master, port=9001, interval_s=1.0) as server:
        ... server.url   # http://127.0.0.1:9001/metrics, Curvine's names: fs_used, eviction_files_deleted ...

The metric names and their format are the emulated cluster's Curvine master
(emulator/cluster/catalogue.py: CURVINE_MASTER_SPECS, Rust `prometheus` text, no `_total`), so the
agent classifies and reads this endpoint as it reads Curvine's.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from emulator.cluster.curvine_quota import Eviction, QuotaConfig, bytes_to_free, evict, new_tracker
from emulator.cluster.exposition import render_rust_text
from emulator.cluster.http_endpoint import MetricsEndpoint
from emulator.cluster.inotify import TreeWatch
from emulator.cluster.pod_metrics import CurvineMasterMetrics, L2Status

PARTIAL_SUFFIXES = (".tmp",)  # written then renamed into place: not a file of the pool yet


def _pool_file(path: Path) -> bool:
    return not path.name.endswith(PARTIAL_SUFFIXES)


class CurvineMaster:
    """The quota's state: tracked files and their sizes, the tracker, the metrics. Not thread-safe
    by itself: CurvineMasterServer calls it from one thread."""

    def __init__(self, root: Path, cfg: QuotaConfig, *, clock: Callable[[], float] = time.time,
                 unlink: Callable[[Path], None] = Path.unlink) -> None:
        self.root = Path(root)
        self.cfg = cfg
        self.tracker = new_tracker(cfg.policy)
        self.sizes: dict[Path, int] = {}
        self.metrics = CurvineMasterMetrics(started_at=clock())
        self._unlink = unlink
        self.evictions: list[Eviction] = []
        self._publish()

    @property
    def used(self) -> int:
        return sum(self.sizes.values())

    def written(self, path: Path) -> None:
        """A file was created or rewritten: an access, with its (new) size."""
        if not _pool_file(path):
            return
        try:
            self.sizes[path] = path.stat().st_size
        except OSError:
            self._forget(path)
            return
        self.tracker.on_access(path)

    def opened(self, path: Path) -> None:
        """A pool file was opened (read): an access. Files not yet known are left to `written`."""
        if path in self.sizes:
            self.tracker.on_access(path)

    def _forget(self, path: Path) -> None:
        self.sizes.pop(path, None)
        self.tracker.remove([path])

    def scan(self) -> None:
        """Reconcile with the directory: files nobody reported (oldest first), files gone."""
        seen: dict[Path, os.stat_result] = {}
        for d, _subdirs, files in os.walk(self.root):
            for name in files:
                p = Path(d) / name
                if _pool_file(p):
                    try:
                        seen[p] = p.stat()
                    except OSError:
                        continue
        for p in [p for p in self.sizes if p not in seen]:
            self._forget(p)
        for p, st in sorted(seen.items(), key=lambda kv: kv[1].st_mtime_ns):
            if p not in self.sizes:
                self.sizes[p] = st.st_size
                self.tracker.on_access(p)
            else:
                self.sizes[p] = st.st_size

    def check(self) -> Eviction | None:
        """Evict down to the low watermark if usage reached the high one (Curvine's trigger)."""
        target = bytes_to_free(self.used, self.cfg)
        result = None
        if target is not None:
            result = evict(self.tracker, self.sizes, target, self.cfg, self._remove)
            if result.files:
                self.evictions.append(result)
                self.metrics.record_eviction(len(result.files), result.bytes_freed)
        self._publish()
        return result

    def _remove(self, path: object) -> bool:
        assert isinstance(path, Path)
        try:
            self._unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        self.sizes.pop(path, None)
        return True

    def _publish(self) -> None:
        self.metrics.set_usage(L2Status(capacity_bytes=self.cfg.capacity_bytes, used_bytes=self.used,
                                        tracked_files=len(self.tracker)))

    def render(self) -> bytes:
        return render_rust_text(self.metrics.snapshot())


class CurvineMasterServer:
    """The master's loop in a thread (inotify events, a scan, a quota check every `interval_s`) and
    its `/metrics` endpoint on 127.0.0.1."""

    def __init__(self, master: CurvineMaster, *, port: int = 0, interval_s: float = 1.0, host: str = "127.0.0.1") -> None:
        self.master = master
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self.endpoint = MetricsEndpoint(self._render, port, host)
        self._watch: TreeWatch | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.endpoint.url

    def _render(self) -> bytes:
        with self._lock:
            return self.master.render()

    def step(self) -> Eviction | None:
        """One round: read the queued file events, rescan, check the quota."""
        assert self._watch is not None
        with self._lock:
            for ev in self._watch.read():
                (self.master.written if ev.kind == "written" else self.master.opened)(ev.path)
            for d, _subdirs, _files in os.walk(self.master.root):
                if not self._watch.watching(Path(d)):
                    self._watch.watch(Path(d))
            self.master.scan()
            return self.master.check()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.step()

    def start(self, *, loop: bool = True) -> Self:
        """Watch the root and serve /metrics; `loop=False` leaves the rounds to `step()` (tests)."""
        self.master.root.mkdir(parents=True, exist_ok=True)
        self._watch = TreeWatch(self.master.root).__enter__()
        self.master.scan()
        self.endpoint.start()
        if loop:
            self._thread = threading.Thread(target=self._run, name="curvine-master", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.endpoint.stop()
        if self._watch is not None:
            self._watch.__exit__()
            self._watch = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse

    from emulator.cluster.curvine_config import quota_from_toml
    from emulator.cluster.curvine_quota import POLICIES, QuotaError

    ap = argparse.ArgumentParser(
        prog="python -m emulator.cluster.curvine_master",
        description="An emulated Curvine master: a quota with LRU/LFU eviction on a directory of real files "
                    "(e.g. vLLM's fs KV tier), Curvine's master metrics on /metrics.",
        epilog="example: python -m emulator.cluster.curvine_master --root /mnt/l2 --capacity-mib 2048 "
               "--policy lfu --port 9001")
    ap.add_argument("--root", type=Path, required=True, help="the shared directory (created if missing)")
    ap.add_argument("--capacity-mib", type=int, required=True, help="the quota, MiB")
    ap.add_argument("--policy", choices=POLICIES, default="lru", help="quota_eviction_policy [lru]")
    ap.add_argument("--high", type=float, default=0.8, help="quota_eviction_high_rate [0.8]")
    ap.add_argument("--low", type=float, default=0.6, help="quota_eviction_low_rate [0.6]")
    ap.add_argument("--scan-page", type=int, default=2, help="quota_eviction_scan_page [2]")
    ap.add_argument("--config", type=Path, help="Curvine's cluster TOML: its [master] quota_eviction_* keys replace "
                    "--policy, --high, --low and --scan-page (read at start, as Curvine's master reads it)")
    ap.add_argument("--port", type=int, default=9001, help="/metrics port (Curvine's master web port) [9001]")
    ap.add_argument("--host", default="127.0.0.1", help="/metrics address, a loopback one (a pod IP) [127.0.0.1]")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between quota checks [1.0]")
    args = ap.parse_args(argv)
    try:
        if args.config is not None:
            cfg = quota_from_toml(args.config.read_text(), capacity_bytes=args.capacity_mib << 20)
        else:
            cfg = QuotaConfig(capacity_bytes=args.capacity_mib << 20, policy=args.policy, high_watermark=args.high,
                              low_watermark=args.low, scan_page=args.scan_page)
    except (QuotaError, OSError) as exc:
        ap.error(str(exc))
    with CurvineMasterServer(CurvineMaster(args.root, cfg), port=args.port, interval_s=args.interval,
                            host=args.host) as server:
        print(f"curvine master: {args.root}, quota {args.capacity_mib} MiB, {args.policy}; metrics on {server.url}",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


__all__ = ["CurvineMaster", "CurvineMasterServer", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
