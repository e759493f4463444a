"""The agent's view of its own NodeSLO: its key in the KOORD_SLO bucket, kept across outages and restarts.

`SloSource.refresh()` reads only this node's key (one direct read; nothing else in the bucket is touched). A value
that decodes becomes the spec in effect and is saved atomically to `<state_dir>/nodeslo.json`; at start that file
is loaded, so an agent restarted while NATS is down applies its last good settings, not the defaults. A key that
does not decode, or holds a spec with a bad type or an out-of-range value, keeps the previous spec whole (no
partial application) and is counted. A deleted key (the node left the
cluster, then came back before the slo service re-rendered it) means the defaults. `silent_for(now)` is how long
the bucket has not been readable: the fail-safe's input. The QoS loops refresh it every round that is due; with the
loops off, `refresh_forever` keeps it current for the metrics half, which measures its host applications.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import msgspec

from agent.slo import spec_problems
from agent.state_file import save_json
from bus import streams, subjects
from bus.api import Delivery
from bus.errors import BusError
from schemas.qos import NODE_SLO_DECODER

log = logging.getLogger(__name__)

CACHE_FILE = "nodeslo.json"


class KeyReader(Protocol):
    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None: ...


class SloSource:
    def __init__(self, reader: KeyReader, node: str, *, state_dir: str, now: float) -> None:
        self._reader = reader
        self._node = node
        self._cache = os.path.join(state_dir, CACHE_FILE) if state_dir else ""
        self.spec: dict[str, Any] | None = None
        """The NodeSLO spec in effect; None: none received (the agent's defaults apply)."""
        self.revision = 0
        self.last_contact = now
        """When the bucket was last readable (start-up counts: the fail-safe waits a full period first)."""
        self.unreadable = 0
        self.rejected_revision = 0
        """The last revision refused as malformed (not read again)."""
        self.read_failures = 0
        self._load_cache()

    def silent_for(self, now: float) -> float:
        return max(now - self.last_contact, 0.0)

    async def refresh(self, now: float) -> bool:
        """Read the key; True when the spec in effect changed."""
        try:
            # a direct get: the one read of the bucket an agent's NATS user is allowed (its own key)
            stored = await self._reader.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(self._node), direct=True)
        except (BusError, TimeoutError, OSError) as e:
            self.read_failures += 1
            log.debug("node %s: NodeSLO not readable (%s); keeping revision %d", self._node, e, self.revision)
            return False
        self.last_contact = now
        if stored is None or stored.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return self._take(None, stored.stream_seq if stored is not None else 0)
        if stored.stream_seq in (self.revision, self.rejected_revision):
            return False
        try:
            spec = NODE_SLO_DECODER.decode(stored.data).spec
        except msgspec.DecodeError as e:
            problems = [str(e)]
        else:
            problems = spec_problems(spec)
        if problems:
            self.unreadable += 1
            self.rejected_revision = stored.stream_seq
            log.warning(
                "node %s: NodeSLO revision %d refused (%s); keeping revision %d",
                self._node,
                stored.stream_seq,
                "; ".join(problems[:3]),
                self.revision,
            )
            return False
        return self._take(spec, stored.stream_seq)

    def _take(self, spec: Mapping[str, Any] | None, revision: int) -> bool:
        changed = spec != self.spec
        self.spec = dict(spec) if spec is not None else None
        self.revision = revision
        if changed:
            log.info("node %s: NodeSLO revision %d in effect", self._node, revision)
            self._save()
        return changed

    def _save(self) -> None:
        if not self._cache:
            return
        try:
            save_json(self._cache, {"revision": self.revision, "spec": self.spec}, prefix=".nodeslo-")
        except OSError as e:
            log.warning("node %s: cannot save the NodeSLO to %s: %s", self._node, self._cache, e)

    def _load_cache(self) -> None:
        if not self._cache or not os.path.exists(self._cache):
            return
        try:
            with open(self._cache) as f:
                saved = json.load(f)
            spec = saved["spec"]
            if spec is not None and (not isinstance(spec, dict) or spec_problems(spec)):
                raise ValueError("the saved spec is not a valid NodeSLO spec")
            self.spec, self.revision = spec, int(saved["revision"])
            log.info("node %s: NodeSLO revision %d loaded from %s", self._node, self.revision, self._cache)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("node %s: ignoring the saved NodeSLO %s: %s", self._node, self._cache, e)


async def refresh_forever(
    source: SloSource,
    *,
    interval: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Read the key every `interval` seconds until cancelled (a failed read is counted by `refresh` and retried)."""
    while True:
        await source.refresh(clock())
        await sleep(interval)
