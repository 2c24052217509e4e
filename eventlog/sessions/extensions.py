"""Extension events: event types and read models an adapter or runtime adds to a profile.

An :class:`Extension` names a namespace, its event types (``"<namespace>.<name>"``, each with a
version, a validator and upcasters) and its read models (tables in state.db, built by the same
projector from the same log). Events of an extension are appended through
:meth:`eventlog.sessions.store.SessionStore.append_events` into the profile's one log and hash
chain; the session catalogue itself is described the same way (:data:`CATALOGUE`)::

    EXT = Extension("notes", event_types=[EventType("notes.added", validate=check_note)],
                    read_models=[ReadModel("notes", 1, ["CREATE TABLE notes_items (...)"], apply)])
    with SessionStore.open(extensions=[EXT]) as store:
        store.append_events([{"type": "notes.added", "session": sid, "data": {...}}])
        with store.read_model("notes") as conn:
            conn.execute("SELECT ... FROM notes_items")

A read model's ``apply(conn, envelope)`` is called for every event of the log in seq order
(upcast to the current version when the type is the extension's), inside the projector's
transaction; it must be a pure function of the events. Its tables are named ``<name>_...``,
carry their own cursor, and are dropped and rebuilt from the log when ``version`` changes:
two processes running two versions side by side (during an update) rebuild them back and forth,
and each ``store.read_model(...)`` block still reads one snapshot of its own version, with its
own appends (docs/ARCHITECTURE.md).
Processes that do not register an extension leave its tables alone; older programs skip event
types they do not know (the projections count them; ``doctor`` shows the count).
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from eventlog.errors import ValidationError
from eventlog.sessions import events as ev

Validator = Callable[[dict[str, Any]], dict[str, Any]]
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
Apply = Callable[[sqlite3.Connection, dict[str, Any]], None]

NAMESPACE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
RESERVED = frozenset({"session", "message", "messages", "usage", "reactions", "log", "test"})
"""Namespaces of the built-in catalogue and of the log itself: no extension may take them."""


@dataclass(frozen=True)
class EventType:
    """One event type: its name, the version this program writes, how its data is checked
    (``validate(data) -> normalised data``, raising :class:`ValidationError`), and how older
    versions' data is brought up to date (``upcasters[k]`` turns version k into k + 1)."""

    name: str
    version: int = 1
    validate: Validator | None = None
    upcasters: Mapping[int, Upcaster] = field(default_factory=dict)

    def check(self, data: Any, session: str | None) -> dict[str, Any]:
        """The normalised data of an event of this type, or :class:`ValidationError`."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValidationError("data", f"must be a JSON object, got {type(data).__name__}")
        if self.validate is None:
            return data
        out = self.validate(dict(data))
        if not isinstance(out, dict):
            raise ValidationError("data", f"the validator of {self.name} returned {type(out).__name__}, not an object")
        return out

    def upcast(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """``envelope`` with its data and ``v`` at :attr:`version` (as far as the upcasters go)."""
        version = envelope.get("v", 1)
        data = envelope.get("data")
        if version == self.version or not isinstance(version, int) or not isinstance(data, dict):
            return envelope
        out = dict(envelope)
        while version < self.version and version in self.upcasters:
            data = self.upcasters[version](dict(data))
            version += 1
        out["data"], out["v"] = data, version
        return out


class _CatalogueType(EventType):
    """A type of the built-in session catalogue: checked by :func:`eventlog.sessions.events.validate`."""

    def check(self, data: Any, session: str | None) -> dict[str, Any]:
        return ev.validate(self.name, data, session)

    def upcast(self, envelope: dict[str, Any]) -> dict[str, Any]:
        return ev.upcast(envelope)


@dataclass(frozen=True)
class ReadModel:
    """Tables in state.db derived from the log: ``ddl`` creates them (each named ``<name>_...``),
    ``apply(conn, envelope)`` folds one event into them. A new ``version`` drops and rebuilds."""

    name: str
    version: int
    ddl: Sequence[str]
    apply: Apply


@dataclass(frozen=True)
class Extension:
    """A namespace of event types and the read models built from them."""

    namespace: str
    event_types: Sequence[EventType] = ()
    read_models: Sequence[ReadModel] = ()

    def __post_init__(self) -> None:
        # The parts are checked here, where the definition is made: a ddl given as one string,
        # an apply or validator that is no function, failed later and far away (a TypeError
        # from the projector's thread, a read model broken character by character).
        for name, parts, kind in (("event_types", self.event_types, EventType),
                                  ("read_models", self.read_models, ReadModel)):
            if not isinstance(parts, (list, tuple)) or not all(isinstance(p, kind) for p in parts):
                raise ValidationError(name, f"must be a list of {kind.__name__} objects")
        for t in self.event_types:
            if t.validate is not None and not callable(t.validate):
                raise ValidationError("event_types", f"{t.name}: validate must be a function or None")
            if not isinstance(t.upcasters, Mapping) or not all(
                    type(k) is int and callable(f) for k, f in t.upcasters.items()):
                raise ValidationError("event_types", f"{t.name}: upcasters must map versions (integers) to functions")
        for rm in self.read_models:
            if not isinstance(rm.ddl, (list, tuple)) or not all(isinstance(d, str) for d in rm.ddl):
                raise ValidationError("read_models", f"{rm.name}: ddl must be a list of SQL statements (strings)")
            if not callable(rm.apply):
                raise ValidationError("read_models", f"{rm.name}: apply must be a function (conn, envelope)")
        if self.namespace is not None and self.namespace != CATALOGUE_NAMESPACE:
            if not isinstance(self.namespace, str) or not NAMESPACE_RE.fullmatch(self.namespace):
                raise ValidationError("namespace", "must be 1-32 characters of [a-z0-9_], starting with a letter")
            if self.namespace in RESERVED:
                raise ValidationError("namespace", f"{self.namespace!r} is reserved for eventlog's own events")
            for t in self.event_types:
                if not (isinstance(t.name, str) and t.name.startswith(self.namespace + ".")
                        and NAME_RE.fullmatch(t.name[len(self.namespace) + 1:])):
                    raise ValidationError("event_types", f"{t.name!r} must be '{self.namespace}.<name>' "
                                                         "with a name of [a-z0-9_]")
                if type(t.version) is not int or not 1 <= t.version <= 1000:
                    raise ValidationError("event_types", f"{t.name}: version must be an integer from 1 to 1000")
        for rm in self.read_models:
            if not isinstance(rm.name, str) or not NAMESPACE_RE.fullmatch(rm.name):
                raise ValidationError("read_models", f"{rm.name!r}: a read model's name is 1-32 characters of [a-z0-9_]")
            if type(rm.version) is not int or rm.version < 1:
                raise ValidationError("read_models", f"{rm.name}: version must be a positive integer")


CATALOGUE_NAMESPACE = "eventlog"
CATALOGUE = Extension(CATALOGUE_NAMESPACE,
                      event_types=[_CatalogueType(t, v) for t, v in ev.CURRENT_VERSIONS.items()])
"""The built-in session catalogue, described as an extension (its read model is state.db's own
tables, built by :mod:`projections.apply`)."""


class Registry:
    """The event types and read models one store knows: the catalogue plus its extensions."""

    def __init__(self, extensions: Iterable[Extension] = ()) -> None:
        self.types: dict[str, EventType] = {}
        self.read_models: dict[str, ReadModel] = {}
        self.extensions: dict[str, Extension] = {}
        self.add(CATALOGUE)
        for ext in extensions:
            self.add(ext)

    def add(self, ext: Extension) -> None:
        """Register ``ext`` (again, or an equal definition of it: a no-op; another extension of the
        same namespace: refused)."""
        if not isinstance(ext, Extension):
            raise ValidationError("extensions", f"must be Extension objects, got {type(ext).__name__}")
        known = self.extensions.get(ext.namespace)
        if known is ext or known == ext:
            # The same definition built again (a library that makes its Extension at each open:
            # the same types, versions, functions and read models) is the same extension; it was
            # refused as another one taking the namespace, from a second open in one process only.
            return
        if known is not None:
            raise ValidationError("extensions", f"another extension already uses the namespace {ext.namespace!r}")
        for rm in ext.read_models:
            if rm.name in self.read_models:
                raise ValidationError("extensions", f"another extension already has a read model {rm.name!r}")
        self.extensions[ext.namespace] = ext
        for t in ext.event_types:
            self.types[t.name] = t
        for rm in ext.read_models:
            self.read_models[rm.name] = rm

    def upcast(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """``envelope`` at its type's current version when the type is known; else unchanged."""
        name = envelope.get("type")
        t = self.types.get(name) if isinstance(name, str) else None
        return envelope if t is None else t.upcast(envelope)

    def event(self, raw: Any, index: int) -> dict[str, Any]:
        """One input event ``{"type", "session"?, "data", "id"?}`` checked against its registered
        type; returns it ready for the log (with ``v``). Field names are ``events[i].…``."""
        where = f"events[{index}]"
        if not isinstance(raw, dict):
            raise ValidationError(where, "an event must be an object")
        unknown = sorted(set(raw) - {"type", "session", "data", "id"})
        if unknown:
            raise ValidationError(f"{where}.{unknown[0]}", "not a field of an event (type, session, data, id)")
        name = raw.get("type")
        if name is None:
            raise ValidationError(f"{where}.type", "is required")
        t = self.types.get(name) if isinstance(name, str) else None
        if t is None:
            shown = name if isinstance(name, str) else type(name).__name__
            raise ValidationError(f"{where}.type", f"unknown event type {str(shown)[:64]!r}",
                                  hint="register the extension that defines it: SessionStore.open(extensions=[...])")
        session = raw.get("session")
        if session is not None or isinstance(t, _CatalogueType):
            session = ev.validate_session_id(session, f"{where}.session")
        try:
            data = t.check(raw.get("data"), session)
        except ValidationError as e:
            field_name = e.field[5:] if e.field.startswith("data.") else e.field
            raise ValidationError(f"{where}.data" + ("" if field_name == "data" else f".{field_name}"), e.problem,
                                  hint=e.hint) from None
        except Exception as e:
            # An extension's validator that fails on the data in its own way (a KeyError for a
            # missing key) refuses it: the caller hears which event, not a bare KeyError.
            raise ValidationError(f"{where}.data", f"refused by the validator of {name}: {type(e).__name__}: "
                                                   f"{str(e)[:200]}",
                                  hint="the validator raised instead of ValidationError; see the chained "
                                       "exception") from e
        out: dict[str, Any] = {"type": name, "session": session, "data": data, "v": t.version}
        if raw.get("id") is not None:
            out["id"] = ev.validate_session_id(raw["id"], f"{where}.id")
        return out

    def is_catalogue(self, name: str) -> bool:
        return isinstance(self.types.get(name), _CatalogueType)
