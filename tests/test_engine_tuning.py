"""The real-engine demo's agent wiring (no engine): the objects the demo writes into the Kubernetes API
and the `tierpilot run` configuration it renders make the production runtime tune the engines' tier
knobs (restart-requiring) through its Kubernetes actuator, with restarts allowed and the router left
to the deployment."""
from __future__ import annotations

import logging
from pathlib import Path

import yaml

from agent.runtime.assembly import build_runtime
from agent.settings import load_settings
from emulator.demo.engine_cluster import (
    FleetDesign,
    FleetPorts,
    agent_config,
    curvine_objects,
    engine_deployment,
    router_deployment,
    targets_file,
)
from emulator.demo.engine_pass import knobs_from_deployment, tuning_steps
from emulator.demo.engine_tuning import ENGINE_KNOBS, engine_settings, engine_settings_data
from tests.support.kube import NS, serve


def _design(tmp_path: Path) -> FleetDesign:
    ports = FleetPorts(engines=((18000, 18001, 18002), (18010, 18011, 18012)), router=18100, router_metrics=18101,
                       curvine=18102)
    return FleetDesign(name="tuned", engines=2, model=tmp_path / "model", kv_cache_tokens=6144, dtype="float32",
                       knobs=ENGINE_KNOBS, l2_dir=tmp_path / "l2", l2_quota_mib=64, ports=ports)


def test_the_demo_agent_tunes_the_engines_tier_knobs_through_kubernetes(shared_dir, tmp_path, caplog) -> None:
    d = _design(tmp_path)
    server = next(gen := serve(shared_dir))
    try:
        for obj in [*curvine_objects(d), engine_deployment(d, 0), engine_deployment(d, 1),
                    router_deployment(d, ["http://127.0.0.10:18000", "http://127.0.0.11:18010"])]:
            server.put(obj)
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", NS)
        targets = tmp_path / "targets.yaml"
        targets.write_text(yaml.safe_dump(targets_file(d)))
        cfg = agent_config(d, engine_settings_data(), kubeconfig=kubeconfig, targets=targets, port=0, tuning=True,
                           seed=7, storage=f"sqlite:///{tmp_path / 'study.db'}")
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        settings = load_settings(path, env={})
        assert settings.tuner.apply == "all" and settings.kv_events.enabled  # restarts allowed, stated in the file
        with caplog.at_level(logging.INFO, logger="tierpilot.runtime"):
            rt = build_runtime(settings, env={})
        knobs_line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("tuning engine-demo"))
        knobs = knobs_line.split("knobs ", 1)[1].split(";", 1)[0].split(", ")
        assert "cpu_gib" in knobs and "router" not in knobs, knobs_line  # the tier knobs; the router is the deployment's
        ctl = rt.tuning.make_controller().settings  # planner off: a live search whose twin search runs after the
        assert ctl.live_search and ctl.plan_after_baseline  # baseline window, on the workload seen by then
        running = rt.actuator.current()
        assert running.cpu_gib == ENGINE_KNOBS.cpu_gib  # read from --kv-transfer-config in the API
        live = server.get("Deployment", NS, "vllm-tuned-0")
        assert knobs_from_deployment(live, ENGINE_KNOBS) == ENGINE_KNOBS
        rt.actuator.apply(running.replace(cpu_gib=0.125))  # the kmock API rolls out at once (no kubelet here)
        after = knobs_from_deployment(server.get("Deployment", NS, "vllm-tuned-1"), ENGINE_KNOBS)
        assert after.cpu_gib == 0.125 and after.chunk_tokens == ENGINE_KNOBS.chunk_tokens
    finally:
        next(gen, None)
    assert engine_settings(2, 7).tuner.limits.pods == 2


def test_tuning_steps_are_read_from_the_agents_log() -> None:
    lines = [("2026-12-07 06:40:01,250 INFO tierpilot.runtime.tuning_loop: tuning step: phase=0 state=trial_started "
             "trial=1 cpu_gib 0.0156 -> 0.25"),
             "2026-12-07 06:40:03,000 DEBUG tierpilot.runtime.tuning_loop: tuning step: phase=0 state=measuring trial=1 ",
             "2026-12-07 06:40:09,000 INFO tierpilot.runtime.tuning_loop: tuning step: phase=0 state=rolled_back trial=1 worse"]
    lines.insert(0, '2026-12-07 06:40:00,000 INFO tierpilot.tuner: {"event": "warm_start", "trials": 6, "candidates": '
                    '[{"chunk_tokens": 64, "cpu_gib": 0.1875, "cpu_eviction": "lru"}]}')
    steps = tuning_steps(lines)
    assert [m for _t, m in steps] == ["twin search (6 trials): best CPU tier 192 MiB, chunk 64 tokens, lru",
                                      "tuner: trial_started (trial 1): cpu_gib 0.0156 -> 0.25",
                                      "tuner: rolled_back (trial 1): worse"]
    assert steps[2][0] - steps[1][0] == 7.75
