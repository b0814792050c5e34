"""A faithful emulation of vLLM's ZMQ KV-event publisher, release by release (0.9.0 to 0.33.0,
`kv_wire_formats.py`), for tests, the benchmark and the demo's emulated pods (which feed it the
twin's `contracts.events` records).

Wire format (reference `kv-events.md`, sections 1.2-1.6):
- PUB socket, one multipart message per batch: `[topic, seq (uint64 big-endian), payload]`,
  seq from 0 per publisher, +1 per batch; a restart resets it to 0.
- payload = msgspec msgpack of `KVEventBatch` = array `[ts, events, data_parallel_rank]`
  (`[ts, events]` in 0.9.0).
- events: msgpack maps with a `"type"` tag (vLLM >= 0.24, `release="0.33.0"` by default;
  `encoding="map"`), or positional arrays `["BlockStored", ...]` (<= 0.23; `encoding="array"` is
  0.23.0), with the fields of the chosen release; hashes unsigned, signed or bytes (`hashes=`).
- optional ROUTER replay socket: request `[id, b"", start_seq]` -> every buffered batch with
  seq >= start_seq as `[id, b"", topic, seq, payload]`, then `[id, b"", b"", -1 (signed), b""]`
  (0.26+); up to 0.25.x without the topic frames: `[id, b"", seq, payload]`, `[id, b"", -1, b""]`.
  The buffer keeps the last `buffer_steps` batches, including ones lost on the PUB side.

Deviation: vLLM binds only when the endpoint contains `*`/`::` or is ipc/inproc, and connects
otherwise. Tests bind on 127.0.0.1 (`bind=True`); `bind=None` applies vLLM's rule.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

import msgspec
import zmq

from contracts import events as twin
from emulator.cluster.kv_wire_formats import HashKind, WireFormat, wire_format

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
Encoding = Literal["map", "array"]


def vllm_binds(endpoint: str) -> bool:
    """vLLM's rule: bind when the address is a wildcard or local transport, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """vLLM's data-parallel endpoint: tcp port + rank (port 0 untouched), inproc gets `_dp<rank>`.

    Written again on purpose, from vLLM's rule, rather than imported from the agent's subscriber
    (`agent.kvevents.settings.offset_endpoint`): this module plays vLLM in the tests, and an
    emulator that shared the agent's code would make the data-parallel tests circular."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{host}:{int(port) + dp_rank}"
    return endpoint


def _legacy(encoding: Encoding) -> WireFormat:
    return wire_format("0.33.0" if encoding == "map" else "0.23.0")


def stored_event(hashes: Sequence[int | bytes], parent: int | bytes | None, block_size: int,
                 medium: str | None = MEDIUM_GPU, *, encoding: Encoding = "map",
                 token_ids: list[int] | None = None, group_idx: int | None = 0,
                 spec_kind: str | None = "full_attention") -> Any:
    """A BlockStored as vLLM 0.33 (`encoding="map"`) or 0.23 (`"array"`) encodes it; synthetic
    token ids (len = blocks x block_size) when none are given. `WireFormat.stored` for others."""
    return _legacy(encoding).stored(hashes, parent, block_size, medium, token_ids=token_ids,
                                    group_idx=group_idx, spec_kind=spec_kind)


def removed_event(hashes: Sequence[int | bytes], medium: str | None = MEDIUM_GPU, *,
                  encoding: Encoding = "map", group_idx: int | None = 0) -> Any:
    return _legacy(encoding).removed(hashes, medium, group_idx=group_idx)


def cleared_event(encoding: Encoding = "map") -> Any:
    return _legacy(encoding).cleared()


