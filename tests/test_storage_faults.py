"""Storage faults are one clear line, never a 100-line traceback ending in optuna's "invalid data in
the commit": a corrupt SQLite page, a full disk (real SQLite errors), a storage URL's password."""
from __future__ import annotations

import contextlib
import gc
import sqlite3
import subprocess
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from agent.cli import main
from tuners.optuna_tuner import open_storage
from tuners.storage_errors import is_storage_error, one_line


def _study_file(path: Path) -> str:
    url = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name="s")
    for i in range(20):
        t = study.ask()
        t.set_user_attr("pad", "x" * 500)
        study.tell(t, float(i))
    return url


def test_a_corrupt_sqlite_page_is_one_line_on_the_command_line(tmp_path):
    url = _study_file(tmp_path / "s.db")
    with open(tmp_path / "s.db", "r+b") as f:  # overwrite the third page with garbage
        f.seek(4096 * 2)
        f.write(b"\xde\xad\xbe\xef" * 1024)
    result = CliRunner().invoke(main, ["tune", "--workload", "short", "--trials", "1", "--sampler", "random",
                                       "--storage", url, "--study", "s", "--pods", "1"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last == "Error: study storage: DatabaseError: database disk image is malformed", result.output
    assert "Traceback" not in result.output


def test_disk_full_from_sqlite_itself_is_one_line(tmp_path):
    con = sqlite3.connect(tmp_path / "full.db")
    con.execute("PRAGMA max_page_count = 2")  # SQLite answers SQLITE_FULL past two pages
    with pytest.raises(sqlite3.OperationalError) as err:
        con.execute("CREATE TABLE t (x TEXT)")
        con.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
    try:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit. This "
                                                     "typically happens due to invalid data") from err.value
    except optuna.exceptions.StorageInternalError as wrapped:
        assert is_storage_error(wrapped)
        assert one_line(wrapped) == "OperationalError: database or disk is full"


@contextlib.contextmanager
def _tiny_tmpfs(path: Path):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True,
                       check=False)
    if r.returncode:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        gc.collect()  # the failed storage's engine may still hold the file open
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)  # detach anyway


def test_a_full_disk_is_one_line_when_opening_the_storage(tmp_path):
    with _tiny_tmpfs(tmp_path / "full") as full:
        (full / "filler").write_bytes(b"\0" * 60_000)
        with pytest.raises(ValueError) as err:
            open_storage(f"sqlite:///{full}/study.db")
    assert str(err.value) == (f"cannot open optuna storage 'sqlite:///{full}/study.db': "
                              "OperationalError: database or disk is full")


def test_passwords_in_storage_urls_are_redacted():
    with pytest.raises(ValueError) as err:
        open_storage("postgresql+psycopg2://tierpilot:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)
    assert "OperationalError" in str(err.value)


def test_other_errors_are_not_storage_errors():
    assert not is_storage_error(ValueError("bad knob"))
    assert not is_storage_error(optuna.exceptions.DuplicatedStudyError("exists"))
