"""The bootstrap script `run`: asking for help installs nothing."""
from __future__ import annotations

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
