"""The bodies of the agent's data endpoints: a window frame as Arrow IPC (`/window`), and the
snapshot as strict JSON with credentials redacted (`/snapshot`, `tierpilot scrape-once --json`)."""
from __future__ import annotations

import io
from dataclasses import asdict
from typing import Any

from contracts.jsonsafe import dumps as json_dumps
from contracts.redact import redact_text, redact_url
from contracts.tier_model import Snapshot


def window_ipc(frame: Any) -> bytes:
    """A polars frame as Arrow IPC bytes (what /window sends to the other replicas)."""
    buf = io.BytesIO()
    frame.write_ipc(buf)
    return buf.getvalue()


def snapshot_json(snap: Snapshot) -> str:
    """The snapshot as strict JSON (a non-finite number is null); target URLs and fault details
    with credentials redacted."""
    def default(o: object) -> Any:
        return str(o)
    data = asdict(snap)
    for st in data.get("targets", ()):
        st["target"]["url"] = redact_url(st["target"]["url"])
        st["detail"] = redact_text(st["detail"])
    return json_dumps(data, default=default, indent=1)


__all__ = ["snapshot_json", "window_ipc"]
