"""Checks of a workload rebuilt from a real engine's KV events against the prompts a test sent."""
from __future__ import annotations

import random
import time
from collections.abc import Sequence

from agent.kvevents.rebuild import BlockRecorder, PodRequests, RebuiltHistory
from agent.kvevents.settings import RebuildSpec
from tests.support.real_engine import EngineCounters, complete, token_prompt


def shared_prefix_prompts(seed: int, prefixes: int, prefix_tokens: int, suffix_tokens: int, n: int,
                          repeats: int) -> list[list[int]]:
    """`n` prompts over `prefixes` shared prefixes with unique suffixes, then `repeats` exact
    repeats of the latest prompts (fully cached: they store nothing)."""
    rng = random.Random(seed)
    heads = [[rng.randrange(4, 4096) for _ in range(prefix_tokens)] for _ in range(prefixes)]
    prompts = [token_prompt(rng.choice(heads), (rng.randrange(4, 4096) for _ in range(suffix_tokens)))
               for _ in range(n)]
    return prompts + prompts[-repeats:] if repeats else prompts


def send(base_url: str, prompts: Sequence[list[int]]) -> tuple[float, float]:
    """Send the prompts one after the other; the wall-clock span they were sent in."""
    start = time.time()
    for p in prompts:
        assert complete(base_url, p)["usage"]["prompt_tokens"] == len(p)
    return start, time.time()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_rebuilt(recorder: BlockRecorder, model: str, pod: str, prompts: Sequence[list[int]], stored: int,
                  span: tuple[float, float], before: EngineCounters, after: EngineCounters) -> None:
    """The rebuilt window equals what was sent: the first `stored` prompts are rebuilt requests in
    send order, each chain one hash per whole block of its prompt, two chains sharing exactly the
    blocks their prompts share; with the engine's counters, every prompt is counted."""
    spec = RebuildSpec()
    counts = {pod: PodRequests(after.requests - before.requests, after.prompt_tokens - before.prompt_tokens,
                               after.prefix_hits - before.prefix_hits)}
    history = RebuiltHistory.from_settings(recorder, lambda since, until: counts, lambda: span[1], spec,
                                           model=model)
    w = history.window(span[1] + 1.0, span[1] + 1.0 - span[0] + 0.001)
    r = w.requests
    assert w.stored == stored, (w.stored, stored)
    assert r.requests == len(prompts)  # the fully cached ones from the counters
    real = [i for i in range(r.requests) if r.own[i] > 0]  # arrival order
    block = int(r.block_size[real[0]])
    chains = [[int(h) for h in r.chain(i)] for i in real]
    sent = prompts[:stored]
    for prompt, chain in zip(sent, chains, strict=True):
        assert len(chain) == len(prompt) // block
    for i in range(len(chains)):
        for j in range(i):
            want = common_prefix(sent[i], sent[j]) // block
            assert common_prefix(chains[i], chains[j]) == want, (i, j)
