"""The shared bearer token of sharded replicas: `/window` and `/kv/sketch` carry every pod's
window (what /metrics has, and more), and the peers reading them are other pods, so loopback-only
would break sharding. With `shard.token_file` (a Kubernetes Secret mounted in every replica):

- `PeerToken(path)`: the token, read from the file and re-read whenever the file changes (a
  stat per use; kubelet swaps a Secret volume's files atomically, so a rotation is seen within its
  sync period). After a rotation the previous token is still accepted for `grace_s`, because the
  replicas see the new Secret at different times. Comparison is constant-time
  (`hmac.compare_digest`). A file that cannot be read at start is a config error; a failed re-read
  later keeps the last token (and logs it).
- `PeerFetch(token)`: what `FleetStore`, `FleetOverlap` and the fleet sketch collector read peers
  with: `Authorization: Bearer <token>` (after a rotation, within the grace period, a refused read
  is tried once more with the previous token: the peer may not have seen the new Secret yet); a
  401/403 becomes `PeerRefused`, one line naming the peer and the setting to check; failures are counted per peer, endpoint and reason
  (`tierpilot_fleet_peer_fetch_failures_total`).
"""
from __future__ import annotations

import hmac
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric

from contracts.redact import redact_url

log = logging.getLogger(__name__)
REALM = 'Bearer realm="tierpilot-peers"'
PEER_ENDPOINTS = ("/window", "/kv/sketch", "/kv/rebuilt")  # what the token guards


class PeerTokenError(ValueError):
    """The token file cannot be used (one line, naming the setting)."""


class PeerRefused(OSError):
    """A peer answered 401/403: the replicas do not share the token."""


def _read(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise PeerTokenError(f"key 'shard.token_file': cannot read {path}: {exc.strerror or exc}") from None
    if not token:
        raise PeerTokenError(f"key 'shard.token_file': {path} is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise PeerTokenError(f"key 'shard.token_file': {path} must hold one token (no spaces or control characters)")
    return token


def _header_bytes(value: str) -> bytes:
    """A header value as bytes, whatever it holds: the HTTP server hands non-UTF-8 bytes over as
    surrogate escapes, which must compare (and fail: a token is printable text) rather than raise."""
    return value.encode("utf-8", "surrogatepass")


class PeerToken:
    def __init__(self, path: Path, *, grace_s: float = 300.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.grace_s = grace_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._token = _read(self.path)  # PeerTokenError: refuse to start
        self._stamp = self._stat()
        self._previous: str | None = None
        self._previous_until = 0.0
        self.rotations = 0
        self.refused = 0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def current(self) -> str:
        """The token now (re-read first when the file changed)."""
        stamp = self._stat()
        with self._lock:
            if stamp is not None and stamp != self._stamp:
                try:
                    token = _read(self.path)
                except PeerTokenError as exc:
                    log.warning("peer token: %s; keeping the previous token", exc)
                else:
                    if token != self._token:
                        self._previous, self._previous_until = self._token, self.monotonic() + self.grace_s
                        self._token = token
                        self.rotations += 1
                        log.info("peer token: %s changed; the previous token is accepted for %g s more",
                                 self.path, self.grace_s)
                    self._stamp = stamp
            return self._token

    def previous(self) -> str | None:
        """The token before the last rotation while its grace period lasts, else None."""
        self.current()
        with self._lock:
            return self._previous if self.monotonic() < self._previous_until else None

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header carries the token (or, within the grace period after
        a rotation, the previous one). Constant-time in the token's content."""
        scheme, _, given = (authorization or "").partition(" ")
        offered = _header_bytes(given).strip()
        current = self.current()
        ok = scheme.lower() == "bearer" and hmac.compare_digest(offered, current.encode())
        with self._lock:
            previous = self._previous if self.monotonic() < self._previous_until else None
        if not ok and previous is not None and scheme.lower() == "bearer":
            ok = hmac.compare_digest(offered, previous.encode())
        if not ok:
            with self._lock:
                self.refused += 1
        return ok


class PeerFetch:
    """`fetch(url, timeout_s) -> bytes` for peer reads, with the token when there is one."""

    def __init__(self, token: PeerToken | None = None) -> None:
        self.token = token
        self._lock = threading.Lock()
        self.failures: dict[tuple[str, str, str], int] = {}  # (peer, endpoint, reason) -> count

    def _count(self, url: str, reason: str) -> None:
        path = url.partition("?")[0]
        endpoint = next((e for e in PEER_ENDPOINTS if path.endswith(e)), "")
        key = (path[: len(path) - len(endpoint)], endpoint or "other", reason)
        with self._lock:
            self.failures[key] = self.failures.get(key, 0) + 1

    def _get(self, url: str, timeout_s: float, token: str | None) -> bytes:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as resp:
            return resp.read()

    def __call__(self, url: str, timeout_s: float) -> bytes:
        try:
            try:
                return self._get(url, timeout_s, self.token.current() if self.token is not None else None)
            except urllib.error.HTTPError as exc:
                previous = self.token.previous() if self.token is not None else None
                if exc.code not in (401, 403) or previous is None:
                    raise
                # this replica saw the rotation first: the peer may still hold the previous token
                return self._get(url, timeout_s, previous)
        except urllib.error.HTTPError as exc:
            where = redact_url(url.partition("?")[0])
            if exc.code in (401, 403):
                self._count(url, "refused")
                hint = ("this replica's shard.token_file does not hold the token the peer has" if self.token
                        else "this replica has no shard.token_file and the peer requires one")
                raise PeerRefused(f"{where} refused the read (HTTP {exc.code}): {hint}") from None
            self._count(url, "http_error")
            raise OSError(f"{where} answered HTTP {exc.code}") from None
        except OSError:
            self._count(url, "unreachable")
            raise

    def collector(self) -> PeerFetchCollector:
        return PeerFetchCollector(self)


class PeerFetchCollector:
    """`tierpilot_fleet_peer_fetch_failures_total{peer, endpoint, reason}` and, with a token,
    `tierpilot_peer_auth_refused_total` (reads of this replica's peer endpoints it refused)."""

    def __init__(self, fetch: PeerFetch) -> None:
        self.fetch = fetch

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("tierpilot_fleet_peer_fetch_failures",
                                  "Reads of a peer's /window or /kv/sketch that failed: refused (HTTP 401/403, "
                                  "the token), unreachable, http_error.", labels=["peer", "endpoint", "reason"])
        with self.fetch._lock:
            failures = dict(self.fetch.failures)
        for (peer, endpoint, reason), n in sorted(failures.items()):
            fam.add_metric([redact_url(peer), endpoint, reason], n)
        yield fam
        if self.fetch.token is not None:
            refused = CounterMetricFamily("tierpilot_peer_auth_refused",
                                          "Requests to this replica's /window or /kv/sketch refused for a missing "
                                          "or wrong bearer token.")
            refused.add_metric([], self.fetch.token.refused)
            yield refused


__all__ = ["PEER_ENDPOINTS", "REALM", "PeerFetch", "PeerFetchCollector", "PeerRefused", "PeerToken", "PeerTokenError"]
