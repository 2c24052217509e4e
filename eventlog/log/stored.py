"""How a log stores one event: format 2, a compact header and compressed data.

The hash chain does not change with the storage format: it covers the canonical bytes of the
envelope (:mod:`eventlog.log.codec`), and every read gives those bytes back exactly, so
``verify``, exports and imports see the same events whatever the format. Format 1 (the first
release) stores the canonical bytes themselves; format 2 stores::

    offset  size  field
    0       1     kind: 0x02 an event (a value starting with '{' is a format-1 event)
    1       32    hash (raw sha256)
    33      32    prev (raw sha256)
    65      8     ts (unsigned, big-endian nanoseconds)
    73      2     v
    75      1+n   type (length byte, ASCII)
    ..      1+n   session (length byte, ASCII; 0xFF for null)
    ..      1+n   id (length byte, ASCII; 0 for a 32-hex-digit id stored as its 16 raw bytes)
    ..      1     data codec: 0 raw canonical JSON, 1 zstd, 2 zstd with a dictionary
    ..      2     dictionary id (codec 2), else 0
    ..      rest  the data's canonical JSON bytes, compressed as the codec says

Types, sessions and ids are ASCII by the envelope's rules, at most 128 characters. The seq is
the key and is not repeated. Compression uses zstd with a dictionary trained on the log's own
events (:class:`Compression`): agent messages are small and alike, so a dictionary triples
what plain zstd gets on its own; it is loaded only when a compressed event is read or written.
"""
from __future__ import annotations

import struct
import threading
from typing import Any, Callable

import orjson

from eventlog.log import codec

FORMAT_1 = b"1"
FORMAT_2 = b"2"
KIND_EVENT = 2
KIND_ERASED = 3
"""An erased event: the same header, no data (see :func:`eventlog.log.codec.stub`)."""
CODEC_RAW, CODEC_ZSTD, CODEC_ZSTD_DICT = 0, 1, 2
COMPRESS_MIN_BYTES = 96
"""Data shorter than this is stored raw: the frame header would eat what compression saves."""
ZSTD_LEVEL = 3
DICT_BYTES = 64 * 1024
POOL_MAX = 8
"""Free (de)compressors kept per dictionary: about the threads that append or read at once."""
_FIXED = struct.Struct(">B32s32sQH")
_TAIL = struct.Struct(">BH")
_NULL = 0xFF


class StoredFormatError(ValueError):
    """A stored value that is not a well-formed event of its format."""


