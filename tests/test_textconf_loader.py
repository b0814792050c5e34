"""The ConfigMap editor against the real loader: LMCache reads its config file with
`yaml.safe_load` (lmcache/v1/config_base.py, whatever the file's extension). Every case runs
yaml.safe_load on the text before and after the edit: the editor either reads and writes what the
loader reads (the edited key has exactly the intended value, every other key is unchanged) or
refuses with a one-line error naming the line."""
from __future__ import annotations

import pytest
import yaml

from agent.k8s.textconf import ConfigTextError, yaml_get, yaml_set, yaml_value

EDITABLE = [
    "chunk_size: 256\nlocal_cpu: true\n",
    "chunk_size: 256  # tokens\nmax_local_cpu_size: 5.0\n",
    "chunk_size: !!str 2048\nlocal_cpu: true\n",  # safe_load reads the string "2048"
    "base: &c 256\nother: *c\nchunk_size: 512\n",
    "local_cpu: true\n",  # absent: appended
    "chunk_size: '256'\n",
]
REFUSED = [
    ('"chunk_size": 256\nlocal_cpu: true\n', 1),  # quoted key: safe_load reads chunk_size
    ("base: &c 256\nchunk_size: *c\n", 2),  # an alias: safe_load reads 256, not '*c'
    ("defaults: &d\n  chunk_size: 256\n<<: *d\nlocal_cpu: true\n", 3),  # a merge key
    ("chunk_size: >\n  256\n", 1),  # a multi-line value
]


@pytest.mark.parametrize("text", EDITABLE)
def test_editable_files_read_and_write_what_safe_load_reads(text: str) -> None:
    before = yaml.safe_load(text)
    tok = yaml_get(text, "chunk_size")
    assert (None if tok is None else yaml_value(tok)) == before.get("chunk_size")
    out = yaml_set(text, {"chunk_size": "1024"})
    after = yaml.safe_load(out)
    assert after["chunk_size"] == 1024
    assert {k: v for k, v in after.items() if k != "chunk_size"} == \
        {k: v for k, v in before.items() if k != "chunk_size"}
    back = yaml_set(out, {"chunk_size": tok})
    assert yaml.safe_load(back) == before


@pytest.mark.parametrize(("text", "line"), REFUSED)
def test_files_the_line_editor_would_misread_are_refused_with_the_line(text: str, line: int) -> None:
    for op in (lambda: yaml_get(text, "chunk_size"), lambda: yaml_set(text, {"chunk_size": "1024"})):
        with pytest.raises(ConfigTextError, match=rf"\(line {line}\)") as exc:
            op()
        assert "\n" not in str(exc.value)
    assert yaml.safe_load(text)["chunk_size"] in (256, "256\n")  # what the loader does read


def test_an_edit_that_would_change_another_key_is_refused() -> None:
    text = "chunk_size: 256\n...\n"  # document end: an appended key would start a second document
    with pytest.raises(ConfigTextError):
        yaml_set(text, {"local_cpu": "true"})


TOML_CASES = [
    ("[cache]\nsize = 1\nname = \"a\"\n", "cache.size", "2"),
    ("top = 1\n[cache]\nsize = 1\n", "cache.size", "3"),
    ("[cache]\nname = \"a\"\n", "cache.size", "4"),  # absent: added to its section
    ("top = 1\n", "eviction.policy", '"lru"'),  # a new section
]


@pytest.mark.parametrize(("text", "key", "tok"), TOML_CASES)
def test_toml_edits_are_read_by_tomllib_as_intended(text: str, key: str, tok: str) -> None:
    import tomllib

    from agent.k8s.textconf import _toml_flat, toml_set, toml_value

    before = _toml_flat(tomllib.loads(text))
    after = _toml_flat(tomllib.loads(toml_set(text, {key: tok})))
    assert after.pop(key) == toml_value(tok)
    before.pop(key, None)
    assert after == before


def test_toml_key_set_by_a_dotted_key_elsewhere_is_refused() -> None:
    from agent.k8s.textconf import toml_set

    text = 'cache.size = 1\n[other]\nx = 1\n'  # tomllib reads cache.size; the section scan does not
    with pytest.raises(ConfigTextError, match="line"):
        toml_set(text, {"cache.size": "2"})


@pytest.mark.parametrize("text", ['{"a": 1, "routing_logic": "roundrobin"}', '{\n  "routing_logic": "x"\n}', "{}"])
def test_json_edits_are_read_by_json_as_intended(text: str) -> None:
    import json

    from agent.k8s.textconf import json_set

    out = json_set(text, {"routing_logic": '"session"'})
    after, before = json.loads(out), json.loads(text)
    assert after.pop("routing_logic") == "session"
    before.pop("routing_logic", None)
    assert after == before
