"""vLLM's multi-tier KV offload on the CPU engine: the CPU-platform worker for `TieringOffloadingSpec`.

Loaded by the engine itself (not by the project), through vLLM's extension point for offloading
specs: `kv_connector_extra_config` with `spec_name: CpuTieringOffloadingSpec` and
`spec_module_path: emulator.engines.cpu_offload_spec` (the launcher puts the repository on the
engine's PYTHONPATH). Everything but the worker stays upstream's: the tiering manager, the CPU
primary tier and its eviction (LRU or ARC), the secondary tiers (fs, ...), the shared region in
/dev/shm, the metrics and the KV events.

Upstream's `get_worker` refuses any platform but CUDA-alike and XPU, and its worker copies with
CUDA streams and swap-block kernels. This worker copies synchronously with `Tensor.copy_`, one
engine block at a time, between the engine's KV-cache tensors and this rank's view of the same
`SharedOffloadRegion` upstream's worker would use, so the scheduler side and the secondary tiers
see the bytes where they expect them. A job is finished when `submit_*` returns.

Not covered: `canonical_layout` (refused at start), more than one rank per engine, and packed or
hybrid multi-group layouts beyond what the per-group walk below handles (it follows upstream's
group_sizes/block_indices arithmetic, but only single-group models are tested here).
"""
from __future__ import annotations

import time

from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


def block_pairs(gpu: GPULoadStoreSpec, chunks: BlockIDsLoadStoreSpec, blocks_per_chunk: int):
    """(group, engine block, offload chunk, slot in chunk) for every engine block of a transfer.

    Upstream's layout: each group's engine blocks fill consecutive slots of its chunks, starting
    at slot `block_indices[g] % blocks_per_chunk` of the group's first chunk."""
    gpu_at = chunk_at = 0
    for group, (size, first) in enumerate(zip(gpu.group_sizes, gpu.block_indices, strict=True)):
        if size == 0:
            continue
        skip = first % blocks_per_chunk
        for j in range(size):
            slot = skip + j
            yield group, int(gpu.block_ids[gpu_at + j]), int(chunks.block_ids[chunk_at + slot // blocks_per_chunk]), \
                slot % blocks_per_chunk
        gpu_at += size
        chunk_at += -(-(size + skip) // blocks_per_chunk)


class CpuCopyWorker(OffloadingWorker):
    """Synchronous block copies between the engine's KV cache and the shared offload region."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, region: SharedOffloadRegion) -> None:
        self._region: SharedOffloadRegion | None = region
        self._bpc = blocks_per_chunk
        self._refs = kv_caches.group_data_refs
        self._engine = [t.tensor for t in kv_caches.tensors]  # int8 (num_blocks, page), stride per block
        self._pages = [t.page_size_bytes for t in kv_caches.tensors]
        # the same per-rank views, in the same order, as upstream's worker carves out of the region
        self._offload = [region.create_next_worker_view(p * blocks_per_chunk) for p in self._pages]
        self._finished: list[TransferResult] = []

    def _transfer(self, job_id: int, gpu: GPULoadStoreSpec, chunks: LoadStoreSpec, store: bool) -> bool:
        assert isinstance(chunks, BlockIDsLoadStoreSpec)
        t0, nbytes = time.perf_counter(), 0
        for group, block, chunk, slot in block_pairs(gpu, chunks, self._bpc):
            for ref in self._refs[group]:
                t, size = ref.tensor_idx, ref.page_size_bytes
                at = slot * self._pages[t]
                engine_page = self._engine[t][block, :size]
                offload_page = self._offload[t][chunk, at:at + size]
                if store:
                    offload_page.copy_(engine_page)
                else:
                    engine_page.copy_(offload_page)
                nbytes += size
        self._finished.append(TransferResult(job_id, True, nbytes, time.perf_counter() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every job finished inside submit_*

    def shutdown(self) -> None:
        self._engine.clear()
        self._offload.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class CpuTieringOffloadingSpec(TieringOffloadingSpec):
    """Upstream's tiering spec with a worker for the CPU platform."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            if self.config.canonical_layout:
                raise ValueError("CpuTieringOffloadingSpec does not support canonical_layout; remove it from "
                                 "kv_connector_extra_config")
            region = SharedOffloadRegion(
                engine_id=self._engine_id, num_chunks=self.num_chunks,
                rank=0 if self.replicated_layout else self.config.parallel.rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk, cpu_page_size=self.cpu_page_size_per_worker)
            try:
                self._worker = CpuCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._worker
