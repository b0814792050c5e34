"""The emulated Curvine master over real files (emulator/cluster/curvine_master.py): Curvine's quota
eviction (high/low watermarks, LRU or LFU, pages of `scan_page` files) deletes real files, learns of
writes and opens through inotify, and serves Curvine's master metric names on /metrics, which the
agent classifies as a Curvine master. No engine: files are written and opened by this process."""
from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from agent.collect.parse import parse
from agent.collect.roles import detect_kind
from emulator.cluster.curvine_master import CurvineMaster, CurvineMasterServer, main
from emulator.cluster.curvine_quota import (
    LfuTracker,
    LruTracker,
    QuotaConfig,
    QuotaError,
    bytes_to_free,
    evict,
)


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    payload = parse(text)
    assert detect_kind(payload.by_name) == "curvine_master"
    return {name: sum(s.value for s in samples) for name, samples in payload.by_name.items()}


def _read(path: Path, times: int = 1) -> None:
    for _ in range(times):
        with path.open("rb") as f:
            f.read()


@pytest.mark.parametrize(("policy", "evicted"), [("lru", ["f0", "f1"]), ("lfu", ["f7", "f1"])])
def test_watermark_eviction_deletes_real_files_in_policy_order(tmp_path: Path, policy: str,
                                                               evicted: list[str]) -> None:
    root = tmp_path / "l2"
    master = CurvineMaster(root, QuotaConfig(capacity_bytes=1000, policy=policy, high_watermark=0.8,
                                             low_watermark=0.6, scan_page=2))
    with CurvineMasterServer(master).start(loop=False) as server:
        sub = root / "model_abc_r0" / "c29"
        sub.mkdir(parents=True)
        server.step()  # the new directories are watched from here on
        files = [sub / f"f{i}.bin" for i in range(8)]
        for f in files[:7]:
            f.write_bytes(b"x" * 100)
        assert server.step() is None  # 700 of 1,000 bytes: below the high watermark
        _read(files[0], times=3)  # f0: the most often read, the longest ago
        for f in files[1:7]:
            _read(f)
        server.step()
        files[7].write_bytes(b"x" * 100)  # 800 of 1,000: at the high watermark, free 200 (down to the low one)
        result = server.step()
        assert result is not None
        assert [p.stem for p in result.files] == evicted
        assert sorted(p.name for p in sub.iterdir()) == sorted(f.name for f in files if f.stem not in evicted)
        m = _metrics(server.url)
        assert m["capacity"] == 1000 and m["fs_used"] == 600 and m["available"] == 400
        assert m["eviction_trigger_count"] == 1 and m["eviction_files_deleted"] == 2
        assert m["eviction_bytes_freed"] == 200 and m["eviction_lru_cache_size"] == 6
        assert server.step() is None  # 600: below the high watermark again


def test_files_written_in_place_renamed_or_deleted_behind_its_back(tmp_path: Path) -> None:
    root = tmp_path / "l2"
    master = CurvineMaster(root, QuotaConfig(capacity_bytes=10_000))
    with CurvineMasterServer(master).start(loop=False) as server:
        (root / "a.bin.tmp").write_bytes(b"x" * 500)  # the fs tier's partial file: not in the pool
        server.step()
        assert master.used == 0
        (root / "a.bin.tmp").rename(root / "a.bin")
        (root / "b.bin").write_bytes(b"x" * 300)
        server.step()
        assert master.used == 800 and len(master.tracker) == 2
        (root / "a.bin").unlink()  # removed by someone else: forgotten at the next scan
        server.step()
        assert master.used == 300 and len(master.tracker) == 1
        assert _metrics(server.url)["fs_used"] == 300


def test_a_page_may_overshoot_and_a_failed_removal_keeps_the_file() -> None:
    cfg = QuotaConfig(capacity_bytes=1000, scan_page=2)
    lru = LruTracker()
    for k in "abcde":
        lru.on_access(k)
    sizes = dict.fromkeys("abcde", 150)
    got = evict(lru, sizes, 200, cfg, remove=lambda k: True)
    assert got.files == ("a", "b") and got.bytes_freed == 300  # one page of two frees 300 for a target of 200
    got = evict(lru, sizes, 200, QuotaConfig(capacity_bytes=1000, scan_page=1), remove=lambda k: k != "c")
    # c, the first victim, fails: it stays first, and each retry counts against the target as in Curvine
    assert got.files == () and got.bytes_freed == 0 and lru.victims(3) == ["c", "d", "e"]


def test_lfu_breaks_ties_by_who_reached_the_count_first() -> None:
    lfu = LfuTracker()
    for k in ["a", "b", "c", "b", "a"]:
        lfu.on_access(k)
    assert lfu.victims(3) == ["c", "b", "a"]  # c once; b reached 2 before a
    lfu.remove(["c"])
    assert lfu.victims(5) == ["b", "a"] and len(lfu) == 2


def test_the_plan_and_the_config_follow_curvine() -> None:
    cfg = QuotaConfig(capacity_bytes=1000)  # Curvine's defaults: lru, 0.8 / 0.6, pages of 2
    assert (cfg.policy, cfg.high_watermark, cfg.low_watermark, cfg.scan_page) == ("lru", 0.8, 0.6, 2)
    assert bytes_to_free(799, cfg) is None
    assert bytes_to_free(800, cfg) == 200
    assert bytes_to_free(950, QuotaConfig(capacity_bytes=1000, low_watermark=0.9)) == 150  # low capped at high
    with pytest.raises(QuotaError, match="policy 'arc'"):
        QuotaConfig(capacity_bytes=1, policy="arc")
    with pytest.raises(QuotaError, match="positive size"):
        QuotaConfig(capacity_bytes=0)


def test_the_command_refuses_a_bad_quota_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--root", str(tmp_path), "--capacity-mib", "64", "--high", "1.5"])
    assert exc.value.code == 2
    assert "watermarks high 1.5, low 0.6: fractions of the quota" in capsys.readouterr().err


def test_the_command_reads_the_quota_from_curvines_cluster_toml(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "curvine-cluster.toml"
    toml.write_text('[master]\nquota_eviction_policy = "arc"\n')
    with pytest.raises(SystemExit) as exc:  # the file's policy, not --policy's default, is what is checked
        main(["--root", str(tmp_path / "l2"), "--capacity-mib", "64", "--config", str(toml)])
    assert exc.value.code == 2 and "policy 'arc'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--root", str(tmp_path / "l2"), "--capacity-mib", "64", "--config", str(tmp_path / "missing.toml")])
    assert "missing.toml" in capsys.readouterr().err
