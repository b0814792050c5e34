"""The child processes of bench/hostile.py, as `python -c` scripts (each attack's peak RSS is its
own process's). argv: the repository root, the servers' port, good pods, the attack, cycles[, budget]."""

CHILD = r"""
import io, json, logging, resource, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
logs = io.StringIO()
logging.basicConfig(stream=logs, level=logging.DEBUG)
port, n_good, attack, cycles = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
SECRET = "AKIAIOSFODNN7EXAMPLE"
base = f"http://127.0.0.1:{port}"
targets = [Target(f"{base}/good/{i}", "vllm", f"vllm-{i}") for i in range(n_good)]
if attack.startswith("credentials"):  # the secret in the userinfo (raw "@" and ":") and the query
    targets.append(Target(f"http://scraper:p@ss:{SECRET}@127.0.0.1:{port}/attack/{json.dumps(attack).encode().hex()}"
                          f"?%74oken={SECRET}", "vllm", "attacker"))
elif attack != "none":
    targets.append(Target(f"{base}/attack/{json.dumps(attack).encode().hex()}", "vllm", "attacker"))
agent = Agent(load_settings(env={}, scrape={"backoff_base_s": 0}), StaticTargets(targets))
times = []
for _ in range(cycles):
    t = time.perf_counter()
    snap = agent.scrape_now()
    times.append(time.perf_counter() - t)
status = {s.target.pod: s for s in snap.targets}
att = status.get("attacker")
good = sorted((t.pod, t.tier, t.lookup_tokens, t.hit_tokens) for t in snap.tiers if t.pod != "attacker")
exported = agent.metrics_text()
from agent.runtime.payloads import snapshot_json
exported += snapshot_json(snap) + logs.getvalue()
print(json.dumps({
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "cycle_ms": statistics.median(times) * 1000,
    "reason": "" if att is None else (att.reason or "up"),
    "good_up": all(status[t.pod].up for t in targets if t.pod != "attacker"),
    "good": good,
    "leaked": "AKIA" in exported,
}))
"""


BUDGET_CHILD = r"""
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from agent.collect.discovery import StaticTargets
from agent.runtime.app import Agent
from agent.settings import load_settings
from contracts.tier_model import Target
port, n_good, attack, cycles, bounded = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1"
base = f"http://127.0.0.1:{port}"
targets = [Target(f"{base}/good/{i}", "vllm", f"vllm-{i}") for i in range(n_good)]
targets.append(Target(f"{base}/attack/{json.dumps(attack).encode().hex()}", "vllm", "attacker"))
scrape = {"backoff_base_s": 0}
if not bounded:
    scrape.update(max_models_per_target=0, max_series_per_target=0)
agent = Agent(load_settings(env={}, scrape=scrape), StaticTargets(targets))
times = []
for _ in range(cycles):
    t = time.perf_counter()
    snap = agent.scrape_now()
    times.append(time.perf_counter() - t)
renders = []
for _ in range(5):
    t = time.perf_counter()
    text = agent.metrics_text()
    renders.append(time.perf_counter() - t)
series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
att = {s.target.pod: s for s in snap.targets}["attacker"]
print(json.dumps({
    "series": series, "attacker_series": sum(1 for line in text.splitlines() if 'pod="attacker"' in line),
    "bytes": len(text.encode()), "render_ms": statistics.median(renders) * 1000,
    "cycle_ms": statistics.median(times) * 1000, "store_rows": agent.store.rows,
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "models": len({p.model for p in snap.pods if p.pod == "attacker"}),
    "warnings": [r for r, _ in att.warnings], "up": att.up,
}))
"""
