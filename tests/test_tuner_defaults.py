"""One home per tuner default: the `tuner:` sections of agent/settings/tuner.py.

Structural, so a new duplicate fails without anyone listing it here:
- the `tuner:` section and every section under it are defined in that module;
- every dataclass named `*Settings` in the `tuners` package is a converter target in
  agent/runtime/tuning/schema.py (`SOURCES`) and declares no default of its own;
- no module of the demo, the harness, the bench scripts or the agent's runtime defines a
  module-level number whose name is a tuner settings field (`SETTLE_S` shadowing `live.settle_s`),
  nor calls a tuner settings dataclass with a literal value;
- the converters read only keys the schema has, and the demo's settings file only overrides
  keys the schema has (the file loads through the same validation);
- the Helm chart renders the same tuner defaults (it sets only what its values decide: `enabled`,
  `study`, `apply`, `mode`).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
import yaml

import tuners
from agent.runtime.tuning.schema import SOURCES, defaults
from agent.settings import AgentSettings, TunerSection, load_settings
from emulator.demo.deployment import TUNER_FILE, demo_settings
from emulator.demo.engine_tuning import ENGINE_TUNER_FILE

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("emulator/demo", "bench", "agent/runtime")
HOME = "agent/settings/tuner.py"  # the one home of the tuner defaults, named in every failure below


def _tuner_settings_classes() -> list[type]:
    found = []
    for mod in pkgutil.walk_packages(tuners.__path__, "tuners."):
        module = importlib.import_module(mod.name)
        for obj in vars(module).values():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and obj.__name__.endswith("Settings")):
                found.append(obj)
    return found


def _section_models(model: type) -> list[type]:
    """The `tuner:` section and every section under it, at any depth."""
    out = [model]
    for field in model.model_fields.values():
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out += _section_models(ann)
    return out


def test_the_tuner_sections_live_in_their_home() -> None:
    home = HOME.removesuffix(".py").replace("/", ".")
    models = _section_models(TunerSection)
    assert len(models) >= 10  # the walk finds them
    elsewhere = [f"{m.__name__} ({m.__module__})" for m in models if m.__module__ != home]
    assert not elsewhere, f"tuner sections defined outside {HOME}: {elsewhere}"


def _section_fields(model: type, section: str = "") -> set[tuple[str, str]]:
    """Every (section, field name) of the `tuner:` section, at any depth."""
    out = set()
    for name, field in model.model_fields.items():
        out.add((section, name))
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out |= _section_fields(ann, name)
    return out


# names too generic to be a tuner default on their own (a bench's own fleet size, its own seed)
GENERIC = {"enabled", "signals", "method", "workload", "trace", "profile", "storage", "study", "sampler", "objective",
           "pods", "seed"}
TUNER_FIELDS = {(sec, f) for sec, f in _section_fields(TunerSection) if f not in GENERIC}


def _shadows(name: str) -> bool:
    """`name` (lower case) names a tuner field: the field itself, the field after its section
    (`drift_threshold`), or a multi-word field at the end of a longer name (`demo_settle_s`)."""
    return any(name in (f, f"{sec}_{f}") or ("_" in f and name.endswith("_" + f)) for sec, f in TUNER_FIELDS)


def test_every_tuner_settings_dataclass_takes_its_values_from_the_schema() -> None:
    classes = _tuner_settings_classes()
    assert len(classes) >= 7  # the scan finds them
    missing = [c.__name__ for c in classes if c not in SOURCES]
    assert not missing, f"tuner settings dataclasses without a converter in agent/runtime/tuning/schema.py: {missing}"
    with_defaults = [f"{c.__name__}.{f.name}" for c in SOURCES for f in dataclasses.fields(c)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert not with_defaults, f"defaults defined outside {HOME}: {with_defaults}"


def test_each_converter_builds_its_dataclass_from_the_schema_defaults() -> None:
    for cls in SOURCES:
        assert isinstance(defaults(cls), cls)
    changed = AgentSettings(tuner={"drift": {"threshold": 7.5}, "live": {"settle_s": 1.0},
                                   "planner": {"hot_margin": 0.2, "horizon_floor_s": 42.0}})
    from tuners.drift import DriftSettings
    from tuners.live import LiveSettings
    from tuners.planning.horizon import HorizonSettings
    from tuners.planning.planner import PlanSettings

    assert defaults(DriftSettings, changed).threshold == 7.5
    assert defaults(LiveSettings, changed).settle_s == 1.0
    assert defaults(PlanSettings, changed).hot_margin == 0.2
    assert defaults(HorizonSettings, changed).floor_s == 42.0


def _constant_shadows(tree: ast.Module) -> list[str]:
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for t in targets:
            if not (isinstance(t, ast.Name) and t.id.isupper()):
                continue
            name = t.id.lower()
            if _shadows(name) and _is_literal(value):
                out.append(f"{t.id} (line {node.lineno})")
    return out


def _is_literal(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return bool(node.elts) and all(isinstance(e, ast.Constant) for e in node.elts)
    return False


def _literal_settings_calls(tree: ast.Module) -> list[str]:
    names = {c.__name__ for c in SOURCES}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if fn in names and any(_is_literal(k.value) for k in node.keywords):
                out.append(f"{fn}(...) (line {node.lineno})")
    return out


@pytest.mark.parametrize("folder", SCANNED)
def test_no_module_shadows_a_tuner_default(folder: str) -> None:
    problems = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for p in _constant_shadows(tree) + _literal_settings_calls(tree):
            problems.append(f"{path.relative_to(ROOT)}: {p}")
    assert not problems, f"tuner defaults defined outside {HOME}:\n" + "\n".join(problems)


def test_the_shadow_scan_can_fail() -> None:
    tree = ast.parse("SETTLE_S = 90.0\nDRIFT_WINDOW_S = 60.0\nDRIFT_THRESHOLD = 15.0\nOTHER = 'x'\n"
                     "MALLOC_THRESHOLD = 1 << 20\nx = LiveSettings(settle_s=1.0)\n")
    assert len(_constant_shadows(tree)) == 3 and len(_literal_settings_calls(tree)) == 1


@pytest.mark.parametrize("path", [TUNER_FILE, ENGINE_TUNER_FILE], ids=lambda p: p.name)
def test_the_demo_files_override_only_keys_the_schema_has(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    tuner = data["tuner"]
    loaded = load_settings(path, env={})  # extra keys are refused by the schema itself
    assert loaded.tuner.live.settle_s == tuner["live"]["settle_s"]
    defaults_now = AgentSettings().model_dump()

    def same_as_default(over: dict, base: dict, path: str) -> list[str]:
        out = []
        for k, v in over.items():
            if isinstance(v, dict):
                out += same_as_default(v, base[k], f"{path}{k}.")
            elif base[k] == v:
                out.append(path + k)
        return out

    restated = [k for k in same_as_default(data, defaults_now, "") if k != "tuner.enabled"]
    assert not restated, f"{path.name} restates defaults (not overrides): {restated}"


def test_the_demo_settings_carry_the_run_s_fleet_and_seed() -> None:
    run = demo_settings(pods=8, seed=3)
    assert run.tuner.limits.pods == 8 and run.tuner.seed == 3 and run.tuner.warm_start.seed == 3
    assert run.tuner.apply == "all" and run.kv_events.enabled  # restarts allowed; the rebuilt workload


def test_the_chart_renders_the_schema_defaults() -> None:
    from tests.test_helm_chart import template

    (cm,) = [d for d in template() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tierpilot-config"]
    agent = yaml.safe_load(cm["data"]["agent.yaml"])
    chosen = {"enabled", "study", "apply", "mode"}  # what the chart's values decide (tuner.*, tuner.dryRun)
    assert set(agent["tuner"]) <= chosen
    rendered = load_settings(env={}, **agent).tuner
    assert rendered.model_dump(exclude=chosen) == TunerSection().model_dump(exclude=chosen)
