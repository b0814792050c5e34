"""Sharded direct scraping: N agent replicas split the fleet's pods by rendezvous hashing.

Each pod goes to the shard with the highest `hash(shard, pod)` (highest random weight). A pod's
shard depends only on its own identity and the shard count, so pods coming and going never move
the others (stable under churn: a pod keeps its shard, its counters' history and its KV-event
index stay with one replica). Every endpoint of one pod (vLLM, an LMCache sidecar, the Curvine
FUSE client credited to it) lands on the same shard, because the key is the pod, not the URL:
the normaliser needs all of a pod's sources together to pick one per signal. The key is the pod
name alone, which the KV-event endpoints (`EndpointSpec.pod`) share with the scrape targets, so
a pod's metrics and its event stream go to the same replica. Changing the shard
count moves about 1/N of the pods, the minimum.

The hash is BLAKE2b (keyed by nothing, stable across processes and Python versions), not
Python's salted `hash()`.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from contracts.tier_model import Target


def _weight(shard: int, key: str) -> int:
    digest = hashlib.blake2b(f"{shard}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_of(key: str, count: int) -> int:
    """The shard (0..count-1) that owns `key`: rendezvous (highest random weight) hashing."""
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    if count == 1:
        return 0
    return max(range(count), key=lambda s: _weight(s, key))


def owned(targets: Iterable[Target], index: int, count: int) -> tuple[Target, ...]:
    """The targets of the pods shard `index` owns (all of them when count is 1)."""
    if count == 1:
        return tuple(targets)
    cache: dict[str, int] = {}
    out = []
    for t in targets:
        s = cache.get(t.pod)
        if s is None:
            s = cache[t.pod] = shard_of(t.pod, count)
        if s == index:
            out.append(t)
    return tuple(out)


class ShardedTargets:
    """A target source restricted to one shard (wraps any `TargetSource`)."""

    def __init__(self, source: object, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} is outside 0..{count - 1}")
        self.source = source
        self.sources = getattr(source, "sources", (source,))  # the agent starts/stops these
        self.index = index
        self.count = count

    def targets(self) -> tuple[Target, ...]:
        return owned(self.source.targets(), self.index, self.count)  # type: ignore[attr-defined]


_ORDINAL = re.compile(r"-(\d+)$")


def shard_index(configured: int | None, count: int, env: Mapping[str, str] | None = None) -> int:
    """The configured index, else the StatefulSet ordinal at the end of $POD_NAME (or
    $HOSTNAME), else 0. ValueError when it is not below `count`."""
    env = os.environ if env is None else env
    index = configured
    if index is None:
        name = env.get("POD_NAME") or env.get("HOSTNAME") or ""
        m = _ORDINAL.search(name)
        index = int(m.group(1)) if m else 0
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is outside 0..{count - 1} (shard.count {count})")
    return index


def other_peers(peers: Sequence[str], me: str | None) -> tuple[str, ...]:
    """`shard.peers` without this replica's own URL. One config can then list every replica of a
    StatefulSet (`http://<pod>.<headless service>:9400`, what the Helm chart renders): a peer whose
    host is `me` ($POD_NAME) or starts with `me.` is this replica."""
    out = []
    for peer in peers:
        host = (urlsplit(peer).hostname or "").lower()
        if me and (host == me.lower() or host.startswith(me.lower() + ".")):
            continue
        out.append(peer)
    return tuple(out)



