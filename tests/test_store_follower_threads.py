"""Handles of one profile opened and closed from many threads: the handles that asked for a
follower share one, counted on the profile's core. A close drops its count outside the open
lock, so an open in another thread can meet it; the count and the follower's start or stop
must change together."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from eventlog.sessions.store import SessionStore


def _projector_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "eventlog-projector")


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Threads switch as often as CPython lets them: a race window of a few bytecodes is met."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_handles_opened_and_closed_from_threads_keep_one_follower_for_those_that_asked(
        tmp_path: Path, busy_switching: None) -> None:
    """Four threads open and close stores of one profile (each asking for a follower) while a
    store that asked for none keeps the profile open. Each close that took the count to 0
    stopped the follower while another thread's open started it: a close raised RuntimeError
    ('cannot join thread before it is started'), leaving the store half closed, or a follower
    thread was left running that no handle counted and none would stop."""
    for _ in range(10):
        with SessionStore.open(tmp_path, "p", durability="nosync", follower=False) as keeper:
            core = keeper._core
            errors: list[BaseException] = []

            def churn() -> None:
                try:
                    for _ in range(30):
                        SessionStore.open(tmp_path, "p", durability="nosync").close()
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=churn) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert (core.followers, core.projector.following, _projector_threads()) == (0, False, 0)
            with SessionStore.open(tmp_path, "p", durability="nosync"):
                assert (core.followers, core.projector.following, _projector_threads()) == (1, True, 1)
        assert _projector_threads() == 0


def test_an_open_during_the_stop_of_the_follower_gets_one(tmp_path: Path) -> None:
    """The close of the last store with a follower stops it (joining its thread, which may be
    inside a step); an open in another thread meanwhile found the thread still alive and
    started none: its store went on with the count at 1 and no follower."""
    keeper = SessionStore.open(tmp_path, "p", durability="nosync", follower=False)
    a = SessionStore.open(tmp_path, "p", durability="nosync")
    core = keeper._core
    follower = core.projector._follower
    inside, leave = threading.Event(), threading.Event()
    step = follower._step

    def slow_step() -> Any:
        inside.set()
        leave.wait(30)  # a step that takes its time: the stop joins it
        return step()

    follower._step = slow_step
    assert inside.wait(30)
    closing = threading.Thread(target=a.close)
    closing.start()
    deadline = time.monotonic() + 30
    while not follower._stop.is_set() and time.monotonic() < deadline:  # the close is inside the stop
        time.sleep(0.001)
    follower._step = step
    got: dict[str, Any] = {}
    opening = threading.Thread(target=lambda: got.setdefault("b", SessionStore.open(tmp_path, "p",
                                                                                    durability="nosync")))
    opening.start()
    opening.join(2)  # locked, the open waits for the stop; unlocked, it is done by now, without a follower
    leave.set()
    closing.join(30)
    opening.join(30)
    with got["b"], keeper:
        assert (core.followers, core.projector.following, _projector_threads()) == (1, True, 1)
    assert _projector_threads() == 0
