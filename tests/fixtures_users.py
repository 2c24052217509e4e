"""Another user for the tests of permissions: root ignores permission bits, so these tests run
commands as 'nobody' (through setpriv), in a folder of that user's own under /tmp (pytest's temp
root is 0700). Where that cannot be had (not root, no setpriv, no 'nobody', an interpreter that
user may not run), the test is skipped, saying why."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

EVENTLOG = "from eventlog.cli.app import main; main(prog_name='eventlog')"
"""The CLI through the interpreter (``python -c``), not the console script: the script's folder
may be closed to other users."""


@contextmanager
def nobody_folder(prefix: str) -> Iterator[tuple[Path, pwd.struct_passwd, list[str]]]:
    """``(folder, nobody's account, the setpriv words that run a command as nobody)``: a new
    folder under /tmp that 'nobody' owns, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to run eventlog as another user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        probe = subprocess.run([*drop, sys.executable, "-c", EVENTLOG, "--version"], capture_output=True, text=True,
                               timeout=120, cwd=base)
        if probe.returncode != 0:
            pytest.skip(f"user 'nobody' cannot run eventlog here: {probe.stderr[-200:]}")
        yield base, nobody, drop
    finally:
        shutil.rmtree(base, ignore_errors=True)