class Compression:
    """The zstd codecs of one log: its dictionaries by id and the one new events use.

    Thread-safe: a zstd (de)compressor serves one call at a time, taken from a pool of the log
    (not kept per thread: frameworks run their writes on short-lived threads, and a fresh zstd
    context costs more than compressing one event).
    """

    def __init__(self, load_dict: Callable[[int], bytes | None]) -> None:
        self._load_dict = load_dict
        self._dicts: dict[int, Any] = {}
        self.current: int = 0
        self._pools: dict[tuple[str, int], list[Any]] = {}
        self._lock = threading.Lock()
        self._epoch = 0  # moved when a known id takes other bytes: a codec taken before is not given back

    def knows(self, dict_id: int) -> bool:
        return dict_id in self._dicts

    def know(self, dict_id: int, raw: bytes) -> None:
        """Keep dictionary ``dict_id`` (bytes ``raw``) for reading, without making it the one new
        events use. Dictionaries are kept for the life of the log handle: a value read before a
        compaction retired its dictionary is still decoded after it (ids are never given twice)."""
        self._dict(dict_id, raw)

    def use(self, dict_id: int, raw: bytes) -> None:
        """Make dictionary ``dict_id`` (bytes ``raw``) known and the one new events use."""
        self._dict(dict_id, raw)
        self.current = dict_id

    def _dict(self, dict_id: int, raw: bytes | None = None) -> Any:
        found = self._dicts.get(dict_id)
        if found is not None and (raw is None or found.as_bytes() == raw):
            return found
        if raw is None:
            raw = self._load_dict(dict_id)
            if raw is None:
                raise StoredFormatError(f"compression dictionary {dict_id} is missing from the log")
        import zstandard

        with self._lock:
            made = zstandard.ZstdCompressionDict(raw)
            made.precompute_compress(level=ZSTD_LEVEL)
            if found is not None:  # other bytes under a known id (an earlier release's reuse): theirs now
                self._dicts[dict_id] = made
                self._epoch += 1
                self._pools = {}
            self._dicts.setdefault(dict_id, made)
        return self._dicts[dict_id]

    def _take(self, kind: str, key: int) -> Any:
        """A free (de)compressor for dictionary ``key`` (0: none), made when none is free."""
        free = self._pools.get((kind, key))
        if free:
            try:
                return free.pop()  # atomic: two threads never get the same one
            except IndexError:
                pass
        import zstandard

        if kind == "d":
            return zstandard.ZstdDecompressor(dict_data=self._dict(key)) if key else zstandard.ZstdDecompressor()
        if key:
            return zstandard.ZstdCompressor(level=ZSTD_LEVEL, dict_data=self._dict(key), write_content_size=True,
                                            write_checksum=False, write_dict_id=False)
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_dict_id=False)

    def _give(self, kind: str, key: int, codec_obj: Any, epoch: int) -> None:
        if epoch != self._epoch:
            return  # made with bytes that an id no longer names
        free = self._pools.setdefault((kind, key), [])
        if len(free) < POOL_MAX:
            free.append(codec_obj)

    def compress(self, data: bytes) -> tuple[int, int, bytes]:
        """``(codec, dict id, payload)`` for canonical data bytes."""
        if len(data) < COMPRESS_MIN_BYTES:
            return CODEC_RAW, 0, data
        dict_id, epoch = self.current, self._epoch
        c = self._take("c", dict_id)
        payload = c.compress(data)
        self._give("c", dict_id, c, epoch)
        if len(payload) >= len(data):
            return CODEC_RAW, 0, data
        return (CODEC_ZSTD_DICT if dict_id else CODEC_ZSTD), dict_id, payload

    def decompress(self, codec_id: int, dict_id: int, payload: bytes) -> bytes:
        if codec_id == CODEC_RAW:
            return payload
        if codec_id not in (CODEC_ZSTD, CODEC_ZSTD_DICT):
            raise StoredFormatError(f"unknown data codec {codec_id}")
        import zstandard

        key = dict_id if codec_id == CODEC_ZSTD_DICT else 0
        epoch = self._epoch
        d = self._take("d", key)
        try:
            # A damaged frame header can declare any size: refuse one no event can have before
            # zstd allocates it (a flipped bit there once made a build die of MemoryError).
            if len(payload) > 4 and payload[4] & 0x10:
                # The frame header's unused bit: zstd ignores it, and every encoder writes 0.
                raise StoredFormatError("compressed data's frame header has its unused bit set")
            declared = zstandard.frame_content_size(payload)
            if declared < 0 or declared > codec.MAX_EVENT_BYTES:
                raise StoredFormatError(f"compressed data declares {declared} bytes")
            out: bytes = d.decompress(payload)
        except (zstandard.ZstdError, MemoryError) as e:
            raise StoredFormatError(f"compressed data does not decompress ({e})") from None
        self._give("d", key, d, epoch)  # one that failed is dropped: its state is not worth trusting
        return out


def train(datas: list[bytes]) -> bytes | None:
    """A zstd dictionary trained on event data ``datas`` (canonical JSON bytes; those shorter
    than :data:`COMPRESS_MIN_BYTES` are left out), or None when there is too little to learn
    from or zstd cannot train on it."""
    import zstandard

    samples: list[bytes | bytearray | memoryview] = [d for d in datas if len(d) >= COMPRESS_MIN_BYTES]
    if len(samples) < 64 or sum(map(len, samples)) < 2 * DICT_BYTES:
        return None
    try:
        trained: bytes = zstandard.train_dictionary(DICT_BYTES, samples, level=ZSTD_LEVEL).as_bytes()
    except zstandard.ZstdError:
        return None
    return trained


