"""Typed, frozen settings of `tierpilot demo`, validated once at start-up."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from contracts.output_paths import OutputPathError, check_output_dir


class DemoSettingsError(ValueError):
    """A bad demo option; the message names the option and the valid range."""


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """duration_s: wall-clock length of the run (the workload is paced to fit it).
    pods: emulated vLLM pods. trace: a Mooncake trace for the shifted phase (default: built-in
    synthetic two-phase workload). seed: workload and sampler seed. report_dir: where report.md
    and the charts go. dry_run: the tuner proposes but applies nothing. time_scale: trace-seconds
    per wall-second (None: fit the workload to the duration). agent_port: where the agent exports
    its unified metrics (falls back to a free port if taken). restart_downtime_s: wall seconds a
    restarting pod is unreachable. inject_regression: make the first live trial a configuration
    known to be bad (shows the rollback). live_view: draw the rich console view (else progress
    lines). pods_port: 0 for free ports, else the first of the emulated endpoints' fixed ports
    (pod i's vLLM /metrics on pods_port + i, its FUSE mount's on pods_port + pods + i, the Curvine
    master on pods_port + 2 * pods)."""

    duration_s: float = 180.0
    pods: int = 4
    trace: Path | None = None
    seed: int = 7
    report_dir: Path = Path("demo-report")
    dry_run: bool = False
    time_scale: float | None = None
    agent_port: int = 9400
    restart_downtime_s: float = 0.3
    inject_regression: bool = False
    live_view: bool = True
    pods_port: int = 0

    def __post_init__(self) -> None:
        if not 20 <= self.duration_s <= 3600:
            raise DemoSettingsError(f"--duration: must be between 20 and 3600 seconds, got {self.duration_s}")
        if not 1 <= self.pods <= 16:
            raise DemoSettingsError(f"--pods: must be between 1 and 16, got {self.pods}")
        if self.time_scale is not None and not 0.1 <= self.time_scale <= 10_000:
            raise DemoSettingsError(f"--time-scale: must be between 0.1 and 10000, got {self.time_scale}")
        if self.trace is not None and not Path(self.trace).is_file():
            raise DemoSettingsError(f"--trace: no such file {self.trace}")
        try:
            check_output_dir(Path(self.report_dir), "--report-dir")
        except OutputPathError as exc:
            raise DemoSettingsError(str(exc)) from None
        if not 0 <= self.agent_port <= 65535:
            raise DemoSettingsError(f"agent port: must be 0..65535, got {self.agent_port}")
        if self.pods_port and not 1024 <= self.pods_port <= 65535 - 2 * self.pods:
            raise DemoSettingsError(f"--pods-port: must be 0 (free ports) or 1024..{65535 - 2 * self.pods}, "
                                    f"got {self.pods_port}")
        if not 0 <= self.restart_downtime_s <= 30:
            raise DemoSettingsError(f"restart downtime: must be 0..30 s, got {self.restart_downtime_s}")
