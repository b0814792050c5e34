"""The peer endpoints of sharded replicas (/window, /kv/sketch) carry every pod's window, so with
`shard.token_file` they answer only holders of the shared bearer token. Real agents on 127.0.0.1:
the right token reads, a wrong or missing one is refused with a one-line reason and counted on
both sides, a rotated file is picked up without a restart (the previous token accepted for the
grace period only), /metrics stays open; sharding without a token needs an explicit opt-out."""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.collect.discovery import StaticTargets
from agent.collect.fleetstore import FleetStore
from agent.runtime.app import Agent
from agent.runtime.assembly import RuntimeConfigError, build_runtime
from agent.runtime.peer_auth import PeerFetch, PeerRefused, PeerToken
from agent.settings import SettingsError, load_settings
from contracts.fleet import PartialFleetError

pytestmark = pytest.mark.timeout(60)


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, token: str) -> None:
    """As kubelet updates a Secret volume: a new file swapped in atomically."""
    tmp = path.with_suffix(".new")
    tmp.write_text(token + "\n")
    os.replace(tmp, path)


def _get(url: str, token: str | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_sharding_without_a_token_needs_an_explicit_opt_out(tmp_path):
    with pytest.raises(SettingsError, match=r"key .shard.: .*set token_file .*allow_unauthenticated"):
        load_settings(env={}, shard={"count": 2})
    assert load_settings(env={}, shard={"count": 2, "allow_unauthenticated": True}).shard.count == 2
    token = tmp_path / "token"
    _write(token, "s3cret")
    assert load_settings(env={}, shard={"count": 2, "token_file": str(token)}).shard.token_file == token
    # an unusable file stops the start, naming the key
    for bad in (tmp_path / "missing", tmp_path / "empty"):
        if bad.name == "empty":
            bad.write_text("\n")
        settings = load_settings(env={}, shard={"count": 2, "token_file": str(bad)})
        with pytest.raises(RuntimeConfigError, match=f"key 'shard.token_file': .*{bad.name}"):
            build_runtime(settings, targets=StaticTargets(()))


def test_peer_endpoints_need_the_token_and_follow_its_rotation(tmp_path):
    server_file, client_file = tmp_path / "server-token", tmp_path / "client-token"
    _write(server_file, "token-one")
    _write(client_file, "token-one")
    mono = Clock()
    settings = load_settings(env={}, server={"host": "127.0.0.1", "port": 0}, scrape={"interval_s": 3600},
                             shard={"count": 2, "index": 1, "token_file": str(server_file), "token_grace_s": 60})
    peer = Agent(settings, StaticTargets(()), clock=Clock(), monotonic=mono)
    peer.add_route("/kv/sketch", lambda _q: (b'{"models": {}, "overlap": {}}', "application/json"))
    peer.start()
    try:
        base = peer.url.rsplit("/", 1)[0]
        client = PeerFetch(PeerToken(client_file))
        wrong = PeerFetch(PeerToken(_token_file(tmp_path / "wrong", "token-two")))
        anonymous = PeerFetch(None)
        local = Agent(load_settings(env={}), StaticTargets(()), clock=Clock()).store

        # the right token reads both endpoints
        assert FleetStore(local, [base], client, strict=True).window().height == 0
        assert client(f"{base}/kv/sketch?window_s=60", 5) == b'{"models": {}, "overlap": {}}'
        # a wrong or missing token: 401 with a Bearer challenge, one line saying what to fix
        status, body, headers = _get(f"{base}/window?window_s=60", "token-two")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert body.decode().count("\n") == 1 and "shard.token_file" in body.decode()
        assert _get(f"{base}/kv/sketch")[0] == 401
        assert _get(f"{base}/window", "token-one")[0] == 200
        with pytest.raises(PeerRefused, match=r"/window refused the read \(HTTP 401\): this replica's shard.token_file"):
            wrong(f"{base}/window?window_s=60", 5)
        with pytest.raises(PeerRefused, match="has no shard.token_file and the peer requires one"):
            anonymous(f"{base}/kv/sketch", 5)
        # the tuner's strict fleet view refuses to go on; the lenient one leaves the peer out, counted
        with pytest.raises(PartialFleetError, match=f"shard {base} left out.*HTTP 401"):
            FleetStore(local, [base], wrong, strict=True).window()
        lenient = FleetStore(local, [base], wrong)
        assert lenient.window().height == 0 and lenient.peer_errors == {base: 1}
        assert wrong.failures == {(base, "/window", "refused"): 3}
        assert anonymous.failures == {(base, "/kv/sketch", "refused"): 1}
        # /metrics needs no token, and counts what the peer endpoints refused
        status, text, _ = _get(peer.url)
        assert status == 200 and "tierpilot_peer_auth_refused_total 6.0" in text.decode()

        # rotation seen by the reader first: it falls back to the previous token while the peer has it
        _write(client_file, "token-zero")
        assert FleetStore(local, [base], client, strict=True).window().height == 0
        _write(client_file, "token-one")  # (and back: two rotations of the reader's file)
        assert client.token is not None and client.token.current() == "token-one" and client.token.rotations == 2
        # rotation: the server's Secret changes; the old token works for the grace period only
        _write(server_file, "token-three")
        assert _get(f"{base}/window", "token-three")[0] == 200
        assert _get(f"{base}/window", "token-one")[0] == 200
        mono.now += 61
        assert _get(f"{base}/window", "token-one")[0] == 401
        with pytest.raises(PeerRefused):
            client(f"{base}/window", 5)
        # the client's Secret follows: re-read on the next request, no restart
        _write(client_file, "token-three")
        assert FleetStore(local, [base], client, strict=True).window().height == 0
        assert client.token.rotations == 3
        # a file that turns bad later keeps the last good token
        client_file.write_text("")
        assert client.token.current() == "token-three"
    finally:
        peer.stop()


def _token_file(path: Path, token: str) -> Path:
    _write(path, token)
    return path
