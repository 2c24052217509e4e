"""Run the OpenAI Agents SDK's own session tests against EventlogSession, from outside the repo.

    .venv/bin/python -m bench.sdk_session_tests [--version 0.24.0] [--keep]

Downloads the SDK's source distribution at run time (``pip download --no-binary :all:``) into a
temporary directory, and runs its ``tests/memory/test_session.py`` and ``test_session_limit.py``
there with every ``SQLiteSession`` the tests construct replaced by an ``EventlogSession``
(``SQLiteSession(id, db_path)`` -> ``EventlogSession(id, home=<db_path>.eventlog)``, so sessions
built on one path share a profile; ``":memory:"`` gets a fresh home each time). Nothing of the
SDK is copied into this repository. pytest-asyncio, which those tests need, is installed into the
temporary directory, not into the venv.

Tests that reach into SQLiteSession's internals (its connections, locks, tables, rollback and
corrupt-row handling) cannot pass against another class and are listed as such; the printed
summary separates them from the generic ones.
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["tests/memory/test_session.py", "tests/memory/test_session_limit.py"]
# Tests whose subject is SQLiteSession's own machinery (names as the SDK spells them).
SQLITE_INTERNAL = re.compile(r"sqlite_session_(close|reaps|closes_retired|keeps_connections|closed_rejects|pop_item_skips|"
                             r"pop_item_returns_none|get_items_limit_skips|get_items_session_settings_limit_skips|"
                             r"file_lock|failed_|rollback|post_commit)|await_mutation")

PLUGIN = '''
"""Loaded with -p before the tests are collected: SQLiteSession becomes EventlogSession."""
import os
import tempfile

import agents
import agents.memory
import agents.memory.sqlite_session as sqlite_session

from eventlog.adapters.openai_agents import EventlogSession


class SessionUnderTest(EventlogSession):
    def __init__(self, session_id, db_path=":memory:", sessions_table="agent_sessions",
                 messages_table="agent_messages", session_settings=None):
        home = tempfile.mkdtemp(prefix="mem-") if str(db_path) == ":memory:" else str(db_path) + ".eventlog"
        super().__init__(session_id, home=home, session_settings=session_settings)


agents.SQLiteSession = SessionUnderTest
agents.memory.SQLiteSession = SessionUnderTest
sqlite_session.SQLiteSession = SessionUnderTest
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sdk_session_tests")
    ap.add_argument("--version", default=importlib.metadata.version("openai-agents"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="sdk-session-tests-")
    try:
        pip = [sys.executable, "-m", "pip", "-q"]
        subprocess.check_call(pip + ["download", "--no-deps", "--no-binary", ":all:", f"openai-agents=={args.version}",
                                     "-d", work])
        sdist = glob.glob(os.path.join(work, "openai_agents-*.tar.gz"))[0]
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        src = glob.glob(os.path.join(work, "openai_agents-*/"))[0]
        deps = os.path.join(work, "deps")
        subprocess.check_call(pip + ["install", "--no-deps", "--target", deps, "pytest-asyncio>=1,<2"])
        with open(os.path.join(deps, "eventlog_sdk_plugin.py"), "w") as f:
            f.write(PLUGIN)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([deps, ROOT]))
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "eventlog_sdk_plugin", "-p", "asyncio", *FILES,
                               "-q", "-rfE", "--tb=line", "--no-header", "-o", "addopts=", "-p", "no:cacheprovider"],
                              cwd=src, env=env, capture_output=True, text=True)
        print(done.stdout[-20000:])
        print(done.stderr[-3000:], file=sys.stderr)
        failed = re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", done.stdout, re.M)
        internal = [t for t in failed if SQLITE_INTERNAL.search(t)]
        generic = [t for t in failed if not SQLITE_INTERNAL.search(t)]
        passed = int((re.search(r"(\d+) passed", done.stdout) or [0, 0])[1])
        print(f"openai-agents {args.version} session tests against EventlogSession: {passed} passed, "
              f"{len(failed)} failed ({len(internal)} of them test SQLiteSession's internals)")
        for t in generic:
            print("  generic failure:", t)
        return 0 if not generic else 1
    finally:
        if args.keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
