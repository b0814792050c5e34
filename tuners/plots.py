"""PNG plots of a study, drawn with optuna's matplotlib backend (headless)."""
from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import optuna
from optuna.visualization import matplotlib as ovm

from contracts.output_paths import replacing


def label(name: str) -> str:
    """An objective name as an axis label: `ttft_p95_s + memory` -> `TTFT p95 + memory cost (s)`."""
    base, plus, rest = name.partition(" + ")
    if base.startswith("ttft_p") and base.endswith("_s"):
        text = f"TTFT {base[5:-2]}" + (f" + {rest} cost" if plus else "")
        return f"{text} (s)"
    return {"hit_ratio": "hit ratio", "memory_gib": "fleet CPU memory (GiB)"}.get(name, name)


def _save(ax: object, path: Path, title: str) -> Path:
    """One title per figure: optuna's own axis title ("Optimization History Plot") is replaced."""
    axes = ax if isinstance(ax, (list, tuple)) else getattr(ax, "flat", [ax])
    first = next(iter(axes))
    fig = first.figure  # type: ignore[union-attr]
    for a in fig.axes:
        for loc in ("left", "center", "right"):
            a.set_title("", loc=loc)
    fig.suptitle("")
    first.set_title(title, fontsize=11)  # type: ignore[union-attr]
    fig.set_size_inches(9, 5.5)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def write_plots(study: optuna.Study, out_dir: Path, *, objective_names: tuple[str, ...]) -> list[Path]:
    """History and parameter importances (first objective); Pareto front when multi-objective.
    Returns the files written. Plots that need more finished trials than exist are skipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    written: list[Path] = []
    if not done:
        return written
    multi = len(study.directions) > 1
    first = (lambda t: t.values[0]) if multi else None
    name = label(objective_names[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib backend experimental
        ax = ovm.plot_optimization_history(study, target=first, target_name=name)
        written.append(_save(ax, out_dir / "history.png", f"{study.study_name}: optimisation history ({name})"))
        if len(done) >= 2:
            try:
                ax = ovm.plot_param_importances(study, target=first, target_name=name)
                written.append(_save(ax, out_dir / "importances.png",
                                     f"{study.study_name}: parameter importances for {name}"))
            except (RuntimeError, ValueError, ZeroDivisionError):
                pass  # e.g. every trial has the same value: importances are undefined
        if multi:
            ax = ovm.plot_pareto_front(study, target_names=[label(n) for n in objective_names], targets=None,
                                       include_dominated_trials=True)
            written.append(_save(ax, out_dir / "pareto.png", f"{study.study_name}: Pareto front"))
    return written
