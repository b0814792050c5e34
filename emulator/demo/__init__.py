"""`tierpilot demo`: the whole loop on the emulated cluster (`loop.py`), its agent stack, live
console, timeline sampler, accuracy probe, outcome and report, and workload."""
