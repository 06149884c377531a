"""The commands every simulated process answers the same way, mongod or mongos: the handshake
(hello), authentication (SCRAM-SHA-256), build and server information, parameters, sessions,
getMore and killCursors."""

from __future__ import annotations

import contextlib
import datetime
import uuid
from typing import Any, TypeGuard

import trio
from bson import Binary, Int64, ObjectId

from mongoformats.errors import MongoError
from mongoformats.idl import get_more_request, kill_cursors_ids
from mongoformats.privileges import allows, privileges_of_roles
from mongoformats.scram import MECHANISM, ScramCredential, ScramServer
from mongoformats.sessions import SessionsNamed, sessions_named, user_identity
from simcluster.cursors import CursorManager


class Request:
    """What a handler may want beyond the command: the connection it came on."""

    def __init__(self, conn_id: int, peer: str) -> None:
        self.conn_id = conn_id
        self.peer = peer
        self.user: str | None = None  # authenticated as (SCRAM), when auth is on
        # Open SASL conversations: (conversation, skipEmptyExchange, proof checked).
        self.conversations: dict[int, tuple[ScramServer, bool, bool]] = {}


class GenericCommands:
    """Handlers for CommandServer's generic commands; the state they read is CommandServer's."""

    process_kind: str
    runtime_parameters: dict[str, str]
    host: str
    port: int
    version: str
    max_wire_version: int
    cursors: CursorManager
    process_id: ObjectId
    fail_points: dict[str, dict[str, Any]]
    users: dict[str, ScramCredential] | None
    user_roles: dict[str, list[tuple[str, str]]]
    topology_counter: int
    _topology_changed: trio.Event

    @property
    def address(self) -> str:
        # As the server's HostAndPort writes one: an IPv6 address in brackets.
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def roles_of(self, user: str) -> list[tuple[str, str]]:
        return self.user_roles.get(user, [("root", "admin")])

    async def cmd_configure_fail_point(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        name = cmd["configureFailPoint"]
        mode = cmd.get("mode", "off")
        if mode == "off":
            self.fail_points.pop(name, None)
        else:
            self.fail_points[name] = {
                "mode": dict(mode) if isinstance(mode, dict) else mode,
                "data": cmd.get("data", {}),
            }
        return {"count": 0}

    def hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def cmd_hello(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        await self._await_topology_change(cmd)
        out: dict[str, Any] = {}
        if cmd.get("helloOk"):
            out["helloOk"] = True
        out.update(self.hello_fields(cmd))
        if next(iter(cmd)).lower() == "ismaster":  # the legacy spelling
            out = _legacy_hello(out)
        out.update(self._limits(req))
        out.update(self._negotiated(cmd))
        speculative = cmd.get("speculativeAuthenticate")
        if self.users is not None and _is_sasl_start(speculative):
            await self._speculative_authentication(speculative, req, out)
        return out

    async def _await_topology_change(self, cmd: dict[str, Any]) -> None:
        """Awaitable hello: answer when the topology changes, or after maxAwaitTimeMS."""
        _check_awaitable_hello(cmd)
        if self._is_current(cmd.get("topologyVersion")):
            with trio.move_on_after(cmd["maxAwaitTimeMS"] / 1000):
                await self._topology_changed.wait()

    def _is_current(self, tv: dict[str, object] | None) -> bool:
        """Whether the client's topologyVersion is this server's current one."""
        return (
            tv is not None
            and tv.get("processId") == self.process_id
            and tv.get("counter") == self.topology_counter
        )

    def _limits(self, req: Request) -> dict[str, Any]:
        """What every hello reply states: the topology version, sizes, wire versions."""
        return {
            "topologyVersion": {
                "processId": self.process_id,
                "counter": Int64(self.topology_counter),
            },
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "maxMessageSizeBytes": 48_000_000,
            "maxWriteBatchSize": 100_000,
            "localTime": datetime.datetime.now(datetime.UTC),
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": req.conn_id,
            "minWireVersion": 0,
            "maxWireVersion": self.max_wire_version,
            "readOnly": False,
        }

    def _negotiated(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The compressors both sides know, and the user's login mechanisms when asked."""
        out: dict[str, Any] = {}
        supported = [c for c in cmd.get("compression", ()) if c in ("zlib", "snappy", "zstd")]
        if supported:
            out["compression"] = supported
        if self._is_known_user(cmd.get("saslSupportedMechs")):
            out["saslSupportedMechs"] = [MECHANISM]
        return out

    def _is_known_user(self, name: object) -> bool:
        """Whether `name` ("<db>.<user>") is a user here, which saslSupportedMechs answers for."""
        return (
            self.users is not None
            and isinstance(name, str)
            and name.partition(".")[2] in self.users
        )

    async def _speculative_authentication(
        self, speculative: dict[str, Any], req: Request, out: dict[str, Any]
    ) -> None:
        """The handshake's first login step (speculative authentication, as drivers send it):
        answered as saslStart on the `db` it names; a failure omits the answer, and the driver
        then logs in the ordinary way."""
        start = {k: v for k, v in speculative.items() if k != "db"}
        with contextlib.suppress(MongoError):
            out["speculativeAuthenticate"] = await self.cmd_sasl_start(
                str(speculative.get("db", "")), start, req
            )

    async def cmd_ok(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {}

    async def cmd_not_found(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        raise MongoError("CommandNotFound", f"no such command: '{next(iter(cmd))}'")

    async def cmd_ping(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {}

    async def cmd_whatsmyuri(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {"you": req.peer}

    async def cmd_connection_status(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        users = [{"user": req.user, "db": "admin"}] if req.user else []
        granted = self.roles_of(req.user) if req.user else []
        info: dict[str, Any] = {
            "authenticatedUsers": users,
            "authenticatedUserRoles": [{"role": r, "db": d} for r, d in granted],
        }
        if cmd.get("showPrivileges"):
            info["authenticatedUserPrivileges"] = privileges_of_roles(granted)
        return {"authInfo": info}

    async def cmd_sasl_start(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if cmd.get("mechanism") != MECHANISM:
            raise MongoError(
                "MechanismUnavailable",
                f"Received authentication for mechanism {cmd.get('mechanism')} "
                "which is unknown or not enabled",
            )
        if self.users is None or db != "admin":
            raise MongoError("AuthenticationFailed", "Authentication failed.")
        # Several conversations may be open on one connection here, each finishing on its own. A
        # server keeps one (authentication_session.cpp: a new saslStart abandons the open one):
        # simcluster is the more lenient upstream, which a proxy must be safe against as well.
        conversation = ScramServer(self.users)
        payload = conversation.first(bytes(cmd["payload"]))
        cid = max(req.conversations, default=0) + 1  # ids of open conversations stay unique
        skip = bool((cmd.get("options") or {}).get("skipEmptyExchange"))
        req.conversations[cid] = (conversation, skip, False)
        return {"conversationId": cid, "done": False, "payload": Binary(payload, 0)}

    async def cmd_sasl_continue(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        cid = cmd.get("conversationId")
        if cid not in req.conversations:
            raise MongoError("ProtocolError", "No SASL session state found")
        conversation, skip, proved = req.conversations[cid]
        payload = bytes(cmd.get("payload", b""))
        if proved:  # the empty last step of a conversation without skipEmptyExchange
            del req.conversations[cid]
            return {"conversationId": cid, "done": True, "payload": Binary(b"", 0)}
        if not payload:  # a client-final message is due: nothing proves who the client is
            del req.conversations[cid]
            raise MongoError("AuthenticationFailed", "Authentication failed.")
        try:
            final = conversation.final(payload)
        except MongoError:
            del req.conversations[cid]
            raise
        req.user = conversation.user
        if skip:
            del req.conversations[cid]
        else:
            req.conversations[cid] = (conversation, skip, True)
        return {"conversationId": cid, "done": skip, "payload": Binary(final, 0)}

    async def cmd_logout(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        req.user = None
        return {}

    @property
    def full_version(self) -> str:
        """The release this process reports (buildInfo's `version`) for its feature version."""
        return {"7.0": "7.0.14", "8.0": "8.0.4", "6.0": "6.0.19", "5.0": "5.0.30"}[self.version]

    async def cmd_build_info(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        full = self.full_version
        parts = [int(p) for p in full.split(".")] + [0]
        return {
            "version": full,
            "gitVersion": "simcluster",
            "modules": [],
            "allocator": "system",
            "javascriptEngine": "none",
            "sysInfo": "deprecated",
            "versionArray": parts,
            "bits": 64,
            "debug": False,
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "storageEngines": ["wiredTiger"],
            "openssl": {"running": "disabled"},
        }

    async def cmd_get_parameter(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        # enableTestCommands: simcluster always serves the test commands (configureFailPoint, ...),
        # as a server started with it does; drivers' test harnesses read it.
        params = {
            "featureCompatibilityVersion": {"version": self.version},
            "enableTestCommands": True,
            "changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": "off"}},
            **{name: getattr(self, attr) for name, attr in self.runtime_parameters.items()},
        }
        if cmd.get("getParameter") == "*":
            return dict(params)
        return {k: v for k, v in params.items() if k in cmd}

    async def cmd_set_parameter(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "setParameter may only be run against the admin database."
            )
        out = {}
        for key, value in cmd.items():
            if key in ("setParameter", "lsid", "$clusterTime", "$readPreference", "comment"):
                continue
            attr = self._runtime_parameter(key, value)
            out["was"] = getattr(self, attr)
            setattr(self, attr, value)
        return out

    def _runtime_parameter(self, key: str, value: Any) -> str:
        """The attribute holding a settable parameter, if `value` is valid for it."""
        attr = self.runtime_parameters.get(key)
        if attr is None:
            raise MongoError("InvalidOptions", f"attempted to set unrecognized parameter [{key}]")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise MongoError(
                "BadValue",
                f"Invalid value for parameter {key}: {value!r} is not a positive number",
            )
        return attr

    async def cmd_start_session(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {"id": {"id": Binary(uuid.uuid4().bytes, 4)}, "timeoutMinutes": 30}

    async def cmd_server_status(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "host": self.address,
            "version": self.version,
            "process": self.process_kind,
            "uptime": 1.0,
            "connections": {"current": 0, "available": 1000},
            "metrics": {
                "cursor": {
                    "open": {"total": Int64(len(self.cursors))},
                    "timedOut": Int64(self.cursors.timed_out),
                }
            },
        }

    async def cmd_cmdline(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {"argv": [self.process_kind], "parsed": {}}

    async def cmd_host_info(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "system": {"hostname": self.host, "numCores": 2},
            "os": {"type": "Linux"},
            "extra": {},
        }

    async def cmd_get_log(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return (
            {"totalLinesWritten": 0, "log": []}
            if cmd["getLog"] != "*"
            else {"names": ["global", "startupWarnings"]}
        )

    async def cmd_get_more(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        more = get_more_request(cmd)
        fail = None
        fp = self.fail_points.get("failGetMoreAfterCursorCheckout")
        if fp and self._fail_point_fires(fp):
            fail = MongoError(
                int(fp["data"].get("errorCode", 1)),
                "Failing command via 'failGetMoreAfterCursorCheckout' failpoint",
            )
        cursor = await self.cursors.get_more(
            more.cursor_id, f"{db}.{more.collection}", more.batch_size, more.max_time_ms, fail
        )
        return {"cursor": cursor}

    def _fail_point_fires(self, fp: dict[str, Any]) -> bool:
        mode = fp["mode"]
        if isinstance(mode, dict):
            if mode.get("times", 0) <= 0:
                return False
            mode["times"] -= 1
            return True
        return mode == "alwaysOn"

    async def cmd_kill_sessions(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """killSessions [{id}] / killAllSessions [{user, db}] / killAllSessionsByPattern [pattern]
        (mongoformats.sessions.sessions_named)."""
        caller = (
            user_identity(req.user, "admin") if req.user else None
        )  # simcluster's users are admin's
        kill_any = req.user is not None and allows(
            privileges_of_roles(self.roles_of(req.user)), ("killAnySession",), {"cluster": True}
        )
        self.kill_sessions(
            sessions_named(cmd, caller, access_control=self.users is not None, kill_any=kill_any)
        )
        return {}

    def kill_sessions(self, named: SessionsNamed) -> None:
        """What ends with the named sessions: here their cursors (a getMore running on one fails
        with CursorKilled); a shard and mongos end their transactions too."""
        self.cursors.kill_sessions(
            lambda c: named(c.lsid, user_identity(c.user, "admin") if c.user else c.user)
        )

    async def cmd_kill_cursors(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        killed: list[Int64] = []
        missing: list[Int64] = []
        for cid in kill_cursors_ids(cmd):
            (killed if self.cursors.kill(cid) else missing).append(Int64(cid))
        return {
            "cursorsKilled": killed,
            "cursorsNotFound": missing,
            "cursorsAlive": [],
            "cursorsUnknown": [],
        }


def _legacy_hello(out: dict[str, object]) -> dict[str, object]:
    """isMaster's reply names isWritablePrimary ismaster, in its place."""
    return {("ismaster" if k == "isWritablePrimary" else k): v for k, v in out.items()}


def _is_sasl_start(speculative: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(speculative, dict) and "saslStart" in speculative


def _check_awaitable_hello(cmd: dict[str, object]) -> None:
    """An awaitable hello gives topologyVersion and maxAwaitTimeMS together."""
    if ("topologyVersion" in cmd) != ("maxAwaitTimeMS" in cmd):
        raise MongoError(
            51760 if "topologyVersion" in cmd else 51758,
            "topologyVersion and maxAwaitTimeMS must be given together",
        )
