"""How what crosses Redis is written: JSON, by ``json`` or msgspec (:func:`use_json_codec`), and
jobs as arq records (:func:`encode`, :func:`decode`, :func:`job_record`).

Both ends serialize with :func:`dumps` / :func:`loads`, arq's records included (its data-only
serializer). Nothing read from Redis is ever unpickled, so write access to Redis is not code
execution. Jobs are frozen dataclasses (shared/contracts/jobs.py, crons.py, webhooks.py): one
:func:`encode` turns any of them into the dict arq carries, one :func:`decode` turns it back,
and the worker's entry points decode through worker/entry.py.

arq is imported by the two functions that write and read its records, not here: the contracts
are imported by the API's reader processes too, which need none of arq (nor the Redis client it
imports: ~8 MB a reader, bench figure 16).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def _json_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_default).encode()


def _msgspec_dumps(obj: Any) -> bytes:
    try:
        return _ENCODER.encode(obj)
    except (TypeError, ValueError, OverflowError):
        # What msgspec refuses (dict keys that are not str or numbers), json's rules settle;
        # an object neither can encode raises json's TypeError, as before.
        return _json_dumps(obj)


def _msgspec_loads(raw: bytes | str) -> Any:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        # NaN and Infinity, which json accepts; json raises for what is not JSON at all.
        return json.loads(raw)


def _default(obj: Any) -> Any:
    if isinstance(obj, BaseException):
        # arq stores a failed job's exception as its result; keep it as text.
        return f"{type(obj).__name__}: {obj}"
    if isinstance(obj, enum.Enum):
        return obj.value
    raise TypeError(f"cannot serialize {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_default)
_DECODER = msgspec.json.Decoder()
_CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes | str], Any]]] = {
    "json": (_json_dumps, json.loads),
    "msgspec": (_msgspec_dumps, _msgspec_loads),
}
_codec = "json"
_dumps, _loads = _CODECS[_codec]


def use_json_codec(name: str) -> None:
    """Encode and decode with ``json`` or ``msgspec`` from now on, in this process (JSON_CODEC).

    msgspec's output parses the same as json's: compact, UTF-8, the same strings and
    numbers (floats may be spelled differently, ``1e16`` for ``1e+16``) and
    big integers kept exact both ways. One difference: NaN and Infinity, which json writes
    as bare ``NaN`` (no JSON parser of a browser takes it), become ``null``.
    """
    global _codec, _dumps, _loads
    _dumps, _loads = _CODECS[name]
    _codec = name


def json_codec() -> str:
    return _codec


def dumps(obj: Any) -> bytes:
    return _dumps(obj)


def loads(raw: bytes | str) -> Any:
    return _loads(raw)


# --- jobs and their payloads -------------------------------------------------------


class PayloadError(ValueError):
    """A payload read from Redis is not the struct it should be (the message says what is wrong)."""


def encode(struct: Any) -> dict[str, Any]:
    """A job (or a :class:`~shared.contracts.jobs.Decision`) as the plain dict arq's data-only
    serializer writes: enums as their values, and the fields still at their defaults left out,
    so a job written without a newer field looks as jobs did before it (and an older worker,
    which defaults what is missing, reads it)."""
    data: dict[str, Any] = msgspec.to_builtins(struct)
    for field in dataclasses.fields(struct):
        if field.default is not dataclasses.MISSING and getattr(struct, field.name) == field.default:
            del data[field.name]
    return data


def decode(kind: type[T], payload: Any) -> T:
    """The ``kind`` struct ``payload`` (a dict :func:`encode` wrote) describes. Fields it lacks
    take their defaults, fields it has that ``kind`` does not know are ignored (a job written by
    a newer API); a payload that cannot be ``kind`` is a :class:`PayloadError` naming the field."""
    try:
        return msgspec.convert(payload, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"not a {kind.__name__}: {exc}") from None


def job_record(function: str, job: Any, enqueued_at: float) -> bytes:
    """arq's record of a job calling ``function`` with ``job`` (its one argument), as arq's
    ``enqueue_job`` would write it with our serializer."""
    from arq.jobs import serialize_job

    return serialize_job(function, (encode(job),), {}, None, int(enqueued_at * 1000), serializer=dumps)


def job_of_record(kind: type[T], record: bytes) -> T:
    """The job of an arq record :func:`job_record` wrote; :class:`PayloadError` if it is not one."""
    from arq.jobs import deserialize_job

    try:
        args = deserialize_job(record, deserializer=loads).args
    except Exception as exc:  # arq's DeserializationError, or a record that is not arq's
        raise PayloadError(f"not an arq job record: {exc}") from None
    if len(args) != 1:
        raise PayloadError(f"not a {kind.__name__} job: {len(args)} arguments")
    return decode(kind, args[0])
