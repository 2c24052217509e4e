"""The demo behind ``python3 run demo``: a realistic agent conversation written, read back, verified."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

DEMO_PROFILE = "demo"


def run_demo(home: Path, profile: str, echo: Callable[[str], None]) -> bool:
    """Write a demo session into ``profile`` under ``home``, read it back, verify the log.

    Returns True when everything checked out.
    """
    from eventlog.log import EventLog
    from eventlog.profiles import profile_dir

    d = profile_dir(home, profile)
    sid = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    turns = [
        {"role": "user", "content": "Find the flaky test in the payments service and fix it."},
        {"role": "assistant", "content": "Let me search the test suite for timing-dependent code.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "grep", "arguments": '{"pattern": "sleep(", "path": "tests/"}'}}]},
        {"role": "tool", "tool_name": "grep", "tool_call_id": "call_1",
         "content": "tests/test_refunds.py:88:    time.sleep(0.1)  # wait for the webhook"},
        {"role": "assistant", "content": "test_refunds waits a fixed 100 ms for a webhook; I replaced it with "
                                         "an explicit wait on the webhook event."},
    ]
    with EventLog.open(d / "log", profile=profile) as log:
        log.append([{"type": "session.created", "session": sid,
                     "data": {"source": "cli", "model": "demo-model", "title": f"Fix flaky payments test ({sid})"}}])
        for t in turns:
            log.append([{"type": "message.appended", "session": sid, "v": 2, "data": t}])
        back = list(log.read_session(sid))
        echo(f"profile {profile!r} at {d}")
        echo(f"session {sid}: {len(back)} events")
        for env in back[1:]:
            data = env["data"]
            echo(f"  [{env['seq']}] {data['role']:<9} {str(data.get('content'))[:70]}")
        res = log.verify()
        echo(f"log verify: {'ok' if res.ok else 'BROKEN'} ({res.events} events, head {res.head_seq})")
        return res.ok
