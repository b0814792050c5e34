"""`tierpilot tune` with the deployment's targets file wired in: the twin tuner of tuners/cli.py,
given agent/k8s's reading of a targets file (what each target accepts), so `tune --targets F`
proposes only values `tierpilot k8s apply F` accepts. tuners/ cannot import agent/k8s (layers),
so the reader is injected here."""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from tuners import cli as tuner_cli
from tuners.space import TargetAcceptance


def load_targets(path: Path) -> TargetAcceptance:
    """What the targets in `path` accept; errors (bad file, unknown kind) name the file and key."""
    from agent.k8s.mapping import load_mappings
    from agent.k8s.offline import acceptance
    from agent.k8s.settings import load_settings

    return acceptance(load_settings(path), load_mappings(), source=str(path))


tune = copy.copy(tuner_cli.tune)
tune.callback = functools.partial(tuner_cli.tune.callback, load_targets=load_targets)  # type: ignore[arg-type]
