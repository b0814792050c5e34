"""Byte-preserving edits of config files kept in ConfigMaps. Pure text in, text out.

Only the lines of the settings we own change; comments, order and every other line stay as they
were, so a rollback that writes the old tokens back restores the file byte for byte.

- flat YAML (LMCache config): top-level `key: value` lines (`yaml_text`);
- TOML (Curvine cluster config): `key = value` lines inside `[section]` (`toml_text`);
- JSON (production-stack router dynamic config): top-level `"key": value` members; vLLM's
  `--kv-transfer-config`: members of nested objects by key path (`json_text`).

A token is the value's text as it appears in the file (`512`, `"lru"`, `LRU`); `None` = absent.

Each editor reads what the component's own loader reads: LMCache loads its YAML with
`yaml.safe_load` (lmcache/v1/config_base.py), Curvine its TOML with a TOML 1.0 parser (`tomllib`
here), the production-stack router its dynamic config with `json.load`
(src/vllm_router/dynamic_config.py). A key written in a form the line editor cannot see or edit
(a quoted or dotted key, an alias, a multi-line value...) is refused with its line number, never
reported as absent; an edit after which the loader would read anything but the intended values
is refused the same way (`ConfigTextError`, one line).

A key we own that appears more than once is refused (naming the key and the lines), for reading
and writing alike: YAML and JSON loaders keep the LAST duplicate, so editing or reporting the
first one would tune a configuration that never runs; TOML forbids duplicates (Curvine would not
start).
"""
from agent.k8s.textconf.base import ConfigTextError
from agent.k8s.textconf.json_text import (
    json_get,
    json_path_get,
    json_path_set,
    json_set,
    json_token,
    json_value,
)
from agent.k8s.textconf.toml_text import toml_flat, toml_get, toml_set, toml_token, toml_value
from agent.k8s.textconf.yaml_text import yaml_get, yaml_set, yaml_token, yaml_value

_toml_flat = toml_flat  # the name the differential tests use

__all__ = [
    "ConfigTextError",
    "json_get", "json_path_get", "json_path_set", "json_set", "json_token", "json_value",
    "toml_flat", "toml_get", "toml_set", "toml_token", "toml_value",
    "yaml_get", "yaml_set", "yaml_token", "yaml_value",
]
