"""Run by the engine venv's interpreter (it needs vllm and torch), with the repository on PYTHONPATH:
store engine blocks into a real `SharedOffloadRegion` through the project's CPU offload worker,
load them back into other blocks, and print, as one JSON line, what tests/test_real_tiers.py
checks: the loaded bytes equal the stored ones, the region rows hold them where upstream's
secondary tiers read them, and the transfer results.

    PYTHONPATH=. .venv-engine/bin/python tests/support/offload_roundtrip.py
"""
from __future__ import annotations

import json
import uuid

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from emulator.engines.cpu_offload_spec import CpuCopyWorker

BLOCKS, BPC, CHUNKS = 16, 2, 8
PAGES = (4096, 8192)  # bytes per engine block, per tensor
USED = (4096, 6144)  # the layers' un-padded page sizes: only these bytes move


def rows_hold(region: SharedOffloadRegion, original: list[torch.Tensor], slots: dict[tuple[int, int], int]) -> bool:
    """Whether each (chunk, slot) row of the region, as the secondary tiers read it, holds that block."""
    rows = np.asarray(region.create_kv_memoryview())
    return all(rows[chunk, sum(PAGES[:t]) * BPC + slot * PAGES[t]:][:USED[t]].tobytes()
               == original[t][block, :USED[t]].numpy().tobytes()
               for (chunk, slot), block in slots.items() for t in range(len(PAGES)))


def main() -> None:
    gen = torch.Generator().manual_seed(7)
    engine = [torch.randint(-128, 128, (BLOCKS, p), dtype=torch.int8, generator=gen) for p in PAGES]
    original = [t.clone() for t in engine]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, p) for t, p in zip(engine, PAGES, strict=True)],
        group_data_refs=[[CanonicalKVCacheRef(0, USED[0]), CanonicalKVCacheRef(1, USED[1])]])
    row = sum(PAGES) * BPC
    region = SharedOffloadRegion(engine_id=f"tierpilot-test-{uuid.uuid4().hex}", num_chunks=CHUNKS, rank=0,
                                 kv_bytes_per_chunk=row, cpu_page_size=row)
    worker = CpuCopyWorker(caches, BPC, region)
    try:
        stored = [5, 9, 2]  # the request's blocks 1..3: slot 1 of chunk 3, then both slots of chunk 6
        worker.submit_store(1, GPULoadStoreSpec(stored, [3], [1]), CPULoadStoreSpec([3, 6]))
        layout_ok = rows_hold(region, original, {(3, 1): 5, (6, 0): 9, (6, 1): 2})
        loaded = [11, 12, 13]
        for t in engine:
            t[loaded] = 0
        worker.submit_load(2, CPULoadStoreSpec([3, 6]), GPULoadStoreSpec(loaded, [3], [1]))
        equal = all(torch.equal(engine[t][dst, :USED[t]], original[t][src, :USED[t]])
                    for src, dst in zip(stored, loaded, strict=True) for t in range(len(PAGES)))
        padding_untouched = all(int(engine[1][dst, USED[1]:].abs().sum()) == 0 for dst in loaded)
        others_untouched = all(torch.equal(engine[t][b], original[t][b]) for t in range(len(PAGES))
                               for b in range(BLOCKS) if b not in loaded)
        results = [(r.job_id, r.success, r.transfer_size) for r in worker.get_finished()]
        print(json.dumps({"equal": equal, "layout": layout_ok, "padding_untouched": padding_untouched,
                          "others_untouched": others_untouched, "results": results,
                          "after": len(worker.get_finished())}))
    finally:
        worker.shutdown()


if __name__ == "__main__":
    main()
