"""The real-engine launcher's pure parts and its shell, driven by an injected launcher, probe and
clock (no engine is started here; tests/test_real_engine_*.py start real ones)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.engines.engine import (
    EngineError,
    EngineProcess,
    EngineSpec,
    engine_available,
    engine_command,
    engine_dtype,
    engine_environment,
    engine_venv,
)
from emulator.engines.tiering import TieringConfig, TieringError, kv_transfer_config


def _spec(**kw) -> EngineSpec:
    return EngineSpec(model=Path("/m"), port=8100, **kw)


def test_command_names_the_cache_size_block_size_and_kv_events() -> None:
    cmd = engine_command(_spec(kv_cache_tokens=3072, dtype="bfloat16", kv_events_port=9001, replay_port=9002,
                               topic="kv@p@m"), Path("/venv/bin/python"))
    assert cmd[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(12 << 20)  # 3,072 tokens x 4 KiB
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    fp32 = engine_command(_spec(kv_cache_tokens=3072, dtype="float32"), Path("/p"))
    assert fp32[fp32.index("--kv-cache-memory-bytes") + 1] == str(24 << 20)  # the same tokens at 8 KiB
    assert cmd[cmd.index("--block-size") + 1] == "32"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    cfg = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:9001",
                   "topic": "kv@p@m", "replay_endpoint": "tcp://*:9002"}
    assert "--kv-events-config" not in engine_command(_spec(), Path("/p"))
    assert "--no-enable-prefix-caching" in engine_command(_spec(prefix_caching=False), Path("/p"))


def test_spec_refuses_what_the_cpu_backend_refuses() -> None:
    with pytest.raises(EngineError, match="multiple of 32"):
        _spec(block_size=16)
    with pytest.raises(EngineError, match="replay_port needs kv_events_port"):
        _spec(replay_port=9)
    with pytest.raises(EngineError, match="must hold one 2048-token sequence"):
        _spec(kv_cache_tokens=1024)
    with pytest.raises(EngineError, match="dtype 'int8'"):
        _spec(dtype="int8")


def test_tiering_adds_the_kv_transfer_config_and_the_worker_on_the_path(tmp_path: Path) -> None:
    tiering = TieringConfig(cpu_bytes=64 << 20, chunk_tokens=64, eviction_policy="arc", fs_root=Path("/l2"),
                            extra=(("store_threshold", 0),))
    spec = _spec(tiering=tiering)
    cmd = engine_command(spec, Path("/p"), "tierpilot-8100-x")
    cfg = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert cfg == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "engine_id": "tierpilot-8100-x",
                   "kv_connector_extra_config": {
                       "spec_name": "CpuTieringOffloadingSpec", "spec_module_path": "emulator.engines.cpu_offload_spec",
                       "cpu_bytes_to_use": 64 << 20, "block_size": 64, "eviction_policy": "arc",
                       "self_describing_kv_events": False, "store_threshold": 0,
                       "secondary_tiers": [{"type": "fs", "root_dir": "/l2", "enable_kv_events": True}]}}
    bare = kv_transfer_config(TieringConfig(cpu_bytes=1 << 20))["kv_connector_extra_config"]
    assert "block_size" not in bare and "secondary_tiers" not in bare and bare["eviction_policy"] == "lru"
    assert "--kv-transfer-config" not in engine_command(_spec(), Path("/p"))
    env = engine_environment(spec, tmp_path, base={"PYTHONPATH": "/elsewhere"})
    assert (Path(env["PYTHONPATH"]) / "emulator" / "engines" / "cpu_offload_spec.py").is_file()
    assert env["PYTHONHASHSEED"] == "0"  # block hashes, so the fs tier's file names, agree across engines
    assert "PYTHONPATH" not in engine_environment(_spec(), tmp_path, base={"PYTHONPATH": "/elsewhere"})


def test_tiering_refuses_what_vllm_refuses() -> None:
    with pytest.raises(TieringError, match="eviction_policy 'lfu'"):
        TieringConfig(cpu_bytes=1, eviction_policy="lfu")
    with pytest.raises(TieringError, match="positive size"):
        TieringConfig(cpu_bytes=0)
    with pytest.raises(EngineError, match="chunk_tokens 48: must be a multiple of the engine's block size 32"):
        _spec(tiering=TieringConfig(cpu_bytes=1, chunk_tokens=48))


def test_stop_removes_the_shared_region_a_killed_engine_leaves(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    started = []
    eng = EngineProcess(_spec(tiering=TieringConfig(cpu_bytes=1 << 20)), tmp_path, venv=tmp_path, shm=shm,
                        launcher=lambda cmd, **kw: started.append(cmd) or _FakeProc())
    eng.start()
    cfg = json.loads(started[0][started[0].index("--kv-transfer-config") + 1])
    assert cfg["engine_id"] == eng.offload_id
    left = shm / f"vllm_offload_{eng.offload_id}.mmap"
    other = shm / "vllm_offload_someone-else.mmap"
    left.write_bytes(b"x")
    other.write_bytes(b"x")
    eng.proc = None  # as if the process group were already gone
    eng.stop()
    assert not left.exists() and other.exists()


def test_dtype_is_bf16_only_where_the_processor_has_it_natively() -> None:
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert engine_dtype(avx2) == "float32"  # bf16 emulated on AVX2: a prefill ~4x slower than float32
    assert engine_dtype(avx2.replace("avx2", "avx2 avx512f avx512_bf16")) == "bfloat16"
    assert engine_dtype(avx2.replace("avx2", "avx2 amx_bf16 amx_tile")) == "bfloat16"
    assert engine_dtype("") == "float32"


def test_environment_is_offline_pinned_and_drops_the_cache_space_override(tmp_path: Path) -> None:
    env = engine_environment(_spec(cpu_bind="1"), tmp_path,
                             base={"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/bin", "VIRTUAL_ENV": "/x"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "VIRTUAL_ENV" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert env["TMPDIR"] == str(tmp_path / "tmp")


def test_venv_locator_and_availability(tmp_path: Path) -> None:
    assert engine_venv({"TIERPILOT_ENGINE_VENV": str(tmp_path)}) == tmp_path
    assert "no vLLM engine venv" in engine_available(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    assert "no tiny model" in engine_available(tmp_path)


class _FakeProc:
    def __init__(self, exit_after: int | None = None) -> None:
        self.pid, self.polls, self.exit_after = 424242, 0, exit_after

    def poll(self):
        self.polls += 1
        return 1 if self.exit_after is not None and self.polls > self.exit_after else None


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def test_wait_healthy_on_an_injected_clock(tmp_path: Path) -> None:
    clock, answers, started = _Clock(), iter([0, 0, 503, 200]), []

    def launcher(cmd, **kw):
        started.append((cmd, kw))
        return _FakeProc()

    eng = EngineProcess(_spec(), tmp_path, venv=tmp_path, launcher=launcher, clock=clock, sleep=clock.sleep,
                        probe=lambda url, timeout: next(answers))
    eng.start()
    assert eng.wait_healthy() == pytest.approx(1.5)
    assert started[0][1]["start_new_session"] is True
    assert (tmp_path / "tmp").is_dir()


def test_an_engine_that_dies_or_hangs_is_one_line_error(tmp_path: Path) -> None:
    clock = _Clock()
    eng = EngineProcess(_spec(), tmp_path, venv=tmp_path, launcher=lambda cmd, **kw: _FakeProc(exit_after=2),
                        clock=clock, sleep=clock.sleep, probe=lambda url, timeout: 0)
    (tmp_path / "engine-8100.log").write_text("line\nValueError: bad block size\n")
    with pytest.raises(EngineError, match="exited with 1 .*bad block size"):
        eng.start().wait_healthy()
    eng = EngineProcess(_spec(), tmp_path, venv=tmp_path, launcher=lambda cmd, **kw: _FakeProc(),
                        clock=clock, sleep=clock.sleep, probe=lambda url, timeout: 0)
    with pytest.raises(EngineError, match="not healthy after 10 s"):
        eng.start().wait_healthy(timeout=10)
