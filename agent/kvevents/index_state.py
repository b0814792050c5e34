"""State of the fleet block index (agent/kvevents/index.py): tier bits, memory limits, the
two-generation maps that bound residency and removal history, and each engine's counters."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

CAUSES = ("cold", "capacity", "routing")
GPU = 1
CPU = 2
STORAGE = 4
_TIER_BITS = {"GPU": 1, "CPU": 2, "STORAGE": 4}
_OTHER_TIER = 8
PROMOTED = 16  # residency flag, not a tier: the CPU copy was read from the shared L2
TIER_NAMES = {1: "GPU", 2: "CPU", 4: "STORAGE", 8: "OTHER"}
# Reuse distance histogram bounds (seconds): 10 ms .. 1 day.
REUSE_BUCKETS: tuple[float, ...] = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
                                     14400.0, 86400.0)


DISTANCE_BUCKETS = 4 * 65 + 1  # 4 per octave of the store distance, plus "never / aged out"
FAR = DISTANCE_BUCKETS - 1


def distance_bucket(d: int) -> int:
    """Log-scale bucket (4 per power of two) of a store distance; monotone in d."""
    if d < 4:
        return d
    b = d.bit_length()
    return 4 * b + ((d >> (b - 3)) & 3) - 8


def tier_bit(medium: str) -> int:
    return _TIER_BITS.get(medium, _OTHER_TIER)


@dataclasses.dataclass(frozen=True)
class IndexLimits:
    """Memory bounds of the index (defaults use about 0.3 GB at most with 8 engines)."""

    resident_per_engine: int = 262_144  # block hashes per engine, all tiers together
    history_per_engine: int = 262_144  # removed hashes remembered per engine (capacity, reuse)
    seen_capacity: int = 8_000_000  # hashes per Bloom generation
    seen_generations: int = 2
    seen_fp_rate: float = 0.001
    shadow_l2: int = 1_048_576  # hashes whose last fleet-wide store order is kept (L2 inference)
    storage_blocks: int = 1_048_576  # hashes kept as resident in the shared L2 ("STORAGE" stores)

    def __post_init__(self) -> None:
        for name in ("resident_per_engine", "history_per_engine", "seen_capacity", "seen_generations",
                     "shadow_l2", "storage_blocks"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")


class TwoGenMap:
    """dict-like map bounded to `cap` entries with approximate LRU ageing (writes refresh)."""

    __slots__ = ("half", "old", "young")

    def __init__(self, cap: int) -> None:
        self.young: dict[int, object] = {}
        self.old: dict[int, object] = {}
        self.half = max(1, cap // 2)

    def get(self, key: int) -> object | None:
        v = self.young.get(key)
        return self.old.get(key) if v is None else v

    def put(self, key: int, value: object) -> dict[int, object] | None:
        """Set key; returns the generation dropped by ageing, if any."""
        self.old.pop(key, None)
        self.young[key] = value
        if len(self.young) >= self.half:
            dropped, self.old, self.young = self.old, self.young, {}
            return dropped
        return None

    def pop(self, key: int) -> object | None:
        v = self.young.pop(key, None)
        return self.old.pop(key, None) if v is None else v

    def items(self) -> Iterator[tuple[int, object]]:
        yield from self.old.items()
        yield from self.young.items()

    def __iter__(self) -> Iterator[int]:
        yield from self.old
        yield from self.young

    def clear(self) -> None:
        self.young, self.old = {}, {}

    def __len__(self) -> int:
        return len(self.young) + len(self.old)


@dataclasses.dataclass
class EngineStats:
    """Counters of one engine (monotonic, except `resident` which is a gauge per tier)."""

    miss_blocks: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    miss_tokens: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    external_hit_blocks: int = 0
    external_hit_tokens: int = 0
    l2_hit_blocks: int = 0  # GPU stores of blocks read from the shared L2 (part of the external hits)
    l2_hit_tokens: int = 0
    rereported_blocks: int = 0
    stored_blocks: dict[str, int] = dataclasses.field(default_factory=dict)  # by medium
    removed_blocks: dict[str, int] = dataclasses.field(default_factory=dict)
    unknown_removed_blocks: int = 0
    other_group_events: int = 0
    clears: int = 0
    aged_out: int = 0
    resident: dict[int, int] = dataclasses.field(default_factory=dict)  # tier bit -> blocks
    reuse_counts: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # medium -> buckets+inf
    reuse_sum: dict[str, float] = dataclasses.field(default_factory=dict)
    block_size: int = 0
    # miss tokens by store distance (DISTANCE_BUCKETS), for "capacity" and "routing"
    miss_distance: dict[str, list[int]] = dataclasses.field(default_factory=lambda: {
        "capacity": [0] * DISTANCE_BUCKETS, "routing": [0] * DISTANCE_BUCKETS})


class EngineState:
    __slots__ = ("bit", "history", "name", "resident", "stats")

    def __init__(self, position: int, name: str, limits: IndexLimits) -> None:
        self.bit = 1 << position
        self.name = name
        self.resident = TwoGenMap(limits.resident_per_engine)  # hash -> tier mask
        self.history = TwoGenMap(limits.history_per_engine)  # hash -> (tier bit, removal ts)
        self.stats = EngineStats()


def bump(d: dict, key: object, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n
