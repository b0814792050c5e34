"""Where rendered panels get their data: anything with `query_range`. `PrometheusSource` reads a
running Prometheus over its HTTP API; tests and other subsystems can pass their own source."""
from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.redact import redact_text, redact_url


class SourceError(RuntimeError):
    """A query that could not be answered; the message names the query and the reason."""


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and (unix time, value) points, NaN dropped."""

    labels: tuple[tuple[str, str], ...]
    times: tuple[float, ...]
    values: tuple[float, ...]

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


class RangeSource(Protocol):
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]: ...


Fetch = Callable[[str, float], bytes]


def _urlopen(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


@dataclass(frozen=True)
class PrometheusSource:
    """Range queries against Prometheus' `/api/v1/query_range`. `fetch` is injectable for tests."""

    base_url: str
    timeout: float = 10.0
    fetch: Fetch = _urlopen

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        where = redact_url(self.base_url)
        try:
            body = self.fetch(url, self.timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise SourceError(f"Prometheus {where} answered HTTP {exc.code} to "
                              f"{params.get('query', path)!r}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SourceError(redact_text(f"cannot reach Prometheus at {where}: {exc}")) from None
        except (http.client.InvalidURL, ValueError):  # its text would quote a piece of the password
            raise SourceError(f"--prometheus {where}: not a usable URL (percent-encode a '/', '?', '#' or '@' "
                              "in the user name or password)") from None
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise SourceError(f"Prometheus {where} sent non-JSON for {path}") from exc
        if payload.get("status") != "success":
            raise SourceError(f"Prometheus rejected {params.get('query', path)!r}: "
                              f"{payload.get('errorType')}: {payload.get('error')}")
        return payload["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get("/api/v1/query_range",
                         {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        if data.get("resultType") != "matrix":
            raise SourceError(f"expected a matrix for {expr!r}, got {data.get('resultType')}")
        return [parse_matrix_series(item) for item in data["result"]]


def parse_matrix_series(item: dict[str, Any]) -> Series:
    times: list[float] = []
    values: list[float] = []
    for t, v in item.get("values", []):
        value = float(v)
        if math.isnan(value):
            continue
        times.append(float(t))
        values.append(value)
    labels = tuple(sorted(item.get("metric", {}).items()))
    return Series(labels, tuple(times), tuple(values))
