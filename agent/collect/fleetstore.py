"""The fleet view of a sharded agent, read from the shards directly.

With `shard.count` > 1 every replica scrapes only its pods (shard.py). Shards own disjoint pods,
and every read the tuner, the drift detector and the workload fit make (`WindowStore`'s read API:
hit ratios, TTFT quantiles, rates, the prompt-length mix) is a pure function of the window
aggregate, one row per pod series. So the fleet's window is exactly the concatenation of the
shards' windows: `FleetStore.window()` is this replica's window plus every peer's
`GET /window?window_s=S` (Arrow IPC), and the inherited read API works unchanged on it.

The live evaluator and the paying tuner read exact spans (`window_between(since, until)`, the
trial's measurement window): every peer's `GET /window?since=T0&until=T1` on its own store, in
wall-clock seconds (the replicas' clocks are NTP-synced; a skew of a second shifts the span's
edges by that much). There are no raw frames to read across replicas: `frame()` raises.

A peer that does not answer (down, slow, refused, a bad body) is counted in `peer_errors` and
logged. With `strict=True` (what the runtime builds for the tuner) the read then raises
`contracts.fleet.PartialFleetError`: the tuning loop skips that cycle instead of taking a part of
the fleet for the whole (agent/runtime/tuning_loop.py). With `strict=False` the peer is left out
of that read (a partial fleet, never stale or invented rows). While the shard count changes, a
pod can briefly be in two shards' windows (the old owner keeps its rows until they age out);
reads during that time count it twice.
"""
from __future__ import annotations

import io
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import polars as pl

from agent.collect.store import WindowStore
from agent.collect.window import WINDOW_SCHEMA
from contracts.fleet import PartialFleetError

log = logging.getLogger(__name__)

Fetch = Callable[[str, float], bytes]


def fetch_url(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read()


class FleetStore(WindowStore):
    """A read-only `WindowStore` over this shard's store and its peers' windows."""

    def __init__(self, local: WindowStore, peers: Sequence[str], fetch: Fetch = fetch_url,
                 timeout_s: float = 5.0, *, strict: bool = False) -> None:
        super().__init__(local.retention_s, local.window_s, local.clock)
        self.local = local
        self.peers = tuple(p.rstrip("/") for p in peers)
        self.fetch = fetch
        self.timeout_s = timeout_s
        self.strict = strict
        self.peer_errors: dict[str, int] = {}

    def ingest(self, *_args: object, **_kw: object):  # type: ignore[override]
        raise TypeError("FleetStore is read-only: ingest into the shard's own store")

    def frame(self, since: float | None = None) -> pl.DataFrame:
        raise TypeError("FleetStore has no raw frames across replicas: read window() or window_between()")

    @property
    def rows(self) -> int:
        return self.local.rows

    def peer_window(self, peer: str, query: str) -> pl.DataFrame | None:
        """One peer's `/window?<query>`; None (or PartialFleetError when strict) if it failed."""
        try:
            frame = pl.read_ipc(io.BytesIO(self.fetch(f"{peer}/window?{query}", self.timeout_s)))
            return frame.select(list(WINDOW_SCHEMA)).cast(WINDOW_SCHEMA)  # type: ignore[arg-type]
        except (OSError, urllib.error.URLError, pl.exceptions.PolarsError, ValueError) as exc:
            self.peer_errors[peer] = self.peer_errors.get(peer, 0) + 1
            reason = str(exc) or type(exc).__name__
            if self.strict:
                log.warning("fleet view: shard %s did not answer, the read is refused: %s", peer, reason)
                raise PartialFleetError(peer, reason) from None
            log.warning("fleet view: shard %s left out of this read: %s", peer, reason)
            return None

    def _union(self, local: pl.DataFrame, query: str) -> pl.DataFrame:
        frames = [local]
        for peer in self.peers:
            frame = self.peer_window(peer, query)
            if frame is not None:
                frames.append(frame)
        return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]

    def window(self, window_s: float | None = None, now: float | None = None) -> pl.DataFrame:
        window_s = self.window_s if window_s is None else window_s
        return self._union(self.local.window(window_s, now), f"window_s={window_s:g}")

    def window_between(self, since: float, until: float) -> pl.DataFrame:
        return self._union(self.local.window_between(since, until), f"since={float(since)!r}&until={float(until)!r}")


__all__ = ["FleetStore", "fetch_url"]
