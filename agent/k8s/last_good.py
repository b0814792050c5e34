"""The last-good record: what the `tierpilot.io/last-good` annotation holds on one target, the
configuration a rollback returns to."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from agent.k8s.patches import LAST_GOOD_ANNOTATION
from contracts.actuator import PermanentActuationError
from contracts.knobs import Knobs

LAST_GOOD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LastGood:
    """What `tierpilot.io/last-good` holds on one target: the knobs and the exact tokens that
    expressed them there (plus the restart workloads' config-hash annotations)."""

    knobs: Knobs
    tokens: Mapping[str, str | None]
    restart: Mapping[str, str | None]
    marked_at: str
    by: str

    def to_json(self) -> str:
        return json.dumps({"v": LAST_GOOD_VERSION, "knobs": self.knobs.to_dict(), "tokens": dict(self.tokens),
                           "restart": dict(self.restart), "markedAt": self.marked_at, "by": self.by},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, *, where: str) -> LastGood:
        try:
            data = json.loads(text)
            return cls(knobs=Knobs.from_mapping(data["knobs"], source=f"{where} {LAST_GOOD_ANNOTATION}"),
                       tokens=dict(data["tokens"]), restart=dict(data.get("restart") or {}),
                       marked_at=str(data.get("markedAt", "")), by=str(data.get("by", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentActuationError(f"{where}: annotation {LAST_GOOD_ANNOTATION} is unreadable: {exc}") from None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], *, where: str) -> LastGood | None:
        text = (obj.get("metadata", {}).get("annotations") or {}).get(LAST_GOOD_ANNOTATION)
        return None if text is None else cls.from_json(text, where=where)


__all__ = ["LAST_GOOD_VERSION", "LastGood"]
