"""Benchmark: the agent's exposition parser against a real Prometheus 2.42 on the conformance suite
(tests/support/exposition_cases.py: classic text and OpenMetrics payloads written from the specs
and from Prometheus' lexers), then its speed against prometheus_client's parser on the same
payloads.

One loopback server serves every case with its format's Content-Type, one Prometheus scrapes them
all (1 s interval) and each target's health is Prometheus' verdict. Prints how many payloads each
side refuses and every disagreement (target: none, bar the documented stricter corners), and the
parser's CPU time on the suite's accepted payloads and on realistic vLLM payloads (bench/scrape.py)
against prometheus_client in the same run (median of 5).
Run: .venv/bin/python bench/exposition_conformance.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
    from prometheus_client.parser import text_string_to_metric_families

    from agent.collect.parse import ParseError, parse
    from bench.scrape import render_payload
    from tests.support.conformance import prometheus_verdicts
    from tests.support.exposition_cases import CASES, OM, STRICTER

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tierpilot-conformance-") as tmp:
        verdicts = prometheus_verdicts(CASES, Path(tmp))
    print(f"Prometheus 2.42 scraped {len(CASES)} payloads in {time.perf_counter() - t0:.1f}s: "
          f"{sum(not v.accepted for v in verdicts.values())} refused, {sum(v.accepted for v in verdicts.values())} read")
    ours: dict[str, str] = {}
    for case in CASES:
        try:
            parse(case.body, openmetrics=case.fmt == OM)
            ours[case.id] = ""
        except ParseError as exc:
            ours[case.id] = str(exc)
    laxer = [c.id for c in CASES if not verdicts[c.id].accepted and not ours[c.id]]
    stricter = [c.id for c in CASES if verdicts[c.id].accepted and ours[c.id]]
    print(f"agent: refuses {sum(bool(v) for v in ours.values())}; accepts {len(laxer)} that Prometheus refuses "
          f"(target 0) -> {'OK' if not laxer else 'MISSED'}; refuses {len(stricter)} that Prometheus reads "
          f"({len(set(stricter) - set(STRICTER))} not documented as deliberate)")
    for cid in laxer + [c for c in stricter if c not in STRICTER]:
        print(f"  differs: {cid}: Prometheus {verdicts[cid].error or 'ok'!r}, agent {ours[cid] or 'ok'!r}")

    good = [c for c in CASES if verdicts[c.id].accepted and not ours[c.id]]

    def reference_suite() -> None:
        for c in good:
            try:
                list(om_families(c.body) if c.fmt == OM else text_string_to_metric_families(c.body))
            except ValueError:
                pass  # prometheus_client refuses a few that Prometheus reads

    t_ours = _cpu(lambda: [parse(c.body, openmetrics=c.fmt == OM) for c in good])
    t_ref = _cpu(reference_suite)
    print(f"suite ({len(good)} accepted payloads): agent {t_ours * 1e3:.2f} ms, prometheus_client "
          f"{t_ref * 1e3:.2f} ms, ratio {t_ref / t_ours:.1f}x")
    payloads = [render_payload(i) for i in range(20)]
    t_ours = _cpu(lambda: [parse(p) for p in payloads])
    t_ref = _cpu(lambda: [list(text_string_to_metric_families(p)) for p in payloads], 3)
    kib = statistics.mean(len(p) for p in payloads) / 1024
    print(f"vLLM payloads ({len(payloads)} x {kib:.0f} KiB, every line kept): agent {t_ours / len(payloads) * 1e3:.2f} ms "
          f"each, prometheus_client {t_ref / len(payloads) * 1e3:.2f} ms, ratio {t_ref / t_ours:.1f}x")


if __name__ == "__main__":
    main()
