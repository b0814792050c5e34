"""Credentials never leave the agent: URLs and free text are redacted before they become a label,
a log line or part of /snapshot. Pure functions.

- `redact_url("http://user:pw@10.0.0.5:8000/metrics?token=abc")` ->
  `"http://***@10.0.0.5:8000/metrics?token=***"`: the userinfo goes, and so does the value of any
  query parameter whose name looks like a secret (token, key, password, secret, auth, sig...).
- `redact_text` does the same to every URL inside a message (an exception's text may quote one).
"""
from __future__ import annotations

import re

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://)[^/?#@\s]{1,1024}@")
_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:[a-z0-9_.-]{0,40})(?:token|key|passw(?:or)?d|pwd|secret|auth|sig(?:nature)?|credential)"
    r"[a-z0-9_.-]{0,40}=)[^&;#\s]{0,4096}")


def redact_text(text: str) -> str:
    """Every `scheme://user:password@` becomes `scheme://***@`; secret-looking query values `***`."""
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(r"\1***", text)
    return text


def redact_url(url: str) -> str:
    return redact_text(url)
