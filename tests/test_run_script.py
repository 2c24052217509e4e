"""The bootstrap script `run`: asking for help installs nothing; `run test`'s pytest-xdist options."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_help_prints_without_setting_up_a_venv(tmp_path: Path) -> None:
    shutil.copy(ROOT / "run", tmp_path / "run")
    shutil.copytree(ROOT / "bench", tmp_path / "bench", ignore=shutil.ignore_patterns("results", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    r = subprocess.run([sys.executable, str(tmp_path / "run"), "bench", "--help"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m bench") and "--messages" in r.stdout
    assert not (tmp_path / ".venv").exists()


def _fake_venv(tmp_path: Path, with_xdist: bool) -> Path:
    """`run` beside a .venv whose python records its arguments (and has pytest-xdist or not),
    stamped as set up: `run test` installs nothing and starts that python."""
    shutil.copy(ROOT / "run", tmp_path / "run")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text('#!/bin/sh\nif [ "$1" = -c ]; then exit %d; fi\necho "$@" >> "%s"\n'
                                 % (0 if with_xdist else 1, tmp_path / "args"))
    (bin_ / "python").chmod(0o755)
    (tmp_path / ".venv" / ".installed").write_text(f"test:{(tmp_path / 'pyproject.toml').stat().st_mtime_ns}")
    return tmp_path / "args"


def _run_test(tmp_path: Path, *args: str, workers: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EVENTLOG_TEST_WORKERS"}
    if workers is not None:
        env["EVENTLOG_TEST_WORKERS"] = workers
    return subprocess.run([sys.executable, str(tmp_path / "run"), "test", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)


def test_run_test_without_pytest_xdist_in_the_venv_runs_in_one_process(tmp_path: Path) -> None:
    """A .venv without pytest-xdist got `-n 2 --dist loadfile` all the same: pytest stopped at
    "unrecognized arguments: -n" and no test ran. Now the tests run in one process, said once."""
    args = _fake_venv(tmp_path, with_xdist=False)
    r = _run_test(tmp_path, "tests/test_x.py")
    assert r.returncode == 0 and "pytest-xdist is not installed" in r.stderr, r
    assert args.read_text() == "-m pytest -q tests/test_x.py\n"


def test_run_test_leaves_a_debugging_run_in_one_process(tmp_path: Path) -> None:
    """`python3 run test --pdb` got `-n 2 --dist loadfile` too, and pytest-xdist stopped it:
    "--pdb is incompatible with distributing tests". A debugger needs the one process."""
    args = _fake_venv(tmp_path, with_xdist=True)
    for flag in ("--pdb", "--trace"):
        args.unlink(missing_ok=True)
        r = _run_test(tmp_path, "tests/test_x.py", flag)
        assert r.returncode == 0 and args.read_text() == f"-m pytest -q tests/test_x.py {flag}\n", r


def test_run_test_worker_options(tmp_path: Path) -> None:
    """EVENTLOG_TEST_WORKERS that is no number ended in a ValueError traceback (exit 1, as failed
    tests) after the venv's set-up; `-pno:xdist` (pytest's one-word spelling) got `-n` added, which
    pytest without the plugin refuses. Now: a usage error (exit 2) naming the variable, and a
    caller's -pno:xdist / -n / 0 workers left to run in one process."""
    args = _fake_venv(tmp_path, with_xdist=True)
    for junk in ("junk", "-1", "auto", "2x"):
        r = _run_test(tmp_path, workers=junk)
        assert r.returncode == 2 and "EVENTLOG_TEST_WORKERS" in r.stderr and "Traceback" not in r.stderr, r
    assert not args.exists()  # no pytest started
    for extra, workers, wanted in ((["-pno:xdist"], None, "-m pytest -q -pno:xdist"),
                                   (["-p", "no:xdist"], "3", "-m pytest -q -p no:xdist"),
                                   (["-n", "1"], "3", "-m pytest -q -n 1"),
                                   ([], "0", "-m pytest -q"),
                                   ([], " 3 ", "-m pytest -q -n 3 --dist loadfile")):
        args.unlink(missing_ok=True)
        r = _run_test(tmp_path, *extra, workers=workers)
        assert r.returncode == 0 and args.read_text() == wanted + "\n", (extra, workers, r)


def test_run_test_caps_the_number_of_workers(tmp_path: Path) -> None:
    """EVENTLOG_TEST_WORKERS=100000 started 100,000 pytest-xdist workers (each a Python process
    with child processes of its own). Now at most PER_CORE_MAX per core, said on stderr."""
    args = _fake_venv(tmp_path, with_xdist=True)
    cap = 4 * (os.cpu_count() or 1)
    for given, wanted in ((str(10**20), cap), (str(cap + 1), cap), (str(cap), cap)):
        args.unlink(missing_ok=True)
        r = _run_test(tmp_path, workers=given)
        assert r.returncode == 0 and args.read_text() == f"-m pytest -q -n {wanted} --dist loadfile\n", (given, r)
        assert ("more than 4 per core" in r.stderr) == (int(given) > cap), r.stderr
