"""vllm-project/router for real: the Rust binary from the `vllm-router` 0.1.17 wheel, started in
front of emulated vLLM pods on 127.0.0.1, routing real HTTP requests; the agent scrapes its real
/metrics (role detected from the payload). Also: the actuator's spellings of its policies and
flags are the ones the binary accepts."""
from __future__ import annotations

import json
import re
import subprocess
import urllib.request

import pytest

from agent.collect.discovery import StaticTargets
from agent.k8s.mapping import load_mappings
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import AUTO_ROLE, Target
from tests.support.real_engine import ROUTER_BINARY, Router
from tests.support.vllm_api import VllmApiPod

pytestmark = pytest.mark.skipif(
    ROUTER_BINARY is None, reason="vllm-router is not installed (pip install vllm-router==0.1.17, a dev dependency)")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _complete(base: str, prompt: str) -> dict:
    req = urllib.request.Request(f"{base}/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_the_real_router_routes_round_robin_and_its_metrics_are_mapped():
    with VllmApiPod(MODEL) as a, VllmApiPod(MODEL) as b, Router([a.url, b.url], "round_robin") as router:
        for i in range(6):
            reply = _complete(router.url, f"request number {i} about the tiers")
            assert reply["choices"][0]["text"] == " ok"
        assert (a.completions, b.completions) == (3, 3)  # round_robin over two workers
        status, body = _get(router.metrics_url)
        assert status == 200 and b"vllm_router_requests_total" in body
        agent = Agent(load_settings(None, env={}), StaticTargets([Target(router.metrics_url, AUTO_ROLE, "router-0")]))
        snap = agent.scrape_now()
        (st,) = snap.targets
        assert (st.up, st.target.role, st.warnings) == (True, "router", ())
        values, _sources = agent.store.values(pod="router-0")
        assert values["router_requests"] == 6
        assert values["router_latency_seconds:count"] == 6


def test_kv_aware_starts_with_its_own_knobs():
    with VllmApiPod(MODEL) as a, Router([a.url], "kv_aware", "--router-temperature", "0.5",
                                        "--kv-penalty-host", "0.9", "--kv-penalty-external", "0.4") as router:
        assert _complete(router.url, "hello tiers")["usage"]["completion_tokens"] == 1
        assert a.completions == 1


def test_the_actuator_spells_policies_and_flags_as_the_binary_accepts():
    out = subprocess.run([ROUTER_BINARY, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    choices = set(re.search(r"--policy \{([a-z_,]+)\}", out).group(1).split(","))
    kind = load_mappings()["vllm-router-args"]
    policy = kind.setting("router")
    assert set(policy.values.values()) <= choices
    assert choices - set(policy.values.values()) == {"sticky_least_loaded"}  # PD decode only
    for s in kind.settings:
        assert f"\n  {s.key} " in out, s.key
    # the defaults the mapping assumes for absent flags are the binary's
    policy_help = " ".join(out.split("\n  --policy ", 1)[1].split("\n  --", 1)[0].split())
    assert "(default: cache_aware)" in policy_help and policy.default == "cache_aware"
    for flag, default in (("--router-temperature", "0.0"), ("--kv-penalty-host", "0.8"),
                          ("--kv-penalty-external", "0.6")):
        help_text = out.split(f"\n  {flag} ", 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default})" in " ".join(help_text.split()), flag
        assert kind.setting({"--router-temperature": "router_temperature", "--kv-penalty-host": "kv_penalty_host",
                             "--kv-penalty-external": "kv_penalty_external"}[flag]).default == float(default)
