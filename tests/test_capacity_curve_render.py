"""The KV capacity curve is rebuilt by a scheduled job, never inside a /metrics render: a render
reads the last finished rebuild at once, also while a rebuild over a large stream is running, so
/metrics stays under 100 ms while the index catches up."""
from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, generate_latest

from agent.kvevents.store_curve import StoreCurveCollector, StoreStream
from agent.runtime.assembly import build_runtime
from agent.settings import load_settings

RENDER_BUDGET_S = 0.1
BPT = 131072.0


class SlowStream:
    """A StoreStream whose curve pass blocks until released (a rebuild over a huge stream)."""

    def __init__(self, real: StoreStream) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.passes = 0

    def models(self) -> list[str]:
        return self.real.models()

    def curve(self, model: str, kv_bytes_per_token: float) -> object:
        self.passes += 1
        self.entered.set()
        assert self.release.wait(30)
        return self.real.curve(model, kv_bytes_per_token)


def _stream(blocks: int) -> StoreStream:
    stream = StoreStream()
    for start in range(0, blocks, 1000):  # reuse: each message stores its range and the one before
        stream.add("m", f"pod-{start % 2}", range(max(0, start - 1000), start + 1000), 16)
    return stream


def _render(registry: CollectorRegistry) -> tuple[float, str]:
    t0 = time.perf_counter()
    text = generate_latest(registry).decode()
    return time.perf_counter() - t0, text


def test_a_render_reads_the_last_rebuild_and_never_waits_for_one() -> None:
    slow = SlowStream(_stream(20_000))
    collector = StoreCurveCollector(slow, BPT)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    took, text = _render(registry)
    assert took < RENDER_BUDGET_S and "tierpilot_kv_cpu_capacity_hit_ratio" not in text  # nothing built yet
    assert slow.passes == 0  # a render never builds

    slow.release.set()
    assert collector.rebuild() == 1
    first = collector.points()
    slow.release.clear()
    slow.entered.clear()
    slow.real.add("m", "pod-0", range(50_000, 60_000), 16)  # the index moves on
    builder = threading.Thread(target=collector.rebuild)
    builder.start()
    try:
        assert slow.entered.wait(10)  # the rebuild is inside its pass now
        for _ in range(5):
            took, text = _render(registry)
            assert took < RENDER_BUDGET_S, f"render took {took * 1000:.0f} ms during a rebuild"
            assert 'tierpilot_kv_cpu_capacity_hit_ratio{capacity_gib="0",model="m"} 0.0' in text
        assert collector.points() == first  # the previous result, whole
    finally:
        slow.release.set()
        builder.join(30)
    assert collector.points() != first and slow.passes == 2


def test_renders_stay_fast_over_a_large_stream_while_it_is_rebuilt() -> None:
    stream = _stream(600_000)
    collector = StoreCurveCollector(stream, BPT)
    registry = CollectorRegistry()
    registry.register(collector)
    collector.rebuild()
    assert collector.build_s > RENDER_BUDGET_S  # the pass itself is slower than a render may be
    builder = threading.Thread(target=collector.rebuild)
    renders: list[float] = []
    builder.start()
    while builder.is_alive():
        renders.append(_render(registry)[0])
        time.sleep(0.01)
    builder.join()
    assert renders and max(renders) < RENDER_BUDGET_S, [round(r * 1000) for r in renders]


def test_the_agent_schedules_the_rebuild_as_a_job() -> None:
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0},
                             kv_events={"enabled": True, "discovery": False, "endpoints": []})
    rt = build_runtime(settings)
    jobs = {j.name: j for j in rt.agent.jobs}
    curve = jobs["kv_capacity_curve"].func.__self__  # type: ignore[attr-defined]
    assert isinstance(curve, StoreCurveCollector) and jobs["kv_capacity_curve"].func == curve.rebuild
    assert jobs["kv_capacity_curve"].interval_s == curve.refresh_s
    curve.stream.add("m", "pod-0", range(1000), 16)
    curve.stream.add("m", "pod-1", range(1000), 16)
    assert "tierpilot_kv_cpu_capacity_hit_ratio" not in rt.agent.metrics_text()  # a render builds nothing
    curve.rebuild()
    assert 'tierpilot_kv_cpu_capacity_hit_ratio{capacity_gib="0",model="m"} 0.0' in rt.agent.metrics_text()
