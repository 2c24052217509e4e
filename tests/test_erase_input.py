"""What an erase takes as its audit record's ``by``: checked as ``reason`` is (a non-empty text
of at most 1,024 characters, or None for the OS user). It was stored as given: a number or a
list in the audit record, an empty or a five-kilobyte name, and a megabyte name made the erase
fail as "too large" naming an internal field (outside audit, helper-52)."""
from __future__ import annotations

from pathlib import Path

import pytest

from eventlog.errors import ValidationError
from eventlog.sessions.store import SessionStore


@pytest.mark.parametrize("by", [7, ["ops"], "", "   ", "x" * 1025, "x" * (20 << 20)])
def test_an_erase_refuses_a_by_that_is_no_short_text_and_appends_nothing(tmp_path: Path, by: object) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_message(sid, "user", "words")
        head = store.log.head()[0]
        with pytest.raises(ValidationError) as refused:
            store.erase_session(sid, "asked", by=by)  # type: ignore[arg-type]
        assert refused.value.field == "by"
        with pytest.raises(ValidationError) as refused:
            store.retention(0.0, by=by)  # type: ignore[arg-type]
        assert refused.value.field == "by"
        assert store.log.head()[0] == head and store.get_messages(sid)[0]["content"] == "words"


def test_an_erase_records_the_by_it_was_given_or_the_os_user(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        a, b = store.create_session(source="cli"), store.create_session(source="cli")
        named = store.erase_session(a, "asked", by="x" * 1024)
        anyone = store.erase_session(b, "asked")
        assert store.log.get(named["seq"])["data"]["by"] == "x" * 1024  # type: ignore[index]
        assert isinstance(store.log.get(anyone["seq"])["data"]["by"], str)  # type: ignore[index]