class KvEventPublisher:
    """One engine's (one DP rank's) publisher. Sockets live in a background thread, as in vLLM;
    public methods are thread-safe and only enqueue work. Use as a context manager or `close()`."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0", *, replay_endpoint: str | None = None,
                 topic: str = "", encoding: Encoding | None = None, release: str | None = None,
                 hashes: HashKind | None = None, buffer_steps: int = 10_000,
                 hwm: int = 100_000, data_parallel_rank: int = 0, bind: bool | None = None,
                 context: zmq.Context | None = None) -> None:
        if encoding not in (None, "map", "array"):
            raise ValueError(f"encoding must be 'map' (vLLM >= 0.24) or 'array' (<= 0.23), got {encoding!r}")
        if release is None:
            release = "0.23.0" if encoding == "array" else "0.33.0"
        self.format: WireFormat = wire_format(release, hashes)
        self.encoding: Encoding = self.format.events
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._ctx = context or zmq.Context.instance()
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._seq = 0
        self._drop = 0
        self.published = 0
        self.replays_served = 0
        # XPUB is PUB on the wire; it also hands this thread each subscription, so callers can wait
        # for a subscriber instead of sleeping through ZMQ's slow joiner
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        addr = offset_endpoint(endpoint, data_parallel_rank)
        if "[" in addr:  # an IPv6 literal: vLLM enables IPv6 on its sockets for an IPv6 host IP
            self._pub.setsockopt(zmq.IPV6, 1)
        if vllm_binds(addr) if bind is None else bind:
            self._pub.bind(addr)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._pub.connect(addr)
            self.endpoint = addr
        self._subscriptions = 0
        self._subscribed = threading.Condition()
        self._replay: zmq.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.IPV6, int("[" in replay_endpoint))
            self._replay.bind(offset_endpoint(replay_endpoint, data_parallel_rank))
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-publisher", daemon=True)
        self._thread.start()

    # -- public API (any thread) -----------------------------------------------------------
    def publish(self, events: Sequence[Any], ts: float | None = None) -> None:
        """Queue one batch (one scheduler step's events); `ts` defaults to wall-clock now."""
        batch = self.format.batch(time.time() if ts is None else ts, list(events), self.data_parallel_rank)
        self._queue.put(("batch", batch))

    def send_raw(self, frames: Sequence[bytes]) -> None:
        """Send arbitrary frames on the PUB socket (malformed-input tests); no seq is consumed."""
        self._queue.put(("raw", list(frames)))

    def drop_next(self, n: int) -> None:
        """The next n batches get sequence numbers and enter the replay buffer but are not sent,
        as when a slow subscriber's HWM overflows."""
        self._queue.put(("drop", n))

    def restart(self) -> None:
        """Emulate an engine restart: sequence back to 0, replay buffer emptied."""
        self._queue.put(("restart", None))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything queued so far has been sent."""
        done = threading.Event()
        self._queue.put(("mark", done))
        if not done.wait(timeout):
            raise TimeoutError("publisher did not drain its queue in time")

    def wait_subscribed(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` subscriptions have reached this socket (a subscriber connected before
        this returns sees every later batch)."""
        with self._subscribed:
            if not self._subscribed.wait_for(lambda: self._subscriptions >= count, timeout):
                raise TimeoutError(f"{self.endpoint}: {self._subscriptions} of {count} subscriptions after {timeout:g} s")

    @property
    def next_seq(self) -> int:
        return self._seq

    def close(self) -> None:
        if self._running:
            self._running = False
            self._thread.join(timeout=5.0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publisher thread ------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._running or not self._queue.empty():
                while self._pub.poll(0):
                    self._note_subscription(self._pub.recv())
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._service_replay()
                try:
                    kind, item = self._queue.get(timeout=0.01)
                except queue.Empty:
                    continue
                self._handle(kind, item)
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _note_subscription(self, frame: bytes) -> None:
        if frame[:1] == b"\x01":  # \x01 + topic subscribes, \x00 + topic unsubscribes
            with self._subscribed:
                self._subscriptions += 1
                self._subscribed.notify_all()

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "batch":
            seq = self._seq
            self._seq += 1
            payload = self._encoder.encode(item)
            self._buffer.append((seq, payload))
            if self._drop > 0:
                self._drop -= 1
            else:
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
                self.published += 1
        elif kind == "raw":
            self._pub.send_multipart(item)
        elif kind == "drop":
            self._drop += item
        elif kind == "restart":
            self._seq = 0
            self._buffer.clear()
        elif kind == "mark":
            item.set()

    def _service_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            return  # vLLM logs and ignores anything else
        client, start = frames[0], int.from_bytes(frames[2], "big")
        head: tuple[bytes, ...] = (client, b"", self.topic) if self.format.replay_topic else (client, b"")
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart((*head, seq.to_bytes(8, "big"), payload))
        end = (client, b"", b"") if self.format.replay_topic else (client, b"")
        self._replay.send_multipart((*end, END_SEQ, b""))
        self.replays_served += 1


class TwinEventPublisher:
    """An `EventSink` for the twin: turns `contracts.events` records into vLLM batches, one batch
    per pod per twin step (events of equal `ts`), published on that pod's `KvEventPublisher`.

    Batch timestamps are `clock_offset + twin ts` (use the wall clock at workload start for live
    emulation). Call `flush()` at the end of a run."""

    def __init__(self, publishers: Mapping[str, KvEventPublisher], clock_offset: float = 0.0,
                 tokens: Literal["synthetic", "empty"] = "synthetic") -> None:
        self.publishers = dict(publishers)
        self.clock_offset = clock_offset
        self.tokens = tokens
        self._pending: dict[str, list[Any]] = {}
        self._step_ts: float | None = None
        self.unknown_pods: set[str] = set()

    def __call__(self, event: twin.TwinEvent) -> None:
        if self._step_ts is not None and event.ts != self._step_ts:
            self.flush_step()
        self._step_ts = event.ts
        pub = self.publishers.get(event.pod)
        if pub is None:
            self.unknown_pods.add(event.pod)
            return
        fmt = pub.format
        if isinstance(event, twin.BlockStored):
            tokens = [] if self.tokens == "empty" else None
            gpu = event.medium == MEDIUM_GPU
            ev = fmt.stored(event.block_hashes, event.parent_block_hash, event.block_size, event.medium,
                            token_ids=tokens, group_idx=0 if gpu else None,
                            spec_kind="full_attention" if gpu else None)
        elif isinstance(event, twin.BlockRemoved):
            ev = fmt.removed(event.block_hashes, event.medium, group_idx=0 if event.medium == MEDIUM_GPU else None)
        else:
            ev = fmt.cleared()
        self._pending.setdefault(event.pod, []).append(ev)

    def flush_step(self) -> None:
        ts = self.clock_offset + (self._step_ts or 0.0)
        for pod, evs in self._pending.items():
            self.publishers[pod].publish(evs, ts=ts)
        self._pending = {}

    def flush(self, timeout: float = 30.0) -> None:
        self.flush_step()
        for pub in self.publishers.values():
            pub.flush(timeout)


def open_pod_publishers(pods: Sequence[str], *, encoding: Encoding | None = None, host: str = "127.0.0.1",
                        replay: bool = True, model: str = "model", **kwargs: Any) -> dict[str, KvEventPublisher]:
    """One bound publisher per pod on free loopback ports, topic `kv@<pod>@<model>` (llm-d's)."""
    return {
        pod: KvEventPublisher(f"tcp://{host}:0", replay_endpoint=f"tcp://{host}:0" if replay else None,
                              topic=f"kv@{pod}@{model}", encoding=encoding, bind=True, **kwargs)
        for pod in pods
    }
