"""Real engines run on this machine: the vLLM CPU build serving a tiny local model (engine.py),
built by tiny_model.py. Used by the tests, the benches and `tierpilot demo --engine vllm`."""
