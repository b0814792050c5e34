"""Streams of several passes sent together, so that no pass is systematically first.

The real-engine demo sends one request stream to two fleets at once (one tuned, one held) whose
engines share the machine's cores. Two independent open-loop senders would each wake on their own
schedule, and whichever is late by a few milliseconds (its thread woke second, it waited for the
GIL) lands its request behind the other's on the shared core every time: a bias that favours one
pass and looks like a gain. `PairedSend` removes it: every pass joins with its sender, prompts and
arrival offsets; when all have joined, one dispatcher thread sends request i of every pass at the
same moment, in an order drawn per request from a seeded generator, on one worker pool.

`join` blocks until every pass has joined and returns the dispatcher thread (alive while requests
are sent or outstanding); `done[name]` then holds that pass's completions. Setting any sender's
`stop` stops the dispatch. Clock and sleep are injected.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from emulator.engines.client import Completion, StreamSender


class PairedSend:
    def __init__(self, names: Sequence[str], *, seed: int = 0, workers: int = 48,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if not names or len(set(names)) != len(names):
            raise ValueError(f"PairedSend: pass names must be distinct and at least one, got {list(names)}")
        self.names = tuple(names)
        self.seed, self.workers, self.clock, self.sleep = seed, workers, clock, sleep
        self.done: dict[str, list[Completion]] = {n: [] for n in self.names}
        self.dispatched: list[tuple[float, tuple[str, ...]]] = []  # request i: (seconds from start, order sent)
        self._streams: dict[str, tuple[StreamSender, Sequence[Sequence[int]], Sequence[float]]] = {}
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(len(self.names))
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self, name: str, sender: StreamSender, prompts: Sequence[Sequence[int]],
             offsets_s: Sequence[float]) -> threading.Thread:
        if name not in self.done:
            raise ValueError(f"PairedSend: unknown pass {name!r}; passes: {', '.join(self.names)}")
        if len(prompts) != len(offsets_s):
            raise ValueError(f"pass {name}: {len(prompts)} prompts but {len(offsets_s)} offsets")
        with self._lock:
            self._streams[name] = (sender, prompts, offsets_s)
        if self._barrier.wait() == 0:
            self._thread = threading.Thread(target=self._dispatch, name="paired-stream", daemon=True)
            self._thread.start()
            self._started.set()
        self._started.wait()
        assert self._thread is not None
        return self._thread

    def _stopped(self) -> bool:
        return any(s.stop.is_set() for s, _, _ in self._streams.values())

    def _dispatch(self) -> None:
        offsets = self._streams[self.names[0]][2]
        if any(list(o) != list(offsets) for _, _, o in self._streams.values()):  # so the same requests, too
            raise ValueError("PairedSend: every pass must send the same arrival times")
        rng = random.Random(self.seed)
        t0 = self.clock()
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="paired") as pool:
            for i, at in enumerate(offsets):
                while not self._stopped():
                    wait = at - (self.clock() - t0)
                    if wait <= 0:
                        break
                    self.sleep(min(wait, 0.25))
                if self._stopped():
                    break
                order = list(self.names)
                rng.shuffle(order)
                self.dispatched.append((self.clock() - t0, tuple(order)))
                for name in order:
                    pool.submit(self._one, name, i, t0)

    def _one(self, name: str, index: int, t0: float) -> None:
        sender, prompts, _ = self._streams[name]
        c = sender.one(index, prompts[index], t0)
        with self._lock:
            self.done[name].append(c)


__all__ = ["PairedSend"]
