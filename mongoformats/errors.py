"""One exception tree for the whole project, keyed by MongoDB error code.

Strategy: every failure that can reach a client is a `MongoError` carrying the server's numeric
code, its codeName (from the generated table of error_codes.yml), an errmsg and optional error
labels. `to_reply()` renders the exact `{ok: 0, errmsg, code, codeName, errorLabels?}` document a
server would send, so the simulator, the proxy and the engine all answer errors the same way.
Codec failures are a separate branch (`ProtocolError`): they close a connection instead of
answering a command.
"""

from __future__ import annotations

from typing import Any

from mongoformats._error_codes import CODE_BY_NAME, ERROR_CODES

__all__ = [
    "MongoError",
    "ProtocolError",
    "code_name",
    "code_of",
    "has_category",
    "is_resumable_change_stream_error",
    "with_change_stream_label",
    "RESUMABLE_LABEL",
]

RESUMABLE_LABEL = "ResumableChangeStreamError"


def code_name(code: int) -> str:
    """The server's codeName for `code`; unknown codes get the server's own fallback form."""
    entry = ERROR_CODES.get(code)
    return entry[0] if entry else f"Location{code}"


def code_of(name: str) -> int:
    """The numeric code of a codeName (KeyError for an unknown name: a typo must not pass)."""
    return CODE_BY_NAME[name]


def has_category(code: int, category: str) -> bool:
    entry = ERROR_CODES.get(code)
    return bool(entry and category in entry[1])


class ProtocolError(Exception):
    """A malformed or oversized wire message. The connection that sent it is closed."""


class ConnectionLost(Exception):
    """A connection to a server was closed, could not be made, or got no answer in time: its
    transport failed, where a MongoError is the server's own answer. Whoever opens connections
    raises it (or a subclass), and whoever reads over them catches it without knowing who opened
    them (the engine over the proxy's connections)."""


class MongoError(Exception):
    """A command error with a MongoDB code: raised anywhere, rendered once at the boundary."""

    def __init__(
        self, code: int | str, errmsg: str, *, labels: tuple[str, ...] = (), **extra: Any
    ) -> None:
        self.code = code_of(code) if isinstance(code, str) else code
        self.code_name = code_name(self.code)
        self.errmsg = errmsg
        self.labels = tuple(labels)
        # Extra reply fields the server adds for some codes (keyPattern/keyValue for 11000, ...).
        self.extra = extra
        super().__init__(f"{self.code_name} ({self.code}): {errmsg}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields (Exception would pass its formatted message as the only
        # argument): a worker process's error reaches the proxy as it was raised there.
        return _rebuilt, (self.code, self.errmsg, self.labels, self.extra)

    def has_label(self, label: str) -> bool:
        return label in self.labels

    def with_labels(self, *labels: str) -> MongoError:
        merged = self.labels + tuple(lb for lb in labels if lb not in self.labels)
        return MongoError(self.code, self.errmsg, labels=merged, **self.extra)

    def copied(self) -> MongoError:
        """The same error as a new object, with no traceback and no chained errors: what a
        long-lived holder keeps (a failed stream or bucket, until its cursors close) and raises
        at each read. The original's traceback keeps the frames it was raised through, and
        their locals (a shard's batch and its share of the memory budget); and each raise of one
        kept object adds the frames it passes to its traceback."""
        return MongoError(self.code, self.errmsg, labels=self.labels, **self.extra)

    def to_reply(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "ok": 0.0,
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": self.code_name,
        }
        reply.update(self.extra)
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> MongoError:
        """Rebuild the error a server answered, keeping its code, message, labels and extra
        fields."""
        extra = {
            k: v
            for k, v in reply.items()
            if k
            not in (
                "ok",
                "errmsg",
                "code",
                "codeName",
                "errorLabels",
                "$clusterTime",
                "operationTime",
            )
        }
        return cls(
            int(reply.get("code", 8)),
            str(reply.get("errmsg", "")),
            labels=tuple(reply.get("errorLabels", ())),
            **extra,
        )


def _rebuilt(code: int, errmsg: str, labels: tuple[str, ...], extra: dict[str, Any]) -> MongoError:
    return MongoError(code, errmsg, labels=labels, **extra)


def is_resumable_change_stream_error(code: int) -> bool:
    """Whether a server attaches `ResumableChangeStreamError` to a change-stream getMore failing
    with `code`.

    The server's rule (ErrorLabelBuilder::isResumableChangeStreamError, 4.4+): retriable or network
    errors, NeedRetargetting errors, RetryChangeStream and FailedToSatisfyReadPreference; never the
    NonResumableChangeStreamError codes.
    """
    if has_category(code, "NonResumableChangeStreamError"):
        return False
    return (
        has_category(code, "RetriableError")
        or has_category(code, "NetworkError")
        or has_category(code, "NeedRetargettingError")
        or code in (code_of("RetryChangeStream"), code_of("FailedToSatisfyReadPreference"))
    )


def with_change_stream_label(exc: MongoError) -> MongoError:
    """`exc` as a server answers it when a change stream's aggregate or getMore fails: with
    ResumableChangeStreamError or NonResumableChangeStreamError by its code (error_labels.cpp)."""
    if is_resumable_change_stream_error(exc.code):
        return exc.with_labels(RESUMABLE_LABEL)
    if has_category(exc.code, "NonResumableChangeStreamError"):
        return exc.with_labels("NonResumableChangeStreamError")
    return exc
