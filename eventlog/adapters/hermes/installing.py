"""Make an installed Hermes Agent use eventlog's ``SessionDB``.

``install()`` replaces ``hermes_state.SessionDB`` with :class:`eventlog.adapters.hermes.SessionDB`
— in ``hermes_state`` and in every already-imported module that bound the name — so every
``SessionDB(...)`` Hermes creates from then on is eventlog-backed. Call it before Hermes opens
its database (first thing in a launcher or ``sitecustomize``); ``python -m eventlog.adapters.hermes``
does it and then runs the ``hermes`` command. The original class stays reachable as
``hermes_state.HermesSessionDB`` (the one-time import of an existing ``state.db`` runs Hermes'
own migrations with it).
"""
from __future__ import annotations

import sys
from typing import Any

ORIGINAL = "HermesSessionDB"
HERMES_MISSING_HINT = "install it in this environment (pip install 'hermes-agent==0.19.0')"


def install() -> type:
    """Swap the class in (idempotent); returns eventlog's ``SessionDB``. Needs Hermes Agent
    installed (``ModuleNotFoundError`` saying so otherwise)."""
    try:
        import hermes_state
    except ModuleNotFoundError as e:
        if e.name != "hermes_state":
            raise
        raise ModuleNotFoundError(f"install() swaps eventlog's SessionDB into Hermes Agent, which is not installed "
                                  f"here: {HERMES_MISSING_HINT}", name="hermes_state") from e

    from eventlog.adapters.hermes.db import SessionDB

    _install_repair(hermes_state)
    current = hermes_state.SessionDB
    if current is SessionDB:
        return SessionDB
    if not hasattr(hermes_state, ORIGINAL):
        setattr(hermes_state, ORIGINAL, current)
    _rebind(hermes_state, "SessionDB", current, SessionDB)
    return SessionDB


def _rebind(hermes_state: Any, name: str, old: Any, new: Any) -> None:
    """Put ``new`` in place of ``old`` as ``hermes_state.<name>`` and in every loaded module that
    imported it by name (``from hermes_state import <name>``)."""
    setattr(hermes_state, name, new)
    for module in list(sys.modules.values()):
        try:
            if module is not hermes_state and getattr(module, name, None) is old:
                setattr(module, name, new)
        except Exception:  # a module with an odd __getattr__ is none of our business
            continue


def _install_repair(hermes_state: Any) -> None:
    """Replace Hermes' ``repair_state_db_schema`` (``hermes sessions repair``, ``hermes doctor
    --fix``) with one that, on an eventlog-backed ``db_path``, rebuilds the projection from the
    log. Hermes' own ran its schema surgery on the projection file behind the log's back, and
    before it copied the file into the Hermes home as ``state.db.malformed-backup-<time>`` -- a
    copy of sessions no later delete erases -- then said the repair had failed and to keep both
    files, where the log holds the data (operator audit, helper-75). Other paths get Hermes'."""
    original = getattr(hermes_state, "repair_state_db_schema", None)
    if original is None or getattr(original, "_eventlog", False):
        return

    def repair_state_db_schema(db_path: Any, *, backup: bool = True) -> dict[str, Any]:
        from eventlog.adapters.hermes.engine import Engine
        from eventlog.adapters.hermes.projection import Layout

        layout = Layout(db_path)
        damaged = layout.current()
        if damaged is None:
            return dict(original(db_path, backup=backup))
        report: dict[str, Any] = {"repaired": False, "strategy": "rebuilt_from_eventlog_log", "backup_path": None,
                                  "error": None}
        try:
            engine = Engine.acquire(db_path)
            try:
                if layout.current() == damaged:  # (the open rebuilt a file it could not use)
                    engine.rebuild()
            finally:
                engine.release()
        except Exception as e:  # reported as Hermes reports a failed repair
            report["error"] = f"{type(e).__name__}: {e}"
            return report
        report["repaired"] = True
        return report

    repair_state_db_schema._eventlog = True  # type: ignore[attr-defined]
    repair_state_db_schema.__doc__ = original.__doc__
    _rebind(hermes_state, "repair_state_db_schema", original, repair_state_db_schema)


def original_session_db() -> Any:
    """Hermes' own ``SessionDB`` class, or None when Hermes is not importable. If the module's
    class was replaced without keeping the original, a private copy of ``hermes_state`` is
    loaded to get it."""
    try:
        import hermes_state
    except ImportError:
        return None
    from eventlog.adapters.hermes.db import SessionDB

    cls = getattr(hermes_state, ORIGINAL, None) or hermes_state.SessionDB
    if isinstance(cls, type) and not issubclass(cls, SessionDB):
        return cls
    import importlib.util

    spec = importlib.util.spec_from_file_location("_eventlog_hermes_state_copy", hermes_state.__file__)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SessionDB
