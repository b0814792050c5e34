"""What `make demo` shows a first-time user: no tracebacks when a client drops its connection to
an emulated endpoint, progress lines (not a cut-down live view) when stdout is not a terminal,
drift events that say what moved once ("drift: prompt_tokens_mean down"), and alarms classified
against the real shift time."""
from __future__ import annotations

import io
import socket
import struct
import time
import urllib.request

from emulator.cluster.http_endpoint import MetricsEndpoint
from emulator.demo.cli import wants_live_view
from emulator.demo.console import event_text
from emulator.demo.sim_run import DETECT_WITHIN_S, classify_alarms
from tuners.payoff import ActionCounts


def test_a_client_resetting_its_connection_is_counted_not_printed(capfd):
    endpoint = MetricsEndpoint(lambda: b"x 1\n")
    endpoint.start()
    try:
        host, port = "127.0.0.1", endpoint.port
        for _ in range(3):  # a keep-alive scrape, then the client resets the idle connection
            s = socket.create_connection((host, port))
            s.sendall(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            s.close()
        deadline = time.monotonic() + 5
        while endpoint.client_disconnects < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert urllib.request.urlopen(endpoint.url, timeout=5).status == 200  # still serving
    finally:
        endpoint.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err and "Exception occurred" not in err, err


def test_the_live_view_needs_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wants_live_view(False, Tty())
    assert not wants_live_view(True, Tty())
    assert not wants_live_view(False, io.StringIO())  # piped or redirected: progress lines


def test_a_drift_event_names_what_moved_once():
    assert event_text("drift", None, "prompt_tokens_mean down") == "prompt_tokens_mean down"
    assert event_text("rolled_back", 3, "p95 +41%") == "trial 3: regressed, rolled back: p95 +41%"
    assert event_text("baseline_done", None, "") == "baseline done"


def test_an_alarm_102_s_after_the_real_shift_is_true():
    assert DETECT_WITHIN_S == 120.0
    counts: dict[int, ActionCounts] = {}
    delays = classify_alarms((0.0, 1368.0), [500.0, 1368.0 + 102.0, 1600.0], counts)
    assert delays == [102.0]
    assert counts[1].true_alarms == 1 and counts[1].false_alarms == 1 and counts[0].false_alarms == 1
    late: dict[int, ActionCounts] = {}
    assert classify_alarms((0.0, 1368.0), [1368.0 + 138.0], late) == [float("inf")]
    assert late[1].false_alarms == 1
