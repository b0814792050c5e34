"""Credentials never leave the agent: URLs and free text are redacted before they become a label,
a log line or part of /snapshot. Pure functions, linear in their input.

- `redact_url("http://user:pw@10.0.0.5:8000/metrics?token=abc")` ->
  `"http://***@10.0.0.5:8000/metrics?token=***"`: the userinfo goes, and so does the value of any
  query (or fragment) parameter whose name looks like a secret (token, key, password, secret, auth,
  sig...).
- `redact_text` does the same to every URL inside a message (an exception's text may quote one).
- `RedactingStream(stream)`: a text stream that applies `redact_text` to every line written; the
  command line wraps its stdout and stderr in it, so nothing it prints can carry a credential.

Userinfo is found the way the HTTP client (yarl, i.e. `urllib.parse.urlsplit`) finds it: the
authority runs from `//` to the first `/`, `?` or `#`, and the userinfo is everything before its
*last* `@`. So a password holding a raw `@` or `:` (`http://u:p@ss:w@host/`) is redacted whole,
whatever its length and percent-encoding. An authority whose port is not a number but which is
followed by an `@` (a raw `/`, `?` or `#` in a password: `http://u:pa/ss@host/`) is taken to be
userinfo as well: such a URL does not parse, and its text must not be echoed either.

A parameter's name is percent-decoded (and `+` read as a space, repeatedly, as far as three
levels) before it is judged, so `?%74oken=` is `token`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_plus

MASK = "***"

# a query or fragment parameter: separator, name, `=`, value (each part stops at the next
# separator, fragment or whitespace; one pass, no backtracking between parts)
_PARAM = re.compile(r"([?&;#])([^=&;#?\s]*+)=([^&;#\s]*+)")
_SECRET_NAME = re.compile(
    r"token|key|passw|pwd|pass$|secret|auth|sig|credential|session|cookie|jwt|bearer|private")
_AUTHORITY_END = re.compile(r"[/?#\s]")
_SPACE = re.compile(r"\s")
_AFTER_MASK = frozenset("\"'<>\\^`{|}])")  # cannot be in a URL: what follows a masked value


def _secret_name(raw: str) -> bool:
    name = raw
    for _ in range(3):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    name = name.lower().replace("-", "").replace("_", "").replace(".", "").replace(" ", "")
    return _SECRET_NAME.search(name) is not None


def _masked(value: str) -> bool:
    """A value this module already masked, quoted since (`token=***"`): left as it is, so
    redacting twice changes nothing (the closing quote of a label or a JSON string stays)."""
    return value.startswith(MASK) and (len(value) == len(MASK) or value[len(MASK)] in _AFTER_MASK)


def _redact_params(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group(3) and not _masked(m.group(3)) and _secret_name(m.group(2)):
            return f"{m.group(1)}{m.group(2)}={MASK}"
        return m.group(0)
    return _PARAM.sub(repl, text)


def _authority_end(text: str, start: int) -> int:
    """Index where the authority that starts at `start` ends (the first `/`, `?`, `#` or
    whitespace, or the end of the text)."""
    m = _AUTHORITY_END.search(text, start)
    return len(text) if m is None else m.start()


def _word_end(text: str, start: int) -> int:
    m = _SPACE.search(text, start)
    return len(text) if m is None else m.start()


def _bad_port(hostport: str) -> bool:
    """`host:port` whose port is not a number (IPv6 brackets respected)."""
    if hostport.startswith("["):
        close = hostport.find("]")
        rest = hostport[close + 1:] if close != -1 else ""
        return rest.startswith(":") and not rest[1:].isdigit()
    _, colon, port = hostport.partition(":")
    return bool(colon) and not port.isdigit()


def _redact_userinfo(text: str) -> str:
    out: list[str] = []
    pos = 0
    search = 0
    while True:
        sep = text.find("://", search)
        if sep == -1:
            break
        start = sep + 3
        end = _authority_end(text, start)
        at = text.rfind("@", start, end)
        if at == -1 and _bad_port(text[start:end]):
            # a raw `/`, `?` or `#` inside a password: the URL does not parse; hide up to the `@`
            at = text.rfind("@", end, _word_end(text, end))
        if at != -1:
            out.append(text[pos:start])
            out.append(MASK)
            pos = at  # keeps the "@"
            search = at + 1
        else:
            search = start
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """Every `scheme://userinfo@` becomes `scheme://***@`; secret-looking parameter values `***`."""
    if "@" in text and "://" in text:
        text = _redact_userinfo(text)
    if "=" in text:
        text = _redact_params(text)
    return text


def redact_url(url: str) -> str:
    return redact_text(url)


class RedactingStream:
    """A text stream whose every line passes `redact_text` before it reaches `raw`: what the command
    line prints (warnings, tables, errors, tracebacks, log lines) goes through it. A line is held
    until it ends (or the stream is flushed), so a URL written in pieces is still seen whole; every
    other attribute (`isatty`, `fileno`, `encoding`) is the wrapped stream's."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._pending = ""

    @classmethod
    def around(cls, stream: Any) -> Any:
        """`stream` wrapped (once: a stream already redacting is returned as it is)."""
        return stream if isinstance(stream, cls) else cls(stream)

    def write(self, text: str) -> int:
        self._pending += text
        end = self._pending.rfind("\n") + 1
        if end:
            done, self._pending = self._pending[:end], self._pending[end:]
            self._raw.write(redact_text(done))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._pending:
            self._raw.write(redact_text(self._pending))
            self._pending = ""
        self._raw.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
