"""Command fields checked as the server's IDL parsers check them, with their errors.

The server parses each command with a generated IDL parser: a missing required field fails with
IDLFailedToParse (40414) "BSON field '<cmd>.<field>' is missing but a required field" (a null
counts as missing), a value of the wrong BSON type with TypeMismatch (14) "BSON field
'<path>' is the wrong type '<type>', expected type '<type>'" (or, for several accepted types,
"expected types '[long, int, decimal, double']", the server's own quoting). Drivers and tests
assert those codes, so the simulator and the proxy answer malformed cursor commands alike.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from mongoformats.errors import MongoError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_BSON_DEPTH",
    "SAFE_INT64",
    "GetMore",
    "check_depth",
    "check_lsid",
    "get_more_request",
    "kill_cursors_ids",
    "safe_long",
    "type_name",
    "wrong_type",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The types of IDL's safeInt64 (batchSize, maxTimeMS), in the order its errors list them.
SAFE_INT64 = ("long", "int", "decimal", "double")

_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "bool"),
    (Int64, "long"),
    (int, "int"),
    (float, "double"),
    (str, "string"),
    (Decimal128, "decimal"),
    ((bytes, Binary), "binData"),
    (ObjectId, "objectId"),
    ((datetime.datetime, DatetimeMS), "date"),
    (type(None), "null"),
    (Regex, "regex"),
    (Code, "javascript"),
    (Timestamp, "timestamp"),
    (MinKey, "minKey"),
    (MaxKey, "maxKey"),
    (list, "array"),
)


def type_name(value: Any) -> str:
    """The BSON type alias of a decoded value, as the server names it in errors ($type aliases)."""
    for types, name in _NAMES:  # bool before int and Int64 before int: subclasses first
        if isinstance(value, types):
            return name
    return "object"


def wrong_type(path: str, value: Any, *expected: str) -> MongoError:
    if len(expected) == 1:
        return MongoError(
            "TypeMismatch",
            f"BSON field '{path}' is the wrong type '{type_name(value)}', "
            f"expected type '{expected[0]}'",
        )
    return MongoError(
        "TypeMismatch",
        f"BSON field '{path}' is the wrong type '{type_name(value)}', "
        f"expected types '[{', '.join(expected)}']",
    )


# The server validates every command's BSON to this nesting depth (BSONDepth's
# kDefaultMaxAllowableDepth, the maxBSONDepth parameter; src/mongo/bson/bson_depth.h) and fails
# a deeper one with Overflow (15) "BSONObj exceeds maximum nested object depth"
# (src/mongo/bson/bson_validate.cpp). Checking it first bounds every recursive walk after it.
MAX_BSON_DEPTH = 200


def check_depth(doc: Any) -> None:
    """Overflow (15) for a decoded command nested deeper than MAX_BSON_DEPTH; iterative, so that
    a deep document cannot exhaust the stack of the check itself."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        for child in _children(value):
            if isinstance(child, (dict, list)):
                if depth >= MAX_BSON_DEPTH:
                    raise MongoError("Overflow", "BSONObj exceeds maximum nested object depth")
                stack.append((child, depth + 1))


def _children(value: Any) -> Any:
    """A document's values, an array's elements, nothing for a scalar."""
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, list) else ()


def check_lsid(cmd: Mapping[str, Any]) -> None:
    """The session id a command names (`lsid: {id: <UUID>}`), as the server's
    OperationSessionInfo parser types it: an object whose `id` is binData."""
    lsid = cmd.get("lsid")
    if lsid is None:
        return
    if not isinstance(lsid, dict):
        raise wrong_type("OperationSessionInfo.lsid", lsid, "object")
    if "id" not in lsid:
        raise _missing("LogicalSessionId.id")
    if not _is_session_uuid(lsid["id"]):
        raise wrong_type("LogicalSessionId.id", lsid["id"], "binData")


def _is_session_uuid(ident: object) -> bool:
    """A session id's `id`: a UUID, or 16 bytes of binData."""
    return isinstance(ident, uuid.UUID) or (isinstance(ident, (bytes, Binary)) and len(ident) == 16)


def _missing(path: str) -> MongoError:
    return MongoError("IDLFailedToParse", f"BSON field '{path}' is missing but a required field")


def _optional_number(cmd: dict[str, Any], command: str, field: str) -> int | None:
    """An optional safeInt64 field (batchSize, maxTimeMS), or None when absent or null."""
    value = cmd.get(field)
    if value is None:
        return None
    if type_name(value) not in SAFE_INT64:
        raise wrong_type(f"{command}.{field}", value, *SAFE_INT64)
    return safe_long(value)


def safe_long(value: Any) -> int:
    """A number as the server's safeNumberLong reads it: NaN is 0, a value past the int64 range
    is its nearest bound; within it a double is cut toward zero and a Decimal128 rounded half to
    even (Decimal128::toLong's default rounding)."""
    if isinstance(value, int):
        return value
    number = value.to_decimal() if isinstance(value, Decimal128) else value
    if _is_nan(number):
        return 0
    if number > INT64_MAX:  # +infinity too
        return INT64_MAX
    if number < INT64_MIN:
        return INT64_MIN
    if isinstance(number, decimal.Decimal):
        return int(number.to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    return int(number)


def _is_nan(number: float | decimal.Decimal) -> bool:
    return number.is_nan() if isinstance(number, decimal.Decimal) else math.isnan(number)


class GetMore(NamedTuple):
    cursor_id: int
    collection: str
    batch_size: int | None
    max_time_ms: int | None


def get_more_request(cmd: dict[str, Any]) -> GetMore:
    """A getMore's fields: the cursor id (a long), collection (a string), batchSize and
    maxTimeMS."""
    cid, coll = cmd["getMore"], cmd.get("collection")
    if not isinstance(cid, Int64):
        raise wrong_type("getMore.getMore", cid, "long")
    if coll is None:
        raise _missing("getMore.collection")
    if not isinstance(coll, str):
        raise wrong_type("getMore.collection", coll, "string")
    return GetMore(
        int(cid),
        coll,
        _optional_number(cmd, "getMore", "batchSize"),
        _optional_number(cmd, "getMore", "maxTimeMS"),
    )


def kill_cursors_ids(cmd: dict[str, Any]) -> list[int]:
    """A killCursors' cursor ids (an array of longs)."""
    ids = cmd.get("cursors")
    if ids is None:
        raise _missing("killCursors.cursors")
    if not isinstance(ids, list):
        raise wrong_type("killCursors.cursors", ids, "array")
    for i, cid in enumerate(ids):
        if not isinstance(cid, Int64):
            raise wrong_type(f"killCursors.cursors.{i}", cid, "long")
    return [int(cid) for cid in ids]
