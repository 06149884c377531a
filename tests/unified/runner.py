"""A unified-test-format runner for the drivers' change-streams suite, driving unmodified pymongo.

Implements what shared/spec-tests/change-streams uses (schema 1.7): client/database/collection
entities with command monitoring, initialData, the CRUD/DDL/changeStream operations, testRunner
fail points, expectResult / expectError / expectEvents, and the $$exists, $$unsetOrMatches and
$$type operators. Spec: shared/spec-tests/unified-test-format/unified-test-format.md.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pymongo
from bson import Int64
from pymongo import WriteConcern, monitoring
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure, PyMongoError

SERVER_VERSION = (7, 0, 14)

_TYPES = {
    "double": float,
    "string": str,
    "object": dict,
    "array": list,
    "binData": bytes,
    "objectId": None,
    "bool": bool,
    "date": None,
    "null": type(None),
    "int": int,
    "long": Int64,
    "timestamp": None,
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")) + (0,) * (3 - len(text.split(".")))


def requirements_met(reqs: list[dict[str, Any]] | None, topology: str) -> bool:
    if not reqs:
        return True
    for req in reqs:
        ok = True
        if "minServerVersion" in req and _version(req["minServerVersion"]) > SERVER_VERSION:
            ok = False
        if "maxServerVersion" in req and _version(req["maxServerVersion"]) < SERVER_VERSION:
            ok = False
        if "topologies" in req and topology not in req["topologies"]:
            ok = False
        if req.get("serverless") == "require":
            ok = False
        if ok:
            return True
    return False


class Listener(monitoring.CommandListener):
    def __init__(self, observe: list[str], ignore: list[str]) -> None:
        self.observe, self.ignore = observe, set(ignore) | {"configureFailPoint", "killAllSessions"}
        self.events: list[tuple[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if (
            "commandStartedEvent" in self.observe
            and event.command_name not in self.ignore
            and event.command_name
            not in ("hello", "isMaster", "ismaster", "saslStart", "endSessions")
        ):
            self.events.append(("commandStartedEvent", event))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class Mismatch(AssertionError):
    pass


def match(expected: Any, actual: Any, path: str = "", root: bool = True) -> None:
    if isinstance(expected, dict) and len(expected) == 1 and next(iter(expected)).startswith("$$"):
        ((op, arg),) = expected.items()
        if op == "$$unsetOrMatches":
            return match(arg, actual, path, root)
        if op == "$$type":
            names = arg if isinstance(arg, list) else [arg]
            if not any(_is_type(actual, n) for n in names):
                raise Mismatch(f"{path}: {actual!r} is not of type {names}")
            return None
        if op == "$$exists":
            return None  # presence is checked by the parent document
        raise Mismatch(f"{path}: unsupported operator {op}")
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"{path}: expected a document, got {actual!r}")
        for key, value in expected.items():
            if isinstance(value, dict) and set(value) == {"$$exists"}:
                if (key in actual) != value["$$exists"]:
                    raise Mismatch(f"{path}.{key}: presence should be {value['$$exists']}")
                continue
            if isinstance(value, dict) and set(value) == {"$$unsetOrMatches"} and key not in actual:
                continue
            if key not in actual:
                raise Mismatch(f"{path}.{key}: missing in {actual!r}")
            match(value, actual[key], f"{path}.{key}", False)
        if not root:
            extra = set(actual) - set(expected)
            if extra:
                raise Mismatch(f"{path}: unexpected fields {sorted(extra)}")
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            raise Mismatch(f"{path}: expected {expected!r}, got {actual!r}")
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match(e, a, f"{path}[{i}]", False)
        return None
    if (
        isinstance(expected, (int, float))
        and not isinstance(expected, bool)
        and isinstance(actual, (int, float))
        and not isinstance(actual, bool)
    ):
        if expected != actual:
            raise Mismatch(f"{path}: {expected!r} != {actual!r}")
        return None
    if expected != actual:
        raise Mismatch(f"{path}: {expected!r} != {actual!r}")
    return None


def _is_type(value: Any, name: str) -> bool:
    import datetime

    from bson import ObjectId, Timestamp
    from bson.datetime_ms import DatetimeMS

    special = {
        "objectId": ObjectId,
        "timestamp": Timestamp,
        "date": (datetime.datetime, DatetimeMS),
    }
    if name in special:
        return isinstance(value, special[name])  # type: ignore[arg-type]
    if name == "int":
        return type(value) is int
    if name == "long":
        return isinstance(value, Int64)
    kind = _TYPES.get(name)
    return (
        kind is not None
        and isinstance(value, kind)
        and not (kind is int and isinstance(value, bool))
    )


class UnifiedTest:
    def __init__(self, uri: str, file: dict[str, Any], test: dict[str, Any]) -> None:
        self.uri = uri
        self.file = file
        self.test = test
        self.entities: dict[str, Any] = {}
        self.listeners: dict[str, Listener] = {}
        self.clients: list[pymongo.MongoClient[Any]] = []
        self.fail_point_clients: list[tuple[pymongo.MongoClient[Any], str]] = []

    def close(self) -> None:
        for c, name in self.fail_point_clients:
            with contextlib.suppress(PyMongoError):
                c.admin.command({"configureFailPoint": name, "mode": "off"})
        for entity in self.entities.values():
            if isinstance(entity, ChangeStream):
                with contextlib.suppress(PyMongoError):
                    entity.close()
        for c in self.clients:
            c.close()

    def run(self) -> None:
        try:
            self._create_entities(self.file.get("createEntities", []))
            self._initial_data(self.file.get("initialData", []))
            for op in self.test["operations"]:
                self._operation(op)
            for expected in self.test.get("expectEvents", []):
                self._check_events(expected)
        finally:
            self.close()

    # -- setup -------------------------------------------------------------------------------------

    def _create_entities(self, specs: list[dict[str, Any]]) -> None:
        for spec in specs:
            ((kind, conf),) = spec.items()
            if kind == "client":
                listener = Listener(
                    conf.get("observeEvents", []), conf.get("ignoreCommandMonitoringEvents", [])
                )
                c: pymongo.MongoClient[Any] = pymongo.MongoClient(
                    self.uri,
                    event_listeners=[listener],
                    serverSelectionTimeoutMS=5000,
                    heartbeatFrequencyMS=500,
                )
                self.clients.append(c)
                self.entities[conf["id"]] = c
                self.listeners[conf["id"]] = listener
            elif kind == "database":
                self.entities[conf["id"]] = self.entities[conf["client"]][conf["databaseName"]]
            elif kind == "collection":
                self.entities[conf["id"]] = self.entities[conf["database"]][conf["collectionName"]]
            else:
                raise NotImplementedError(f"entity {kind}")

    def _initial_data(self, data: list[dict[str, Any]]) -> None:
        if not data:
            return
        setup: pymongo.MongoClient[Any] = pymongo.MongoClient(
            self.uri, serverSelectionTimeoutMS=5000
        )
        try:
            for d in data:
                db = setup.get_database(d["databaseName"], write_concern=WriteConcern("majority"))
                db.drop_collection(d["collectionName"])
                db.create_collection(d["collectionName"])
                if d.get("documents"):
                    db[d["collectionName"]].insert_many(d["documents"])
        finally:
            setup.close()

    # -- operations --------------------------------------------------------------------------------

    def _operation(self, op: dict[str, Any]) -> None:
        name, args = op["name"], dict(op.get("arguments", {}))
        try:
            result = self._execute(name, op["object"], args)
        except (PyMongoError, Mismatch) as exc:
            if isinstance(exc, Mismatch):
                raise
            if "expectError" not in op:
                raise
            self._check_error(op["expectError"], exc)
            return
        if "expectError" in op:
            raise Mismatch(f"{name} should have failed with {op['expectError']}")
        if "expectResult" in op:
            match(op["expectResult"], result, name)
        if "saveResultAsEntity" in op:
            self.entities[op["saveResultAsEntity"]] = result

    def _execute(self, name: str, obj: str, args: dict[str, Any]) -> Any:
        if obj == "testRunner":
            if name == "failPoint":
                c = self.entities[args["client"]]
                fp = args["failPoint"]
                c.admin.command(fp)
                self.fail_point_clients.append((c, fp["configureFailPoint"]))
                return None
            raise NotImplementedError(f"testRunner.{name}")
        target = self.entities[obj]
        if name == "createChangeStream":
            opts = {
                "full_document": args.get("fullDocument"),
                "full_document_before_change": args.get("fullDocumentBeforeChange"),
                "resume_after": args.get("resumeAfter"),
                "start_after": args.get("startAfter"),
                "batch_size": args.get("batchSize"),
                "max_await_time_ms": args.get("maxAwaitTimeMS"),
                "show_expanded_events": args.get("showExpandedEvents"),
                "comment": args.get("comment"),
            }
            return target.watch(
                args.get("pipeline", []), **{k: v for k, v in opts.items() if v is not None}
            )
        if name in ("iterateUntilDocumentOrError", "iterateOnce"):
            deadline = time.monotonic() + 15
            while True:
                doc = target.try_next()
                if doc is not None or name == "iterateOnce":
                    return doc
                if time.monotonic() > deadline:
                    raise Mismatch("no change event arrived within 15 s")
        if name == "close":
            return target.close()
        if name == "insertOne":
            return {"insertedId": target.insert_one(args["document"]).inserted_id}
        if name == "insertMany":
            return {
                "insertedIds": dict(enumerate(target.insert_many(args["documents"]).inserted_ids))
            }
        if name in ("updateOne", "updateMany", "replaceOne"):
            fn = {
                "updateOne": target.update_one,
                "updateMany": target.update_many,
                "replaceOne": target.replace_one,
            }[name]
            r = fn(
                args["filter"],
                args.get("update", args.get("replacement")),
                upsert=args.get("upsert", False),
            )
            return {
                "matchedCount": r.matched_count,
                "modifiedCount": r.modified_count,
                "upsertedCount": 1 if r.upserted_id is not None else 0,
            }
        if name in ("deleteOne", "deleteMany"):
            r = (target.delete_one if name == "deleteOne" else target.delete_many)(args["filter"])
            return {"deletedCount": r.deleted_count}
        if name == "runCommand":
            return target.command(args["command"])
        if name == "dropCollection":
            return target.drop_collection(args["collection"])
        if name == "createCollection":
            extra = {k: args[k] for k in ("viewOn", "pipeline") if k in args}
            target.create_collection(args["collection"], **extra)
            return None
        if name == "createIndex":
            return target.create_index(list(args["keys"].items()), name=args.get("name"))
        if name == "dropIndex":
            return target.drop_index(args["name"])
        if name == "rename":
            return target.rename(args["to"], dropTarget=args.get("dropTarget", False))
        raise NotImplementedError(f"operation {name}")

    def _check_error(self, expected: dict[str, Any], exc: PyMongoError) -> None:
        is_client = not isinstance(exc, OperationFailure)
        if expected.get("isClientError") is not None and expected["isClientError"] != is_client:
            raise Mismatch(f"expected isClientError={expected['isClientError']}, got {exc!r}")
        code = getattr(exc, "code", None)
        if "errorCode" in expected and code != expected["errorCode"]:
            raise Mismatch(f"expected errorCode {expected['errorCode']}, got {code} ({exc})")
        details = getattr(exc, "details", None) or {}
        if "errorCodeName" in expected and details.get("codeName") != expected["errorCodeName"]:
            raise Mismatch(f"expected {expected['errorCodeName']}, got {details.get('codeName')}")
        for label in expected.get("errorLabelsContain", []):
            if not exc.has_error_label(label):
                raise Mismatch(f"missing error label {label}")
        for label in expected.get("errorLabelsOmit", []):
            if exc.has_error_label(label):
                raise Mismatch(f"unexpected error label {label}")

    def _check_events(self, expected: dict[str, Any]) -> None:
        listener = self.listeners[expected["client"]]
        actual = listener.events
        wanted = expected["events"]
        if expected.get("ignoreExtraEvents"):
            actual = actual[: len(wanted)]
        if len(actual) != len(wanted):
            raise Mismatch(
                f"expected {len(wanted)} events, got {[e.command_name for _, e in actual]}"
            )
        for (kind, event), want in zip(actual, wanted, strict=True):
            ((want_kind, fields),) = want.items()
            if kind != want_kind:
                raise Mismatch(f"expected {want_kind}, got {kind}")
            if "commandName" in fields and event.command_name != fields["commandName"]:
                raise Mismatch(
                    f"expected command {fields['commandName']}, got {event.command_name}"
                )
            if "databaseName" in fields and event.database_name != fields["databaseName"]:
                raise Mismatch(
                    f"expected database {fields['databaseName']}, got {event.database_name}"
                )
            if "command" in fields:
                match(fields["command"], dict(event.command), "command")
