"""The contracts every layer shares, importing none of them: the bottom of the dependency graph.

- `knobs`: `Knobs`, the one configuration type, and its validation;
- `actuator`: the `Actuator` protocol and its errors, the only way a change leaves the tuner;
- `events`: the KV block events the twin emits and the emulated pods publish;
- `tier_model`: the agent's records, from a scrape target to the `Snapshot` the exporters read.

The layering, top to bottom, is written once in `.importlinter` and checked by `make lint` and
by `tests/test_layers.py`.
"""