def pack(p: codec.Prepared, ts: int, prev: str, digest: str, compression: Compression) -> bytes:
    """The format-2 value of prepared event ``p`` sealed with ``ts``, ``prev`` and ``digest``."""
    codec_id, dict_id, payload = compression.compress(p.data_bytes)
    return pack_parts(p.type, p.v, p.session, p.id, ts, prev, digest, codec_id, dict_id, payload)


def pack_parts(etype: str, v: int, session: str | None, eid: str, ts: int, prev: str, digest: str,
               codec_id: int, dict_id: int, payload: bytes) -> bytes:
    t = etype.encode("ascii")
    s = b"\xff" if session is None else bytes((len(session),)) + session.encode("ascii")
    i = b"\x00" + bytes.fromhex(eid) if codec.HEX32.fullmatch(eid) else bytes((len(eid),)) + eid.encode("ascii")
    return b"".join((_FIXED.pack(KIND_EVENT, bytes.fromhex(digest), bytes.fromhex(prev), ts, v),
                     bytes((len(t),)), t, s, i, _TAIL.pack(codec_id, dict_id), payload))


def pack_envelope(env: dict[str, Any], compression: Compression) -> bytes:
    """The format-2 value of a verified envelope (an import of sealed events)."""
    codec_id, dict_id, payload = compression.compress(codec.canonical(env["data"]))
    return pack_parts(env["type"], env["v"], env["session"], env["id"], env["ts"], env["prev"], env["hash"],
                      codec_id, dict_id, payload)


class _Parts:
    __slots__ = ("digest", "prev", "ts", "v", "type", "session", "id", "data")

    def __init__(self, digest: str, prev: str, ts: int, v: int, etype: str, session: str | None, eid: str,
                 data: bytes | None) -> None:
        self.digest, self.prev, self.ts, self.v = digest, prev, ts, v
        self.type, self.session, self.id, self.data = etype, session, eid, data


def pack_stub(env: dict[str, Any]) -> bytes:
    """The format-2 value of an erased event (its header, no data)."""
    return _pack_header(KIND_ERASED, env)


def _pack_header(kind: int, env: dict[str, Any]) -> bytes:
    eid, session, etype = env["id"], env["session"], env["type"]
    t = etype.encode("ascii")
    s = b"\xff" if session is None else bytes((len(session),)) + session.encode("ascii")
    i = b"\x00" + bytes.fromhex(eid) if codec.HEX32.fullmatch(eid) else bytes((len(eid),)) + eid.encode("ascii")
    return b"".join((_FIXED.pack(kind, bytes.fromhex(env["hash"]), bytes.fromhex(env["prev"]), env["ts"], env["v"]),
                     bytes((len(t),)), t, s, i))


def _unpack(value: bytes, compression: Compression) -> _Parts:
    try:
        kind, digest, prev, ts, v = _FIXED.unpack_from(value, 0)
        if kind not in (KIND_EVENT, KIND_ERASED):
            raise StoredFormatError(f"unknown stored kind {kind}")
        at = _FIXED.size
        n = value[at]
        etype = value[at + 1:at + 1 + n].decode("ascii")
        at += 1 + n
        n = value[at]
        if n == _NULL:
            session, at = None, at + 1
        else:
            session, at = value[at + 1:at + 1 + n].decode("ascii"), at + 1 + n
        n = value[at]
        if n == 0:
            eid, at = value[at + 1:at + 17].hex(), at + 17
        else:
            eid, at = value[at + 1:at + 1 + n].decode("ascii"), at + 1 + n
        if kind == KIND_ERASED:
            if at != len(value):
                raise StoredFormatError("an erased event carries data")
            return _Parts(digest.hex(), prev.hex(), ts, v, etype, session, eid, None)
        codec_id, dict_id = _TAIL.unpack_from(value, at)
        if (dict_id != 0) != (codec_id == CODEC_ZSTD_DICT):
            # Every writer stores 0 without a dictionary and an id with one: any other pair is a
            # changed byte, which a decoder ignoring the field would let pass unseen by verify.
            raise StoredFormatError(f"dictionary id {dict_id} does not go with data codec {codec_id}")
        data = compression.decompress(codec_id, dict_id, bytes(value[at + _TAIL.size:]))
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise StoredFormatError(f"stored event is truncated or malformed ({e})") from None
    return _Parts(digest.hex(), prev.hex(), ts, v, etype, session, eid, data)


