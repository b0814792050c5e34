"""The process actuator over fake router/engine processes (no real process is started): what each
change restarts, what it refuses before touching anything, rollback, the rolling KV resize; and the
router's argv and the stream sender on an injected clock and HTTP call."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from contracts.actuator import Actuator, PermanentActuationError, RefusedConfigError
from contracts.knobs import DEFAULT_KNOBS
from emulator.engines.client import StreamSender, parse_usage
from emulator.engines.engine import EngineError, EngineSpec
from emulator.engines.process_actuator import ProcessActuator
from emulator.engines.router import RouterProcess, RouterSpec, router_command, router_policy


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakeProc:
    """A restartable process: records the specs it was restarted with; restarts take `cost` s."""

    def __init__(self, spec, clock: FakeClock, cost: float, fail: bool = False) -> None:
        self.spec, self.clock, self.cost, self.fail = spec, clock, cost, fail
        self.restarted: list = []

    def restart(self, spec=None, timeout: float = 180.0) -> float:
        if self.fail:
            raise EngineError("engine on port 1 exited with 1 before it was healthy")
        self.spec = spec or self.spec
        self.restarted.append(self.spec)
        self.clock.t += self.cost
        return self.cost

    def replace(self, spec) -> float:
        self.replaced = getattr(self, "replaced", 0) + 1
        return self.restart(spec)


def _world(**kw):
    clock = FakeClock()
    router = FakeProc(RouterSpec(port=1, metrics_port=2, workers=("http://a", "http://b")), clock, 1.0)
    engines = [FakeProc(EngineSpec(model=Path("/m"), port=10 + i), clock, 28.0, **kw) for i in range(2)]
    return clock, router, engines


def test_a_router_change_restarts_the_router_only_with_the_mapped_policy() -> None:
    clock, router, engines = _world()
    seen = []
    act = ProcessActuator(router, engines, clock=clock, on_restart=seen.append)
    assert isinstance(act, Actuator)
    res = act.apply(DEFAULT_KNOBS.replace(router="prefixaware"))
    assert res.applied and res.restarted == ("router",) and res.changed == {"router": ("roundrobin", "prefixaware")}
    assert [s.policy for s in router.restarted] == ["cache_aware"]  # the twin's prefixaware -> vllm-router's
    assert all(not e.restarted for e in engines)
    assert [(r.target, r.at, r.seconds) for r in seen] == [("router", 0.0, 1.0)]
    assert act.current().router == "prefixaware"
    again = act.apply(act.current())
    assert not again.applied and again.message == "apply: no change" and len(router.restarted) == 1


def test_with_router_ports_a_policy_change_is_a_surge_rollout_onto_new_ports() -> None:
    clock, router, engines = _world()
    ports = iter([7001, 7002])
    act = ProcessActuator(router, engines, clock=clock, router_port=lambda: next(ports))
    act.apply(DEFAULT_KNOBS.replace(router="prefixaware"))
    assert router.replaced == 1
    assert (router.spec.port, router.spec.metrics_port, router.spec.policy) == (7001, 7002, "cache_aware")


def test_router_replace_keeps_the_old_router_until_the_new_one_is_healthy(tmp_path: Path, monkeypatch) -> None:
    clock = FakeClock()
    procs = []

    class Popen:
        def __init__(self, argv, **kw) -> None:
            self.argv, self.pid, self.code = argv, 5000 + len(procs), None
            procs.append(self)

        def poll(self):
            return self.code

        def wait(self, timeout=None):
            return self.code

    healthy = {"8000", "8001"}

    def probe(url: str, timeout: float) -> int:
        return 200 if url.split(":")[2].split("/")[0] in healthy else 0

    spec = RouterSpec(port=8000, metrics_port=8001, workers=("http://w",))
    proc = RouterProcess(spec, tmp_path, binary="/bin/vllm-router", launcher=Popen, clock=clock, sleep=clock.sleep,
                         probe=probe)
    proc.start().wait_healthy()
    stopped = []
    import emulator.engines.child as child_mod  # the process-group shell RouterProcess stops through

    monkeypatch.setattr(child_mod.os, "killpg",
                        lambda pid, sig: (stopped.append(pid), setattr(procs[pid - 5000], "code", 0)))
    healthy |= {"8100", "8101"}
    proc.replace(dataclasses.replace(spec, port=8100, metrics_port=8101, policy="cache_aware"), grace_s=2.0)
    assert proc.base_url == "http://127.0.0.1:8100" and stopped == [5000]  # the old one, after the new is up
    with pytest.raises(EngineError, match="not healthy"):  # a new router that never comes up
        proc.replace(dataclasses.replace(spec, port=8200, metrics_port=8201), timeout=1.0)
    assert proc.base_url == "http://127.0.0.1:8100" and procs[1].code is None  # the running one stays


def test_what_the_cpu_engines_cannot_express_is_refused_before_anything_restarts() -> None:
    clock, router, engines = _world()
    act = ProcessActuator(router, engines, clock=clock)
    for bad in (DEFAULT_KNOBS.replace(chunk_tokens=512), DEFAULT_KNOBS.replace(cpu_gib=2.0),
                DEFAULT_KNOBS.replace(router="prefixaware", l2_eviction="s3fifo")):
        with pytest.raises(RefusedConfigError, match="cannot express"):
            act.apply(bad)
    with pytest.raises(RefusedConfigError, match="no such policy"):
        act.apply(DEFAULT_KNOBS.replace(router="session"))
    assert not router.restarted and act.current() == DEFAULT_KNOBS and act.history == []


def test_dry_run_plans_without_restarting_and_rollback_restores_the_last_good() -> None:
    clock, router, engines = _world()
    act = ProcessActuator(router, engines, clock=clock)
    with pytest.raises(PermanentActuationError, match="no last good"):
        act.rollback()
    dry = act.apply(DEFAULT_KNOBS.replace(router="prefixaware"), dry_run=True)
    assert (dry.applied, dry.dry_run, dry.restarted) == (False, True, ("router",)) and not router.restarted
    act.mark_good(DEFAULT_KNOBS)
    act.apply(DEFAULT_KNOBS.replace(router="prefixaware"))
    back = act.rollback()
    assert back.applied and act.current() == DEFAULT_KNOBS
    assert [s.policy for s in router.restarted] == ["cache_aware", "round_robin"]


def test_kv_resize_is_a_rolling_restart_one_engine_at_a_time() -> None:
    clock, router, engines = _world()
    act = ProcessActuator(router, engines, clock=clock, engine_names=["e0", "e1"])
    res = act.resize_engines(3072)
    assert res.restarted == ("e0", "e1") and act.kv_cache_tokens() == [3072, 3072]
    assert [(r.target, r.at) for r in act.restarts] == [("e0", 0.0), ("e1", 28.0)]  # one after the other
    assert not act.resize_engines(3072).applied  # nothing to do
    with pytest.raises(RefusedConfigError, match="must be an integer >="):
        act.resize_engines(1024)
    _clock, router2, broken = _world(fail=True)
    with pytest.raises(PermanentActuationError, match="e0: engine on port 1 exited"):
        ProcessActuator(router2, broken, engine_names=["e0", "e1"]).resize_engines(3072)


def test_router_argv_and_policy_names() -> None:
    spec = RouterSpec(port=8000, metrics_port=8001, workers=("http://127.0.0.1:1", "http://127.0.0.1:2"),
                      policy="cache_aware")
    cmd = router_command(spec, "/bin/vllm-router")
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--worker-urls") + 1: cmd.index("--worker-urls") + 3] == list(spec.workers)
    assert cmd[cmd.index("--prometheus-port") + 1] == "8001" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert router_policy("roundrobin") == "round_robin"
    with pytest.raises(EngineError, match="valid choices"):
        RouterSpec(port=1, metrics_port=2, workers=("x",), policy="prefixaware")
    clock = FakeClock()
    launched = []

    class Popen:
        pid = 4242

        def __init__(self, argv, **kw) -> None:
            launched.append(argv)

        def poll(self):
            return None

    probes = iter([0, 0, 200, 200])
    proc = RouterProcess(spec, Path("/tmp"), binary="/bin/vllm-router", launcher=Popen, clock=clock,
                         sleep=clock.sleep, probe=lambda url, t: next(probes), log=open("/dev/null", "ab"))  # noqa: SIM115
    assert proc.start().wait_healthy() == pytest.approx(0.4) and launched[0][0] == "/bin/vllm-router"


def test_sender_paces_an_open_loop_and_reads_the_cached_tokens() -> None:
    clock = FakeClock()
    bodies = []

    def post(url: str, body: bytes, timeout: float):
        bodies.append((clock.t, json.loads(body)))
        clock.t += 0.01
        usage = {"prompt_tokens": len(json.loads(body)["prompt"]), "prompt_tokens_details": {"cached_tokens": 32}}
        return 200, json.dumps({"usage": usage}).encode()

    sender = StreamSender("http://r/", model="tiny-llama", post=post, clock=clock, sleep=clock.sleep)
    out = sender.send_open_loop([[5] * 40, [6] * 50], [0.5, 1.0], workers=1)
    assert [b["prompt"][:1] for _t, b in bodies] == [[5], [6]] and bodies[0][0] >= 0.5 and bodies[1][0] >= 1.0
    assert [(c.prompt_tokens, c.cached_tokens, c.ok) for c in out] == [(40, 32, True), (50, 32, True)]
    assert out[0].latency_s == pytest.approx(0.01)
    assert parse_usage(503, b"overloaded")[2] == "HTTP 503: overloaded"
    assert dataclasses.asdict(out[0])["index"] == 0


def test_a_surge_rollout_keeps_clients_on_the_old_router_until_the_new_one_answers() -> None:
    clock = FakeClock()
    old_spec = RouterSpec(port=8000, metrics_port=8001, workers=("http://127.0.0.1:1",), policy="round_robin")
    new_spec = dataclasses.replace(old_spec, port=9000, metrics_port=9001, policy="cache_aware")
    seen: list[tuple[str, str]] = []  # (url probed, where clients were sent at that moment)

    state = {"new_healthy": False}
    launched: list[object] = []

    class Popen:
        pid = 4242

        def __init__(self, argv, **kw) -> None:
            launched.append(self)

        def poll(self):  # the old router has exited by the time it is stopped: no signal is sent
            return 0 if self is launched[0] and state["new_healthy"] else None

    proc = RouterProcess(old_spec, Path("/tmp"), binary="/bin/vllm-router", launcher=Popen, clock=clock,
                         sleep=clock.sleep, probe=lambda url, t: 200, log=open("/dev/null", "ab"))  # noqa: SIM115
    proc.start()
    probes = iter([0, 0, 0, 200, 200])

    def probe(url: str, t: float) -> int:
        seen.append((url, proc.base_url))
        code = next(probes)
        state["new_healthy"] = code == 200
        return code

    proc.probe = probe
    proc.replace(new_spec, grace_s=0.0)
    assert all(url.startswith(("http://127.0.0.1:9000", "http://127.0.0.1:9001")) for url, _ in seen)
    assert {client for _, client in seen} == {"http://127.0.0.1:8000"}  # clients stayed on the old router
    assert proc.base_url == "http://127.0.0.1:9000" and proc.metrics_url == "http://127.0.0.1:9001/metrics"
