"""Native change streams on mongos (the baseline the proxy is measured against): not built yet."""

from __future__ import annotations

from typing import Any

from mongoformats.errors import MongoError


async def open_native_stream(mongos: Any, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
    raise MongoError("NotImplemented", "simcluster does not serve $changeStream yet")