def _format1_text(value: bytes, key: str) -> str | None:
    """Text field ``key`` of a format-1 value (canonical JSON), or None."""
    try:
        found = codec.decode(value).get(key)
    except ValueError:
        return None
    return found if isinstance(found, str) else None


def id_of(value: bytes) -> str | None:
    """The id of the event stored as ``value`` (either format), without decompressing its data;
    None when the value does not say."""
    if value[:1] == b"{":
        return _format1_text(value, "id")
    if value[:1] not in (_EVENT_KIND, _ERASED_KIND):
        return None
    try:
        at = _id_at(value)
        n = value[at]
        return value[at + 1:at + 17].hex() if n == 0 else value[at + 1:at + 1 + n].decode("ascii")
    except (IndexError, UnicodeDecodeError):
        return None


def _id_at(value: bytes) -> int:
    """Where the id's length byte sits in a format-2 value (past the fixed part, type and session)."""
    at = _FIXED.size
    at += 1 + value[at]  # past the type
    return at + (1 if value[at] == _NULL else 1 + value[at])  # past the session


def tail_at(value: bytes) -> int:
    """Where the data codec byte sits in a format-2 event (past the header and its id)."""
    at = _id_at(value)
    return at + (17 if value[at] == 0 else 1 + value[at])


def recoded(value: bytes, old: Compression, new: Compression, retired: set[int]) -> bytes | None:
    """``value`` with its data compressed again by ``new`` when it was compressed with one of the
    ``retired`` dictionaries (read by ``old``); None when it was not. The header — hash, prev and
    everything the chain covers — is kept byte for byte: only how the data is stored changes."""
    if value[:1] != _EVENT_KIND:
        return None
    try:
        at = tail_at(value)
        codec_id, dict_id = _TAIL.unpack_from(value, at)
    except (struct.error, IndexError) as e:
        raise StoredFormatError(f"stored event is truncated or malformed ({e})") from None
    if codec_id != CODEC_ZSTD_DICT or dict_id not in retired:
        return None
    data = old.decompress(codec_id, dict_id, bytes(value[at + _TAIL.size:]))
    c, d, payload = new.compress(data)
    return bytes(value[:at]) + _TAIL.pack(c, d) + payload


def pack_sealed(seq: int, env: dict[str, Any], raw: bytes, compression: Compression) -> bytes:
    """The value to store for a sealed event (an import, a migration) in a format-2 log: its
    format-2 form when that gives back exactly its canonical bytes ``raw``, else ``raw`` itself
    (a format-2 log reads first-format values too). An envelope format 2 cannot hold as it is —
    an extra key, a ts or version out of the header's range, a non-ASCII type — keeps its
    bytes, and so its hash, rather than being stored as something else."""
    try:
        value = pack_stub(env) if codec.is_stub(env) else pack_envelope(env, compression)
        if canonical_bytes(seq, value, compression) == bytes(raw):
            return value
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, struct.error, UnicodeError,
            StoredFormatError):
        pass
    return bytes(raw)


def canonical_bytes(seq: int, value: bytes, compression: Compression) -> bytes:
    """The canonical envelope bytes of the event stored as ``value`` at ``seq`` (either format).

    Raises :class:`StoredFormatError` when a format-2 value cannot be decoded.
    """
    if value[:1] == b"{":
        return value
    p = _unpack(value, compression)
    if p.data is None:
        return codec.canonical(_stub_env(seq, p))
    return _canonical_parts(seq, p, p.data, b',"hash":"' + p.digest.encode() + b'","id":')


