"""One SessionStore per (home, profile, extensions) for every adapter object of a process.

An application that keeps a thousand ``EventlogSession`` objects (one per conversation) must
not open a thousand stores: each would start its own projector and follower. Adapter objects
take a reference here and give it back on close; the store closes with its last reference.
This registry is deliberately tiny and private to the adapters: once ``SessionStore.open``
itself is cheap and shareable, :func:`acquire` becomes a plain open.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Sequence

from eventlog.profiles import DEFAULT_PROFILE, resolve_home
from eventlog.sessions.store import SessionStore

_Key = tuple[str, str, tuple[str, ...], int]
_lock = threading.Lock()
_open: dict[_Key, list[Any]] = {}  # key -> [store, references]


def _key(home: str | os.PathLike[str] | None, profile: str, extensions: Sequence[Any]) -> _Key:
    names = tuple(sorted(getattr(e, "namespace", repr(e)) for e in extensions))
    # The pid keeps a forked child from reusing its parent's environment (LMDB forbids it).
    return (str(resolve_home(home)), profile, names, os.getpid())


def acquire(home: str | os.PathLike[str] | None = None, profile: str = DEFAULT_PROFILE,
            extensions: Sequence[Any] = ()) -> SessionStore:
    """The shared store of ``(home, profile, extensions)``, opened on first use; one more reference."""
    key = _key(home, profile, extensions)
    with _lock:
        entry = _open.get(key)
        if entry is None:
            store = _open_store(Path(key[0]), profile, extensions)
            entry = _open[key] = [store, 0]
        entry[1] += 1
        return entry[0]  # type: ignore[no-any-return]


def _open_store(home: Path, profile: str, extensions: Sequence[Any]) -> SessionStore:
    if extensions and _has_extension_api():
        return SessionStore.open(home, profile, extensions=list(extensions))
    store = SessionStore.open(home, profile)
    if extensions:
        from eventlog.adapters import _standin

        _standin.attach(store, extensions)
    return store


def _has_extension_api() -> bool:
    return hasattr(SessionStore, "append_events")


def release(store: SessionStore) -> None:
    """Give back one reference; the store closes when it was the last one."""
    with _lock:
        for key, entry in list(_open.items()):
            if entry[0] is store:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _open[key]
                break
        else:
            return
    if not _has_extension_api():
        from eventlog.adapters import _standin

        _standin.detach(store)
    store.close()


def append_events(store: SessionStore, events: list[dict[str, Any]], expected_version: int | None = None) -> list[int]:
    """``store.append_events`` (extension events into the profile's log)."""
    if _has_extension_api():
        return store.append_events(events, expected_version=expected_version)  # type: ignore[attr-defined,no-any-return]
    from eventlog.adapters import _standin

    return _standin.append_events(store, events, expected_version)


def read_model(store: SessionStore, name: str) -> Any:
    """``store.read_model(name)``: a context manager yielding a connection caught up to this store's writes."""
    if _has_extension_api():
        return store.read_model(name)  # type: ignore[attr-defined]
    from eventlog.adapters import _standin

    return _standin.read_model(store, name)


def references(store: SessionStore) -> int:
    """How many adapter objects hold ``store`` (0 once it is closed); for tests."""
    with _lock:
        return next((entry[1] for entry in _open.values() if entry[0] is store), 0)
