"""One optuna study per phase of the live tuner (`<study>.phase000`, `.phase001`, ...): the
study names, the latest phase stored, and the last good configuration an earlier phase left."""
from __future__ import annotations

import re

import optuna

from contracts.knobs import Knobs


def phase_study_name(study: str, phase: int) -> str:
    return f"{study}.phase{phase:03d}"


def latest_phase(storage: optuna.storages.BaseStorage, study: str) -> int:
    """The highest phase number stored for `study`, or -1."""
    pattern = re.compile(re.escape(study) + r"\.phase(\d{3,})$")
    phases = [int(m.group(1)) for s in optuna.study.get_all_study_names(storage)
              if (m := pattern.match(s))]
    return max(phases, default=-1)


def latest_good_before(storage: optuna.storages.BaseStorage, study: str, phase: int) -> Knobs | None:
    """The last good configuration of the most recent earlier phase that has one."""
    for p in range(phase - 1, -1, -1):
        try:
            s = optuna.load_study(study_name=phase_study_name(study, p), storage=storage)
        except KeyError:
            continue
        data = s.user_attrs.get("last_good")
        if data:
            return Knobs.from_mapping(data["knobs"], source=f"study {s.study_name} last_good")
    return None
