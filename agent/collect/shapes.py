"""Parse and normalise together, for a payload whose lines are those of a payload read before but
for its values: a target's every scrape after its first (and the pods of one deployment, whose
pages list the same series). Pure apart from the bounded cache; no I/O.

A payload's *shape* is its lines with each line's last space-separated token cut off (for a
sample `series value`, the series). The first payload of a shape goes the full way (parse.py,
then normalise.py) and, the second time the shape is seen, is remembered: which lines are
samples, the wanted series among them in `Payload.by_name` order (repeats dropped as the parser
drops them), and the normaliser's routes and signal templates for them (routes.py). A payload of
a known shape is then read with a few C-level operations over all its lines: its comment and
blank lines must equal the shape's, and its values pass the parser's bulk value check
(`parse.bulk_values`); its signals come from the templates (values judged as normalise.py does
when any is not clean). Anything else, and the OpenMetrics format, goes the full way, which names
the first bad line: the grammar and the limits apply to every line exactly as without the cache.

The cache is shared by a cycle's targets and bounded (SHAPE_CHARS characters of lines, least
recently used shape out first).
"""
from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat

from agent.collect.mapping import MappingSet
from agent.collect.normalise import Normalised, normalise, normalise_routes
from agent.collect.parse import Limits, Payload, bulk_values, parse, plain_series
from agent.collect.routes import Clean, assemble, route, values_of
from contracts.tier_model import Sample, Target

SHAPE_CHARS = 24 << 20  # characters of remembered lines (about 40 MB with their objects)
SIGHTINGS = 4096  # shapes seen once, remembered by hash until seen again


@dataclass(frozen=True, slots=True)
class Read:
    """One payload parsed and normalised. `payload` is the parsed payload when it went the full
    way, None when it was read by its shape."""

    result: Normalised
    lines: int  # sample lines (wanted or not)
    duplicates: int  # wanted samples dropped as repeats of a series
    payload: Payload | None


def _getter(idx: Sequence[int]) -> Callable[[Sequence], tuple]:
    if not idx:
        return lambda _: ()
    if len(idx) == 1:
        return lambda seq, i=idx[0]: (seq[i],)
    return operator.itemgetter(*idx)


class Shape:
    """What one shape's payloads hold, values aside."""

    __slots__ = ("chars", "clean", "duplicates", "kept", "lines", "other_lines", "others", "routes",
                 "samples", "templates")

    def __init__(self, lines: list[str], heads: Sequence[str], wanted: frozenset[str], role: str,
                 mappings: MappingSet, limits: Limits) -> None:
        """Raises ValueError when the payload is not one `series value` line per sample (a
        timestamp, an unusual spacing): such a shape is read the full way."""
        sample_at: list[int] = []
        other_at: list[int] = []
        for i, line in enumerate(lines):
            first = line[:1]
            if first in ("", "#") or (first in " \t" and line.lstrip(" \t")[:1] in ("#", "")):
                other_at.append(i)  # blank or comment, as the parser's line loop tells them
            else:
                sample_at.append(i)
        infos = [plain_series(heads[i], limits) for i in sample_at]
        if None in infos:
            raise ValueError("not a `series value` line per sample")
        by_name: dict[str, list[int]] = {}  # wanted name -> positions among the samples
        seen: dict[str, set[frozenset]] = {}
        self.duplicates = 0
        for k, info in enumerate(infos):
            if info is None or info.name not in wanted:
                continue
            ident = frozenset(info.labels.items())
            known = seen.setdefault(info.name, set())
            if ident in known:
                self.duplicates += 1  # the parser keeps a series' first sample
                continue
            known.add(ident)
            by_name.setdefault(info.name, []).append(k)
        kept = [k for positions in by_name.values() for k in positions]
        samples = {name: [Sample(name, infos[k].labels, 0.0) for k in positions]  # type: ignore[union-attr]
                   for name, positions in by_name.items()}
        self.routes = route(samples, role, mappings)
        self.templates = assemble(self.routes)
        self.clean = Clean(self.routes)
        self.lines = len(sample_at)
        self.others, self.other_lines = _getter(other_at), tuple(lines[i] for i in other_at)
        self.samples, self.kept = _getter(sample_at), _getter(kept)
        self.chars = sum(map(len, lines))

    def read(self, lines: list[str], tails: Sequence[str], pod: str) -> Read | None:
        """The payload's signals, or None when it is not of this shape after all (a comment line
        differs, or a value needs the line loop)."""
        if self.others(lines) != self.other_lines:
            return None
        values = bulk_values(self.samples(tails))
        if values is None:
            return None
        kept = self.kept(values)
        if self.clean.holds(kept):
            result = Normalised(values_of(self.templates, kept, pod))
        else:
            result = normalise_routes(self.routes, kept, pod)
        return Read(result, self.lines, self.duplicates, None)


class Shapes:
    """The shapes seen by one cycle (one mapping set, one set of limits)."""

    def __init__(self, mappings: MappingSet, limits: Limits, max_chars: int = SHAPE_CHARS) -> None:
        self.mappings = mappings
        self.limits = limits
        self.max_chars = max_chars
        self._shapes: OrderedDict[tuple[str, tuple[str, ...]], Shape] = OrderedDict()
        self._chars = 0
        self._sightings: set[int] = set()
        self._lock = threading.Lock()  # big payloads are read in worker threads

    def read(self, text: str, target: Target) -> Read:
        """Parse and normalise a classic-format payload of a target whose role is known; raises
        ParseError (or LimitExceeded) as parse() does."""
        lines = text.split("\n")
        heads, _, tails = zip(*map(str.rpartition, lines, repeat(" ")), strict=True)
        key = (target.role, heads)
        shape = self._shapes.get(key)
        if shape is not None:
            got = shape.read(lines, tails, target.pod)
            if got is not None:
                with self._lock:
                    if key in self._shapes:
                        self._shapes.move_to_end(key)
                return got
        wanted = self.mappings.wanted.get(target.role, frozenset())
        payload = parse(text, wanted, self.limits, openmetrics=False)
        result = normalise(target, payload, self.mappings)
        if shape is None:
            self._learn(key, lines, wanted)
        return Read(result, payload.lines, payload.duplicates, payload)

    def _learn(self, key: tuple[str, tuple[str, ...]], lines: list[str], wanted: frozenset[str]) -> None:
        """Remember a valid payload's shape the second time it is seen (never with no room)."""
        if self.max_chars <= 0:
            return
        sighting = hash(key)
        with self._lock:
            if sighting not in self._sightings:
                if len(self._sightings) >= SIGHTINGS:
                    self._sightings.clear()
                self._sightings.add(sighting)
                return
            self._sightings.discard(sighting)
        try:
            shape = Shape(lines, key[1], wanted, key[0], self.mappings, self.limits)
        except ValueError:
            return
        if shape.chars > self.max_chars:
            return
        with self._lock:
            if key in self._shapes:
                return
            while self._shapes and self._chars + shape.chars > self.max_chars:
                _, old = self._shapes.popitem(last=False)
                self._chars -= old.chars
            self._shapes[key] = shape
            self._chars += shape.chars

    def __len__(self) -> int:
        return len(self._shapes)
