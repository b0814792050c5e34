"""Seeded synthetic workloads: shared system prompts, Zipf RAG documents, multi-turn sessions,
Poisson arrivals, and a schedule of phases with different prefix overlap.

A prompt is a list of content segments; two prompts share a 512-token block exactly when their
contents agree up to the end of that block. Block ids are chained (Mooncake semantics): a block's
id is assigned from (parent block id, the segment pieces inside the block), remapped to small
integers in order of first appearance.

Conversation model (per phase): conversations start as a Poisson process with rate
`rate_rps / mean_turns`. A conversation picks a shared system prompt (with probability
`system_share`), RAG documents (with probability `rag_share`, Zipf popularity over a fixed
corpus), and 1..N turns. Turn t's prompt is turn t-1's prompt plus its output plus a new user
message; turns are separated by exponential think times. Multi-turn conversations get a session
id; single-turn requests have none. Requests arriving after the end of the schedule are dropped.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import polars as pl

from simulator.chunking import BLOCK_TOKENS
from simulator.records import WORKLOAD_SCHEMA, WorkloadError

Segment = tuple[tuple, int]  # (content key, tokens)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of a synthetic schedule. Token ranges are inclusive uniform (lo, hi)."""

    duration_s: float
    rate_rps: float = 4.0
    system_prompts: int = 4  # distinct shared system prompts in this phase's pool
    system_prompt_tokens: tuple[int, int] = (1024, 2048)
    system_share: float = 1.0  # probability a conversation starts with a shared system prompt
    system_pool: int = 0  # phases with the same pool share system prompts
    rag_docs: int = 0  # corpus size (0: no RAG)
    rag_doc_tokens: tuple[int, int] = (1024, 4096)
    rag_zipf_s: float = 1.1
    rag_share: float = 0.0  # probability a conversation retrieves documents
    rag_docs_per_request: int = 1
    rag_corpus: int = 0  # phases with the same corpus id share documents
    turns: tuple[int, int] = (1, 1)
    user_tokens: tuple[int, int] = (50, 400)
    output_tokens: tuple[int, int] = (100, 500)
    think_time_s: float = 20.0
    name: str = ""

    def __post_init__(self) -> None:
        def bad(msg: str) -> WorkloadError:
            return WorkloadError(f"phase {self.name or '?'}: {msg}")

        if not self.duration_s > 0 or not self.rate_rps > 0:
            raise bad(f"duration_s and rate_rps must be > 0, got {self.duration_s!r}, {self.rate_rps!r}")
        for key in ("system_prompt_tokens", "rag_doc_tokens", "turns", "user_tokens", "output_tokens"):
            lo, hi = getattr(self, key)
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
                raise bad(f"{key}: need integers 0 <= lo <= hi, got {(lo, hi)!r}")
        if self.turns[0] < 1:
            raise bad("turns: a conversation has at least one turn")
        for key in ("system_share", "rag_share"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise bad(f"{key}: must be a probability in [0, 1]")
        if self.system_share > 0 and self.system_prompts < 1:
            raise bad("system_prompts: need >= 1 when system_share > 0")
        if self.rag_share > 0 and (self.rag_docs < 1 or self.rag_docs_per_request < 1):
            raise bad("rag_docs and rag_docs_per_request: need >= 1 when rag_share > 0")
        if self.think_time_s < 0 or self.rag_zipf_s <= 0:
            raise bad("think_time_s must be >= 0 and rag_zipf_s > 0")


def _rag_phase(duration_s: float, **kw) -> Phase:
    base = {
        "rate_rps": 4.0, "system_prompts": 4, "system_prompt_tokens": (1024, 2048), "system_share": 1.0, "rag_docs": 400,
        "rag_doc_tokens": (1024, 4096), "rag_zipf_s": 1.1, "rag_share": 0.9, "turns": (1, 1), "user_tokens": (50, 300),
        "output_tokens": (100, 400), "name": "rag",
    }
    base.update(kw)
    return Phase(duration_s, **base)


def _sessions_phase(duration_s: float, **kw) -> Phase:
    base = {
        "rate_rps": 4.0, "system_prompts": 1, "system_prompt_tokens": (300, 300), "system_share": 1.0, "system_pool": 1,
        "rag_docs": 0, "rag_share": 0.0, "turns": (3, 12), "user_tokens": (100, 600), "output_tokens": (150, 600),
        "think_time_s": 30.0, "name": "sessions",
    }
    base.update(kw)
    return Phase(duration_s, **base)


PRESET_PHASES: dict[str, tuple[Phase, ...]] = {
    "rag": (_rag_phase(600.0),),
    "sessions": (_sessions_phase(600.0),),
    "shift": (_rag_phase(300.0), _sessions_phase(300.0)),
    "short": (
        Phase(600.0, rate_rps=8.0, system_prompts=8, system_prompt_tokens=(256, 768), system_pool=2,
              user_tokens=(50, 250), output_tokens=(50, 200), name="short"),
    ),
}

PRESETS: dict[str, str] = {
    "rag": "shared system prompts (4 x 1-2k tokens) + Zipf(1.1) RAG over 400 docs of 1-4k tokens, single turn",
    "sessions": "many distinct multi-turn chats (3-12 turns, each prompt extends the last), tiny shared prefix",
    "shift": "two phases: 'rag' (heavy shared prefixes) for the first half, then 'sessions' (distinct chats)",
    "short": "short prompts (300-1,000 tokens) over 8 shared system prompts: where L2 does not pay off",
}
DEFAULT_PRESET = "shift"


class _BlockIds:
    """Chained block ids: (parent id, pieces inside the block) -> small integer."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def hash_prompt(self, segments: Sequence[Segment]) -> list[int]:
        out: list[int] = []
        parent = -1
        pieces: list[tuple] = []
        room = BLOCK_TOKENS
        for key, length in segments:
            off = 0
            while off < length:
                take = min(room, length - off)
                pieces.append((key, off, off + take))
                off += take
                room -= take
                if room == 0:
                    parent = self._ids.setdefault((parent, tuple(pieces)), len(self._ids))
                    out.append(parent)
                    pieces, room = [], BLOCK_TOKENS
        if pieces:
            out.append(self._ids.setdefault((parent, tuple(pieces)), len(self._ids)))
        return out


def _uniform(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def generate(phases: Sequence[Phase], *, seed: int) -> pl.DataFrame:
    """Generate a workload frame from an explicit schedule of phases (deterministic per seed)."""
    if not phases:
        raise WorkloadError("synthetic workload: need at least one phase")
    rng = np.random.default_rng(seed)
    blocks = _BlockIds()
    end_s = sum(p.duration_s for p in phases)
    rows: list[tuple[float, int, int, int, list[int], int | None, int]] = []
    conv_id = 0
    session_id = 0
    t0 = 0.0
    for phase_idx, ph in enumerate(phases):
        # Per-corpus fixed lengths so the same prompt/document always has the same content.
        sys_len = [_uniform(rng, ph.system_prompt_tokens) for _ in range(ph.system_prompts)]
        doc_len = [_uniform(rng, ph.rag_doc_tokens) for _ in range(ph.rag_docs)]
        doc_p = None
        if ph.rag_docs:
            w = 1.0 / np.arange(1, ph.rag_docs + 1, dtype=float) ** ph.rag_zipf_s
            doc_p = w / w.sum()
        conv_rate = ph.rate_rps / ((ph.turns[0] + ph.turns[1]) / 2.0)
        t = t0 + rng.exponential(1.0 / conv_rate)
        while t < t0 + ph.duration_s:
            conv_id += 1
            prefix: list[Segment] = []
            if ph.system_share > 0 and rng.random() < ph.system_share:
                i = int(rng.integers(ph.system_prompts))
                prefix.append((("sys", ph.system_pool, i, sys_len[i]), sys_len[i]))
            if doc_p is not None and rng.random() < ph.rag_share:
                for d in rng.choice(ph.rag_docs, size=ph.rag_docs_per_request, p=doc_p):
                    prefix.append((("doc", ph.rag_corpus, int(d), doc_len[d]), doc_len[d]))
            n_turns = _uniform(rng, ph.turns)
            sid = None
            if n_turns > 1:
                session_id += 1
                sid = session_id
            arrival = t
            for turn in range(n_turns):
                if turn:
                    arrival += rng.exponential(ph.think_time_s) if ph.think_time_s > 0 else 0.0
                user = _uniform(rng, ph.user_tokens)
                out = _uniform(rng, ph.output_tokens)
                if arrival >= end_s:
                    break
                prompt = prefix + [(("user", conv_id, turn), user)]
                rows.append((arrival, len(rows), sum(s[1] for s in prompt), out, blocks.hash_prompt(prompt),
                             sid, phase_idx))
                prefix = prompt + [(("out", conv_id, turn), out)]
            t += rng.exponential(1.0 / conv_rate)
        t0 += ph.duration_s
    if not rows:
        raise WorkloadError("synthetic workload: the schedule produced no requests (duration or rate too small)")
    rows.sort(key=lambda r: (r[0], r[1]))
    return pl.DataFrame(
        {
            "timestamp_ms": [int(r[0] * 1000.0) for r in rows],
            "input_length": [r[2] for r in rows],
            "output_length": [r[3] for r in rows],
            "hash_ids": [r[4] for r in rows],
            "session_id": [r[5] for r in rows],
            "phase": [r[6] for r in rows],
        },
        schema=WORKLOAD_SCHEMA,
    )


def preset_phases(preset: str, *, duration_s: float | None = None, rate_rps: float | None = None) -> tuple[Phase, ...]:
    """The phases of a preset, scaled to `duration_s` (keeping proportions) and/or `rate_rps`."""
    if preset not in PRESET_PHASES:
        raise WorkloadError(f"workload: unknown preset {preset!r}; valid choices: {', '.join(PRESETS)}")
    phases = PRESET_PHASES[preset]
    if duration_s is not None:
        if not duration_s > 0:
            raise WorkloadError(f"duration_s: must be > 0, got {duration_s!r}")
        scale = duration_s / sum(p.duration_s for p in phases)
        phases = tuple(dataclasses.replace(p, duration_s=p.duration_s * scale) for p in phases)
    if rate_rps is not None:
        if not rate_rps > 0:
            raise WorkloadError(f"rate_rps: must be > 0, got {rate_rps!r}")
        phases = tuple(dataclasses.replace(p, rate_rps=rate_rps) for p in phases)
    return phases


def synthetic(preset: str, *, seed: int, duration_s: float | None = None, rate_rps: float | None = None) -> pl.DataFrame:
    """A built-in synthetic workload (see `PRESETS`), deterministic for a given seed."""
    return generate(preset_phases(preset, duration_s=duration_s, rate_rps=rate_rps), seed=seed)
