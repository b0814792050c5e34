"""The emulated world: what stands in for the GPU fleet a user runs, so the real agent can be
exercised end to end on one machine.

- `cluster/`: emulated vLLM / LMCache / Curvine pods on 127.0.0.1 serving the real exposition
  format, driven by the digital twin, with a vLLM KV-event publisher and a local actuator;
- `demo/`: `tierpilot demo`, the whole loop (agent, KV events, drift, tuner) on that cluster.

It sits above the twin (`simulator/`) and beside the agent's runtime: the demo imports the agent,
never the other way round.
"""
