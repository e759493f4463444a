"""The reflector loop: list a collection, watch it from the list's resourceVersion, and hand every change on.

`KubeCollection` wraps one kubernetes-asyncio list function (e.g. `CoreV1Api.list_node`) and reads its responses
raw (`_preload_content=False`), so objects are never turned into the client's models: the observer decodes them
into schemas.kube in one place. `Reflector` drives a collection: after a clean end of a watch (server timeout) it
resumes at once from the last resourceVersion seen (BOOKMARKs included); after a disconnect or an error it resumes
with bounded exponential backoff; after 410 Gone (an ERROR event or an HTTP 410) it relists, which yields
tombstones for objects that vanished meanwhile (services.k8s.core decides). Bad events are logged and counted,
never fatal. Used by services.k8s.observer; tested against tests/fakes/kube_api.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from services.k8s import core

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024 * 1024
"""A watch line longer than this is a broken stream (etcd caps objects at 1.5 MiB)."""
SINK_CHUNK = 500
"""A list's changes are handed to the sink this many at a time, yielding to the event loop in between."""
QUICK_END_SECONDS = 1.0
"""A watch that ends cleanly this soon without any event is retried with backoff, not at once."""


class ApiStatusError(Exception):
    """The API server answered a list or watch with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Collection(Protocol):
    """A listable, watchable collection of one kind."""

    kind: str
    namespaced: bool

    async def list(self) -> bytes:
        """The list response body; ApiStatusError on an error status."""
        ...

    def watch(self, resource_version: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """An async context manager yielding the watch's lines; ApiStatusError on an error status."""
        ...


ListFunction = Callable[..., Awaitable[object]]
"""A generated list function (e.g. `CoreV1Api.list_node`). Its stubs promise the model (V1NodeList); called with
`_preload_content=False` it returns the raw aiohttp response instead, which `_raw_response` checks."""


def _raw_response(response: object) -> aiohttp.ClientResponse:
    if not isinstance(response, aiohttp.ClientResponse):
        raise TypeError(f"expected a raw aiohttp response with _preload_content=False, got {type(response).__name__}")
    return response


class KubeCollection:
    """One kind served by the API, listed and watched through a generated kubernetes-asyncio list function."""

    def __init__(
        self,
        kind: str,
        list_function: ListFunction,
        *,
        namespaced: bool,
        watch_timeout_seconds: int,
        read_grace_seconds: float,
        **selection: Any,
    ) -> None:
        self.kind = kind
        self.namespaced = namespaced
        self._list_function = list_function
        self._watch_timeout = watch_timeout_seconds
        self._read_timeout = watch_timeout_seconds + read_grace_seconds
        self._selection = selection
        """Fixed arguments: namespace, field_selector …"""

    async def list(self) -> bytes:
        response = _raw_response(
            await self._list_function(
                **self._selection, _preload_content=False, _request_timeout=(30.0, self._read_timeout)
            )
        )
        async with response:
            body = await response.read()
            if response.status != 200:
                raise ApiStatusError(response.status, core.error_status(body))
            return body

    def watch(self, resource_version: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self._watch(resource_version)

    @asynccontextmanager
    async def _watch(self, resource_version: str) -> AsyncIterator[AsyncIterator[bytes]]:
        response = _raw_response(
            await self._list_function(
                **self._selection,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                _request_timeout=(30.0, self._read_timeout),
            )
        )
        async with response:
            if response.status != 200:
                raise ApiStatusError(response.status, core.error_status(await response.read()))
            yield _lines(response.content)


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited lines of any length (aiohttp's readline stops at 128 KiB; a ConfigMap may be 1 MiB)."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer.extend(chunk)
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end]).strip()
            start = end + 1
            if line:
                yield line
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise core.MalformedError(f"watch line longer than {MAX_LINE_BYTES} bytes")
    if tail := bytes(buffer).strip():
        yield tail


@dataclass(kw_only=True)
class ReflectorStats:
    """Counters one reflector keeps; the observer exports them as metrics."""

    lists: int = 0
    relists: int = 0
    """Lists after the first one (410 Gone)."""
    watch_restarts: int = 0
    """Watches opened again after a clean end, a disconnect or an error."""
    watch_errors: int = 0
    """Lists or watches that failed (the reflector backs off and retries)."""
    bad_events: int = 0
    """Watch lines or listed items that could not be understood (skipped)."""
    events: int = 0
    """Watch events received (BOOKMARKs included)."""
    last_event_at: float = 0.0
    """Clock time of the newest list or watch event, unix seconds."""
    last_error: str = ""


ChangeSink = Callable[[str, list[core.Change]], None]
"""Takes (kind, changes) without blocking: the observer keeps the latest pending state per object."""


_CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, core.MalformedError)
"""Failures of one list or watch request that are retried with backoff."""


class Reflector:
    """Lists and watches one collection forever (until cancelled), handing changes to `sink` in order."""

    def __init__(
        self,
        collection: Collection,
        sink: ChangeSink,
        *,
        backoff_initial_seconds: float,
        backoff_max_seconds: float,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.collection = collection
        self.state = core.ReflectorState(namespaced=collection.namespaced)
        self.stats = ReflectorStats()
        self.listed = asyncio.Event()
        """Set once the first list has been handed to the sink."""
        self._sink = sink
        self._backoff = (backoff_initial_seconds, backoff_max_seconds)
        self._clock = clock
        self._sleep = sleep
        self._failures = 0

    @property
    def kind(self) -> str:
        return self.collection.kind

    async def run(self) -> None:
        first_watch = True
        while True:
            if not self.state.resource_version:
                if not await self._relist():
                    await self._back_off()
                    continue
                first_watch = True
            if not first_watch:
                self.stats.watch_restarts += 1
            first_watch = False
            started = self._clock()
            try:
                received = await self._watch_once()
            except ApiStatusError as err:
                if err.status == core.HTTP_GONE:  # an HTTP 410 or a 410 ERROR event: the resume point is gone
                    log.info("k8s %s: watch answered %s; relisting", self.kind, err)
                    self.state.expire()
                    continue
                self._failed(f"watch from resourceVersion {self.state.resource_version} failed: {err}")
                await self._back_off()
                continue
            except _CONNECTION_ERRORS as err:
                self._failed(f"watch from resourceVersion {self.state.resource_version} failed: {err}")
                await self._back_off()
                continue
            except Exception as err:  # a loop that must outlive any one request: log it loudly, retry
                log.exception("k8s %s: unexpected watch failure", self.kind)
                self._failed(f"unexpected watch failure: {type(err).__name__}: {err}")
                await self._back_off()
                continue
            if not received and self._clock() - started < QUICK_END_SECONDS:
                # Ended cleanly at once without a single event: do not spin against a server that hangs up.
                self._failures += 1
                await self._back_off()

    async def _relist(self) -> bool:
        try:
            body = await self.collection.list()
            result = core.parse_list(body)
        except (*_CONNECTION_ERRORS, ApiStatusError) as err:
            self._failed(f"list failed: {err}")
            return False
        except Exception as err:  # see run(): never let one request end the reflector
            log.exception("k8s %s: unexpected list failure", self.kind)
            self._failed(f"unexpected list failure: {type(err).__name__}: {err}")
            return False
        changes, rejected = self.state.relist(result)
        for reason in rejected:
            self._bad(f"listed item skipped: {reason}")
        self.stats.lists += 1
        if self.listed.is_set():
            self.stats.relists += 1
        self.stats.last_event_at = self._clock()
        self._failures = 0
        for start in range(0, len(changes), SINK_CHUNK):
            self._sink(self.kind, changes[start : start + SINK_CHUNK])
            await asyncio.sleep(0)  # decoding a big list takes seconds: let the publisher and other watches run
        self.listed.set()
        log.info(
            "k8s %s: listed %d objects at resourceVersion %s (%d changes)",
            self.kind,
            len(result.items),
            result.resource_version,
            len(changes),
        )
        return True

    async def _watch_once(self) -> bool:
        """One watch request to its end; whether it delivered any event."""
        received = False
        async with self.collection.watch(self.state.resource_version) as lines:
            async for line in lines:
                received = True
                self._failures = 0
                self.stats.events += 1
                self.stats.last_event_at = self._clock()
                self._handle_line(line)
        return received

    def _handle_line(self, line: bytes) -> None:
        try:
            event = core.parse_watch_line(line)
            if event.type == core.ERROR:
                raise ApiStatusError(event.error_code, f"watch ERROR event: {event.error_message}")
            change = self.state.apply(event)
        except core.MalformedError as err:
            self._bad(f"watch event skipped: {err}")
            return
        if change is not None:
            self._sink(self.kind, [change])

    async def _back_off(self) -> None:
        initial, maximum = self._backoff
        await self._sleep(core.backoff_delay(max(self._failures, 1), initial=initial, maximum=maximum))

    def _failed(self, reason: str) -> None:
        self._failures += 1
        self.stats.watch_errors += 1
        self.stats.last_error = reason
        log.warning("k8s %s: %s (retry %d)", self.kind, reason, self._failures)

    def _bad(self, reason: str) -> None:
        self.stats.bad_events += 1
        log.warning("k8s %s: %s", self.kind, reason)
