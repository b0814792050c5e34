"""`tierpilot demo`: the whole loop on the emulated cluster (`loop.py`), its agent stack, live
console, accuracy probe, report and workload."""
