"""The TOML editor against the real loader: Curvine reads its cluster config as TOML 1.0, and
`tomllib` is the reference here. Every case runs tomllib on the text before and after the edit:
the editor either reads and writes what tomllib reads (the edited key has exactly the intended
value, every other key is unchanged, and writing the old token back restores the file byte for
byte) or refuses with a one-line error naming the line."""
from __future__ import annotations

import tomllib

import pytest

from agent.k8s.textconf import ConfigTextError, toml_flat, toml_get, toml_set, toml_value

KEY = "cache.size"

EDITABLE = [
    "[cache]\nsize = 1\nname = \"a\"\n",
    "top = 1\n[cache]\nsize = 1\n",
    "[cache]\nname = \"a\"\n",  # absent: added to its table
    "top = 1\n",  # absent with its table: a new table
    "[cache]\nsize = 1 # blocks\n",  # a comment after the value stays
    "[cache]\nname = \"a # b\" # the # in the string is not a comment\nsize = 1\n",
    "[ cache ]\nsize = 1\n",  # spaces in the header
    "[\"cache\"]\nsize = 1\n",  # a quoted table name
    "[cache]\nsize = 1\r\nx = 2\r\n",  # CRLF
    "[cache]\nsize = 0x10\n",  # hexadecimal
    "[cache]\nsize = 1_024\n",  # TOML's digit separator
    "[cache]\nsize = 1\n[cache.sub]\nsize = 9\n",  # a sub-table's key of the same name
    "[cache]\nsize = 1\ndesc = \"\"\"\nsize = 5\n\"\"\"\n",  # a key-like line inside a multi-line string
    "[cache]\nsize = 1\ndesc = '''\n[other]\nsize = 5\n'''\n",  # a header-like line inside one
    "[cache]\nsize = 1\n[[workers]]\nsize = 2\n[[workers]]\nsize = 3\n",  # arrays of tables after it
    "[[workers]]\nsize = 2\n[cache]\nname = \"a\"\n",  # absent, after an array of tables
    "[cache]\nsize = 1\nnum = [\n  1,\n  2,\n]\n",  # a multi-line array elsewhere in the table
]
REFUSED = [
    ("[cache]\n\"size\" = 1\n", 2),  # a quoted key: tomllib reads cache.size
    ("cache.size = 1\n[other]\nx = 1\n", 1),  # a dotted key at the top
    ("cache = { size = 1 }\n", 1),  # an inline table
    ("[cache]\nsize = [\n  1,\n]\n", 2),  # a multi-line value
    ("[cache]\nsize = \"\"\"\n1\"\"\"\n", 2),  # a multi-line string value
    ("[[cache]]\nsize = 1\n", 1),  # under an array of tables: not a table the editor edits
    ("[other]\nx = 1\n[[cache]]\nsize = 1\n", 3),
]


@pytest.mark.parametrize("text", EDITABLE)
def test_editable_files_read_and_write_what_tomllib_reads(text: str) -> None:
    before = toml_flat(tomllib.loads(text))
    tok = toml_get(text, KEY)
    assert (None if tok is None else toml_value(tok)) == before.get(KEY)
    out = toml_set(text, {KEY: "2048"})
    after = toml_flat(tomllib.loads(out))
    assert after.pop(KEY) == 2048
    before_rest = {k: v for k, v in before.items() if k != KEY}
    assert after == before_rest
    if tok is not None:  # the rollback writes the old token back: the file, byte for byte
        assert toml_set(out, {KEY: tok}) == text
    else:
        assert toml_flat(tomllib.loads(toml_set(out, {KEY: None}))) == before


@pytest.mark.parametrize(("text", "line"), REFUSED)
def test_files_the_line_editor_would_misread_are_refused_with_the_line(text: str, line: int) -> None:
    assert "cache" in tomllib.loads(text)  # the loader does read a cache.size (maybe inside an array)
    for op in (lambda: toml_get(text, KEY), lambda: toml_set(text, {KEY: "2048"})):
        with pytest.raises(ConfigTextError, match=rf"\(line {line}\)") as exc:
            op()
        assert "\n" not in str(exc.value)


def test_a_comment_after_a_string_with_a_hash_is_not_part_of_the_token() -> None:
    text = "[cache]\npolicy = \"lru # fast\" # default\n"
    assert toml_get(text, "cache.policy") == "\"lru # fast\""
    out = toml_set(text, {"cache.policy": "\"lfu\""})
    assert out == "[cache]\npolicy = \"lfu\" # default\n"
    assert tomllib.loads(out)["cache"]["policy"] == "lfu"


def test_an_edit_that_would_change_another_key_is_refused_with_a_line() -> None:
    # the table exists only through a dotted key: appending [cache] would redefine it (invalid)
    text = "cache.name = \"a\"\n"
    with pytest.raises(ConfigTextError) as exc:
        toml_set(text, {KEY: "1"})
    assert "\n" not in str(exc.value)
    assert tomllib.loads(text) == {"cache": {"name": "a"}}


def test_duplicate_keys_are_refused_with_their_lines_not_mistaken_in_strings() -> None:
    text = "[cache]\nsize = 1\nsize = 2\n"
    with pytest.raises(ConfigTextError, match=r"appears 2 times \(lines 2, 3\)"):
        toml_get(text, KEY)
