"""Benchmark: what the histogram export costs on /metrics.

A synthetic snapshot of 200 pods, each with vLLM 0.33's 22-bucket TTFT histogram, three tiers and
Curvine FUSE read/write latency histograms (the FUSE client's 12 bounds). Prints, in this process:
- the time to render /metrics (collect + classic text format) with every family, against the
  same snapshot rendered without the histogram families (the pre-issue export): the ratio;
- the payload size with and without the histograms.
No target: the figures are reported in docs/metrics.md and the issue's closing note.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PODS = 200
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0, 160.0, 640.0, 2560.0)
FUSE_BOUNDS_S = tuple(b * 1e-6 for b in (10, 50, 100, 500, 1000, 5000, 10000, 50000, 100000, 500000, 1e6, 5e6))


def snapshot():
    from contracts.tier_model import HistogramView, L2IoView, PodView, Snapshot, TierView

    def hist(pod: str, model: str, bounds: tuple[float, ...], scale: int) -> HistogramView:
        counts = tuple(float(scale * (i + 1)) for i in range(len(bounds) + 1))
        return HistogramView(pod, model, bounds, counts, total=scale * 0.5, count=counts[-1])

    tiers, pods, io, ttft = [], [], [], []
    for n in range(PODS):
        pod, model = f"vllm-llama-{n}", "meta-llama/Llama-3.1-8B-Instruct"
        for tier, src in (("gpu", "vllm_v1"), ("cpu", "vllm_by_source"), ("l2", "vllm_by_source")):
            tiers.append(TierView(pod, model, tier, src, 1e6, 4e5, 0.4, 0.6, evicted_chunks=10.0, usage_ratio=0.5))
        pods.append(PodView(pod, model, 1e6, 1e4, {0.5: 0.1, 0.95: 0.5, 0.99: 0.9}))
        ttft.append(hist(pod, model, TTFT_BOUNDS, 100 + n))
        for op in ("read", "write"):
            io.append(L2IoView(pod, op, {0.5: 0.001, 0.95: 0.01, 0.99: 0.05},  # type: ignore[arg-type]
                               hist(pod, "", FUSE_BOUNDS_S, 50 + n)))
    return Snapshot(taken_at=time.time(), tiers=tuple(tiers), pods=tuple(pods), l2_io=tuple(io),
                    ttft_histograms=tuple(ttft))


def main() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from exporters import prom
    from exporters.prom import SnapshotCollector, build_registry

    snap = snapshot()
    full = build_registry(lambda: snap)

    class WithoutHistograms(SnapshotCollector):
        def collect(self):
            yield from prom.tier_families(snap)
            yield from prom.health_families(snap)

    reference = CollectorRegistry(auto_describe=False)
    reference.register(WithoutHistograms(lambda: snap))

    def best(registry, reps: int = 7) -> tuple[float, int]:
        times, size = [], 0
        for _ in range(reps):
            t0 = time.perf_counter()
            size = len(generate_latest(registry))
            times.append(time.perf_counter() - t0)
        return min(times), size

    best(full, 2)
    best(reference, 2)
    t_full, n_full = best(full)
    t_ref, n_ref = best(reference)
    print(f"{PODS} pods: /metrics render {t_full * 1000:.1f} ms with histograms vs {t_ref * 1000:.1f} ms without "
          f"(ratio {t_full / t_ref:.2f}x); payload {n_full / 1024:.0f} KiB vs {n_ref / 1024:.0f} KiB "
          f"(ratio {n_full / n_ref:.2f}x)")


if __name__ == "__main__":
    main()
