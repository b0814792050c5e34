"""Settings, discovery annotations and the `tierpilot kv-events` command."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.kvevents.settings import (
    EndpointSpec,
    KvEventsSettings,
    SettingsError,
    endpoint_from_annotations,
)
from agent.kvevents.signals import EngineId
from emulator.cluster.kv_publisher import KvEventPublisher, stored_event


def test_annotations_give_an_endpoint_with_dp_offsets() -> None:
    spec = endpoint_from_annotations("vllm-0", "10.1.2.3", {
        "tierpilot.io/kv-events-port": "5557", "tierpilot.io/kv-events-replay-port": "5600",
        "tierpilot.io/model": "llama", "tierpilot.io/kv-events-dp-size": "2"})
    assert spec is not None
    assert spec.engines() == [
        (EngineId("vllm-0", "llama", 0), "tcp://10.1.2.3:5557", "tcp://10.1.2.3:5600"),
        (EngineId("vllm-0", "llama", 1), "tcp://10.1.2.3:5558", "tcp://10.1.2.3:5601"),
    ]
    assert endpoint_from_annotations("p", "10.0.0.1", {}) is None
    v6 = endpoint_from_annotations("p", "fd00::1", {"tierpilot.io/kv-events-port": "5557"}, default_model="m")
    assert v6 is not None and v6.endpoint == "tcp://[fd00::1]:5557"


@pytest.mark.parametrize(("annotations", "message"), [
    ({"tierpilot.io/kv-events-port": "5557"}, "tierpilot.io/model is required"),
    ({"tierpilot.io/kv-events-port": "x", "tierpilot.io/model": "m"}, "port in 1..65535"),
    ({"tierpilot.io/kv-events-port": "1", "tierpilot.io/model": "m", "tierpilot.io/kv-events-dp-size": "two"},
     "dp-size must be an integer"),
])
def test_bad_annotations_name_the_problem(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        endpoint_from_annotations("p", "10.0.0.1", annotations)


def test_settings_reject_bind_addresses_and_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bind address"):
        EndpointSpec(pod="p", model="m", endpoint="tcp://*:5557")
    bad = tmp_path / "kv.yaml"
    bad.write_text("kv_events:\n  endpoints: []\n  reorder_hold: 1\n")
    with pytest.raises(SettingsError, match=r"kv.yaml: invalid KV-event settings: kv_events.reorder_hold: Extra inputs[^\n]*$"):
        KvEventsSettings.from_yaml(bad)
    good = tmp_path / "ok.yaml"
    good.write_text("endpoints:\n  - {pod: a, model: m, endpoint: 'tcp://127.0.0.1:5557'}\nlimits: {shadow_l2: 64}\n")
    s = KvEventsSettings.from_yaml(good)
    assert s.endpoints[0].pod == "a" and s.limits.to_limits().shadow_l2 == 64


def test_cli_prints_live_signals_as_json(tmp_path: Path) -> None:
    """A PUB socket drops what no subscriber has asked for yet, and on a loaded machine the CLI may
    connect after the stored batch went out: the engine keeps publishing (empty batches here), so a
    late subscriber sees a sequence number past 0 and replays the engine's buffer on joining
    (`replay_on_join`), and the report holds the batch whenever the CLI joined. The CLI watches for
    4 s: at a load of ~20 on 2 cores its subscriber saw nothing within 1.5 s in one run of six."""
    config = tmp_path / "kv.yaml"
    config.write_text("replay_on_join: true\n")
    with KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", bind=True) as pub:
        stop = threading.Event()

        def feed() -> None:
            time.sleep(0.5)
            pub.publish([stored_event([1, 2], None, 16)], ts=1.0)
            while not stop.wait(0.1):
                pub.publish([], ts=1.0)

        t = threading.Thread(target=feed)
        t.start()
        try:
            result = CliRunner().invoke(main, ["kv-events", "--endpoint", f"a={pub.endpoint}", "--replay",
                                               f"a={pub.replay_endpoint}", "--config", str(config), "--model", "m",
                                               "--interval", "1.0", "--duration", "4.0", "--json"])
        finally:
            stop.set()
            t.join()
    assert result.exit_code == 0, result.output
    reports = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert reports, result.output
    last = reports[-1]
    assert last["engines"][0]["pod"] == "a"
    assert last["engines"][0]["miss_tokens"] == {"cold": 32, "capacity": 0, "routing": 0}, result.output


def test_cli_explains_bad_input() -> None:
    r = CliRunner().invoke(main, ["kv-events"])
    assert r.exit_code != 0 and "no endpoints" in r.output
    r = CliRunner().invoke(main, ["kv-events", "--endpoint", "a=tcp://*:5557"])
    assert r.exit_code != 0 and "bind address" in r.output
    r = CliRunner().invoke(main, ["kv-events", "--endpoint", "nope"])
    assert r.exit_code != 0 and "POD=ADDRESS" in r.output