def _canonical_parts(seq: int, p: _Parts, data: bytes, after_data: bytes) -> bytes:
    """Canonical envelope bytes from stored parts: ``after_data`` is what follows the data,
    up to the id's value (the hash field and ``,"id":``, or ``,"id":`` alone for the hashed body)."""
    dumps = orjson.dumps
    return b"".join((b'{"data":', data, after_data, dumps(p.id), b',"prev":"', p.prev.encode(), b'","seq":',
                     str(seq).encode(), b',"session":', dumps(p.session), b',"ts":', str(p.ts).encode(), b',"type":',
                     dumps(p.type), b',"v":', str(p.v).encode(), b"}"))


_EVENT_KIND = bytes((KIND_EVENT,))
_ERASED_KIND = bytes((KIND_ERASED,))
_SORT = orjson.OPT_SORT_KEYS


def checked_envelope(seq: int, value: bytes, prev: str, compression: Compression
                     ) -> tuple[dict[str, Any] | None, str | None] | None:
    """The envelope of the format-2 event stored as ``value`` at ``seq``, checked as event
    ``seq`` chained after ``prev``: ``(envelope, None)``, or ``(None, reason)`` when it fails.
    None when ``value`` is not a format-2 event (a format-1 value or an erased stub: the
    caller checks its canonical bytes with :func:`eventlog.log.damage.check_event`).

    The same judgement as ``check_event`` on the canonical bytes, reached without building
    and decoding them: the header fields are canonical by construction (integers, ASCII
    strings), so the bytes are canonical exactly when the data is; the hash is recomputed over
    the canonical body without the hash field, built from the parts.
    """
    if value[:1] != _EVENT_KIND:
        return None
    try:
        p = _unpack(value, compression)
    except StoredFormatError as e:
        return None, f"stored bytes are not an event ({e})"
    if p.prev != prev:
        return None, "prev does not match the hash of the previous event"
    raw = p.data
    assert raw is not None  # KIND_EVENT
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return None, f"stored bytes are not a JSON object ({e})"
    try:
        if not codec.same_canonical(orjson.dumps(data, option=_SORT), raw):
            return None, "stored bytes are not the canonical encoding of the event"
    except orjson.JSONEncodeError as e:
        return None, f"event does not re-encode ({e})"
    body = _canonical_parts(seq, p, raw, b',"id":')
    if codec._sha256(bytes.fromhex(prev) + body).hexdigest() != p.digest:
        return None, "hash does not match the event's bytes"
    return {"data": data, "hash": p.digest, "id": p.id, "prev": p.prev, "seq": seq, "session": p.session,
            "ts": p.ts, "type": p.type, "v": p.v}, None


def hash_of(value: bytes) -> str | None:
    """The hash an event stored as ``value`` records (either format), without decoding its data;
    None when the value does not say."""
    if value[:1] == b"{":
        return _format1_text(value, "hash")
    if len(value) < 33 or value[0] not in (KIND_EVENT, KIND_ERASED):
        return None
    return bytes(value[1:33]).hex()


def envelope(seq: int, value: bytes, compression: Compression) -> dict[str, Any]:
    """The envelope of the event stored as ``value`` at ``seq`` (either format), without
    building its canonical bytes first. Raises ``ValueError`` when it cannot be decoded."""
    if value[:1] == b"{":
        return codec.decode(value)
    p = _unpack(value, compression)
    if p.data is None:
        return _stub_env(seq, p)
    data = orjson.loads(p.data)
    return {"data": data, "hash": p.digest, "id": p.id, "prev": p.prev, "seq": seq, "session": p.session,
            "ts": p.ts, "type": p.type, "v": p.v}


def _stub_env(seq: int, p: _Parts) -> dict[str, Any]:
    return {"erased": True, "hash": p.digest, "id": p.id, "prev": p.prev, "seq": seq, "session": p.session,
            "ts": p.ts, "type": p.type, "v": p.v}


def is_stub_value(value: bytes) -> bool:
    """True when ``value`` stores an erased event (either format)."""
    if value[:1] == b"{":
        return value.startswith(b'{"erased":true,')
    return value[:1] == bytes((KIND_ERASED,))
