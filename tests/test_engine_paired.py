"""PairedSend: request i of every pass goes out together, in an order drawn per request."""
from __future__ import annotations

import threading

import pytest

from emulator.engines.client import StreamSender
from emulator.engines.paired import PairedSend


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def sleep(self, s: float) -> None:
        with self.lock:
            self.t += s


def _ok(url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    return 200, b'{"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}'


def _run(paired: PairedSend, senders: dict[str, StreamSender], offsets: list[float]) -> None:
    prompts = [[1, 2, 3]] * len(offsets)
    threads = [threading.Thread(target=lambda n=n: paired.join(n, senders[n], prompts, offsets).join())
               for n in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()


def test_every_pass_gets_every_request_at_the_same_offset_in_a_shuffled_order():
    clock = FakeClock()
    senders = {n: StreamSender("http://127.0.0.1:1", model="m", post=_ok, clock=clock, sleep=clock.sleep)
               for n in ("tuned", "held")}
    paired = PairedSend(["tuned", "held"], seed=7, clock=clock, sleep=clock.sleep)
    offsets = [0.5 * i for i in range(40)]
    _run(paired, senders, offsets)
    for name in senders:
        assert [c.index for c in sorted(paired.done[name], key=lambda c: c.index)] == list(range(40))
    assert [at for at, _ in paired.dispatched] == pytest.approx(offsets)  # both passes' request i in one dispatch
    for name in senders:
        assert all(c.sent_s >= offsets[c.index] - 1e-9 for c in paired.done[name])
    firsts = [order[0] for _, order in paired.dispatched]
    assert 10 <= firsts.count("tuned") <= 30  # neither pass is always first


def test_a_stop_ends_the_dispatch_and_bad_joins_are_refused():
    clock = FakeClock()
    sender = StreamSender("http://127.0.0.1:1", model="m", post=_ok, clock=clock, sleep=clock.sleep)
    sender.stop.set()
    paired = PairedSend(["only"], clock=clock, sleep=clock.sleep)
    paired.join("only", sender, [[1]] * 5, [1.0 * i for i in range(5)]).join(timeout=10)
    assert paired.done["only"] == []
    with pytest.raises(ValueError, match="unknown pass"):
        PairedSend(["a"]).join("b", sender, [[1]], [0.0])
    with pytest.raises(ValueError, match="distinct"):
        PairedSend(["a", "a"])
