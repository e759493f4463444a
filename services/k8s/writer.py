"""The writing half of the Kubernetes bridge: NodeMetric objects and node batch/mid resources, written as decided.

`ClusterWriter` follows NodeMetricComputed (KOORD_NODEMETRIC) and NodeResourceComputed (KOORD_NODERESOURCE) with
durable consumers reset at start to the last message per subject, so a restart re-applies the latest decision per
node. It never writes from the consumer: the latest intent per object waits in a pending map (a newer one replaces
an unwritten older one; a NodeResourceComputed whose write is not due is ignored) and a writer task drains it, with
at most one NodeMetric status write per node every `nodemetric_status_interval_seconds`. A write that fails is kept
and retried with exponential backoff until it succeeds or a newer intent replaces it; after
`unhealthy_after_write_failures` consecutive failures `healthy()` is False (for /readyz) until one succeeds.

Where the writes go is a `WriteSink`: `KubeSink` writes to the API server (idempotently: it reads the object, asks
services.k8s.writes what to change, and writes nothing when nothing changed; a write answered 409 Conflict, or 404
because the object went away, is retried at once from a fresh read, a bounded number of times; other failures are
the writer's to back off from), `RecordingSink` only records what would be written (record-only mode, for
`koordbus up` without a cluster; its `export()` is for the API). Built by the composition root (koordbus).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery
from schemas.node import NodeMetricComputed
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.common import observe
from services.k8s import core, writes
from services.k8s.settings import K8sSettings

log = logging.getLogger(__name__)

SERVICE: Final = "k8s-writer"
NODEMETRIC_CONSUMER: Final = "k8s-writer-nodemetric"
NODERESOURCE_CONSUMER: Final = "k8s-writer-noderesource"
OBJECT_NODEMETRIC: Final = writes.OBJECT_NODEMETRIC
OBJECT_NODE: Final = writes.OBJECT_NODE
MERGE_PATCH: Final = "application/merge-patch+json"
HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
HTTP_TOO_MANY_REQUESTS: Final = 429
RETRY_AT_ONCE: Final = (HTTP_CONFLICT, HTTP_NOT_FOUND)
"""Answers to a write that a fresh read resolves: the object changed (409) or went away (404) since our read."""
_NODEMETRICS: Final = (writes.NODEMETRIC_GROUP, writes.NODEMETRIC_VERSION, writes.NODEMETRIC_PLURAL)

Intent = NodeMetricComputed | NodeResourceComputed
Json = dict[str, Any]


class WriteFailedError(Exception):
    """A write that did not go through. `retry` is False when repeating it cannot help (422 Invalid, 403 …)."""

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


class WriteSink(Protocol):
    """Where the writer's intents go: the API server, or a record of what would have been written."""

    async def write_nodemetric(self, event: NodeMetricComputed) -> writes.WriteResult:
        """Create the node's NodeMetric if missing, bring its spec and status to the event's; WriteFailedError."""
        ...

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        """Bring the node's batch/mid resources and annotations to the (due) decision's; WriteFailedError."""
        ...


# --- the API server


class KubeSink:
    """Writes to the API server through kubernetes-asyncio, reading and writing raw JSON (no client models)."""

    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._core = CoreV1Api(api_client)
        self._custom = CustomObjectsApi(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write_nodemetric(self, event: NodeMetricComputed) -> writes.WriteResult:
        name = event.node
        changes: list[str] = []
        for _ in range(self._attempts):
            current = await self._get_nodemetric(name)
            if current is None:
                status, body = await self._request(
                    self._custom.create_cluster_custom_object(
                        *_NODEMETRICS,
                        writes.nodemetric_to_create(event),
                        **self._options(),
                    )
                )
                if status == HTTP_CONFLICT:  # AlreadyExists: another writer was first; read it and go on
                    continue
                current = _parsed(status, body, f"create NodeMetric {name}")
                changes.append(writes.CREATED)
            if (spec_update := writes.nodemetric_spec_update(current, event)) is not None:
                status, body = await self._request(
                    self._custom.replace_cluster_custom_object(
                        *_NODEMETRICS,
                        name,
                        spec_update,
                        **self._options(),
                    )
                )
                if status in RETRY_AT_ONCE:
                    continue
                current = _parsed(status, body, f"update NodeMetric {name}")
                changes.append("spec updated")
            if (status_update := writes.nodemetric_status_update(current, event)) is not None:
                status, body = await self._request(
                    self._custom.replace_cluster_custom_object_status(
                        *_NODEMETRICS,
                        name,
                        status_update,
                        **self._options(),
                    )
                )
                if status in RETRY_AT_ONCE:
                    continue
                _parsed(status, body, f"update NodeMetric {name} status")
                changes.append(f"status updateTime {status_update['status']['updateTime']}")
            return writes.write_result(OBJECT_NODEMETRIC, name, changes)
        raise WriteFailedError(f"NodeMetric {name}: still changing under us after {self._attempts} attempts")

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        name = decision.node
        if not decision.write_due:
            return writes.not_due(decision)
        changes: list[str] = []
        for _ in range(self._attempts):
            node = await self._get_node(name)
            if node is None:
                return writes.WriteResult(object=f"{OBJECT_NODE}/{name}", action="skipped", changes=("node not found",))
            if (status_write := writes.node_status_patch(node, decision)) is not None:
                status, body = await self._request(
                    self._core.patch_node_status(name, status_write.patch, **self._options(content_type=MERGE_PATCH))
                )
                if status in RETRY_AT_ONCE:
                    continue
                node = _parsed(status, body, f"patch node {name} status")
                changes.extend(status_write.changes)
            if (annotation_write := writes.node_annotation_patch(node, decision)) is not None:
                status, body = await self._request(
                    self._core.patch_node(name, annotation_write.patch, **self._options(content_type=MERGE_PATCH))
                )
                if status in RETRY_AT_ONCE:
                    continue
                _parsed(status, body, f"patch node {name} annotations")
                changes.extend(annotation_write.changes)
            return writes.write_result(OBJECT_NODE, name, changes)
        raise WriteFailedError(f"node {name}: still changing under us after {self._attempts} attempts")

    async def _get_nodemetric(self, name: str) -> Json | None:
        status, body = await self._request(
            self._custom.get_cluster_custom_object(*_NODEMETRICS, name, **self._options())
        )
        return None if status == HTTP_NOT_FOUND else _parsed(status, body, f"get NodeMetric {name}")

    async def _get_node(self, name: str) -> Json | None:
        status, body = await self._request(self._core.read_node(name, **self._options()))
        return None if status == HTTP_NOT_FOUND else _parsed(status, body, f"get node {name}")

    def _options(self, *, content_type: str = "") -> dict[str, Any]:
        """Raw responses, our timeout, and for patches the media type (the client would pick a strategic merge
        patch for a dict body on core kinds, and the stubs do not declare `_content_type`)."""
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        if content_type:
            options["_content_type"] = content_type
        return options

    @staticmethod
    async def _request(call: Awaitable[object]) -> tuple[int, bytes]:
        """(HTTP status, body) of one request made with `_preload_content=False`; connection errors are
        retryable WriteFailedErrors."""
        try:
            response = await call
            if not isinstance(response, aiohttp.ClientResponse):
                raise TypeError(f"expected a raw aiohttp response, got {type(response).__name__}")
            async with response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise WriteFailedError(f"request failed: {type(err).__name__}: {err}") from err


def _parsed(status: int, body: bytes, what: str) -> Json:
    """The JSON object of a successful response; WriteFailedError (retryable for 429 and 5xx) otherwise."""
    if not 200 <= status <= 299:
        retry = status == HTTP_TOO_MANY_REQUESTS or status >= 500
        raise WriteFailedError(f"{what}: HTTP {status}: {core.error_status(body)}", retry=retry)
    try:
        parsed = json.loads(body)
    except ValueError as err:
        raise WriteFailedError(f"{what}: response is not JSON: {err}") from err
    if not isinstance(parsed, dict):
        raise WriteFailedError(f"{what}: response is not a JSON object")
    return parsed


# --- record-only mode


class RecordingSink:
    """Record-only mode: what would be written is kept in a services.k8s.writes.WriteRecorder, never sent."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.recorder = writes.WriteRecorder(keep=keep)
        self._clock = clock

    async def write_nodemetric(self, event: NodeMetricComputed) -> writes.WriteResult:
        return self.recorder.nodemetric(event, now=self._clock())

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        return self.recorder.node_resources(decision, now=self._clock())

    @property
    def log(self) -> Sequence[writes.RecordedWrite]:
        return self.recorder.log

    def export(self) -> Json:
        """For the API: the objects as they would be after the writes, and the log of writes (oldest first)."""
        return self.recorder.export()


# --- the writer


@dataclass(kw_only=True)
class _Pending:
    intent: Intent
    not_before: float
    failures: int = 0


_NODEMETRIC_DECODER: Final = msgspec.json.Decoder(NodeMetricComputed)


def _intent_time(intent: Intent) -> float:
    return intent.report_time if isinstance(intent, NodeMetricComputed) else intent.computed_at


class _IntentHandler:
    def __init__(self, writer: ClusterWriter, decode: Callable[[bytes], Intent]) -> None:
        self._writer = writer
        self._decode = decode

    async def handle(self, delivery: Delivery) -> None:
        self._writer.offer(self._decode(delivery.data))

    async def flush(self) -> None:
        return None


class ClusterWriter:
    """Follows the decisions on the bus and writes them to `sink`, coalesced, rate-limited and retried."""

    def __init__(
        self,
        bus: Bus,
        sink: WriteSink,
        *,
        settings: K8sSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.sink = sink
        self.settings = settings
        self.registry = registry
        self._clock = clock
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._in_flight = 0
        self._rate_limit = writes.StatusRateLimit(settings.nodemetric_status_interval_seconds)
        self._health = writes.WriteHealth(settings.unhealthy_after_write_failures)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumers: dict[str, Consumer] = {}
        self._writes = Counter(
            "koordbus_k8s_writes",
            "Writes to Kubernetes by object kind and outcome (created, updated, unchanged, skipped, failed, rejected)",
            ["object", "outcome"],
            registry=registry,
        )
        Gauge(
            "koordbus_k8s_pending_writes",
            "Objects with a write waiting (coalesced, rate-limited or backing off)",
            registry=registry,
        ).set_function(lambda: len(self._pending))
        Gauge(
            "koordbus_k8s_writer_healthy",
            "0 after repeated consecutive write failures, 1 otherwise",
            registry=registry,
        ).set_function(lambda: int(self.healthy()))

    # --- lifecycle

    async def start(self) -> None:
        """Start the writer task and the consumers (reset: the last decision per node is delivered again)."""
        self._task = asyncio.create_task(self._run(), name="k8s-writer")
        self._consumers = {
            NODEMETRIC_CONSUMER: self.bus.consume(
                self._spec(NODEMETRIC_CONSUMER, streams.KOORD_NODEMETRIC, subjects.NODEMETRIC_COMPUTED_ALL),
                _IntentHandler(self, _NODEMETRIC_DECODER.decode),
                reset=True,
            ),
            NODERESOURCE_CONSUMER: self.bus.consume(
                self._spec(NODERESOURCE_CONSUMER, streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL),
                _IntentHandler(self, NODERESOURCE_COMPUTED_DECODER.decode),
                reset=True,
            ),
        }
        observe.watch_consumers(self.registry, service=SERVICE, consumers=self._consumers)

    async def stop(self) -> None:
        """Stop consuming and writing; pending writes are dropped (the next start re-reads the latest decisions)."""
        for consumer in self._consumers.values():
            await consumer.stop()
        if self._consumers:
            observe.retire_consumers(self.registry, service=SERVICE, names=tuple(self._consumers))
        self._consumers = {}
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _spec(self, durable: str, stream: str, subject_filter: str) -> ConsumerSpec:
        return ConsumerSpec(
            durable=durable,
            stream=stream,
            filter_subjects=(subject_filter,),
            service=SERVICE,
            deliver_policy="last_per_subject",
        )

    # --- state

    def healthy(self) -> bool:
        """False after `unhealthy_after_write_failures` consecutive failed writes, until one succeeds."""
        return self._health.healthy

    async def readiness(self) -> str | None:
        """A services.common.observe.ReadinessCheck: None when healthy, else why not."""
        if self.healthy():
            return None
        return f"k8s writes failing ({self._health.consecutive_failures} in a row): {self._health.last_error}"

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def consumers(self) -> list[Consumer]:
        return list(self._consumers.values())

    async def wait_idle(self, timeout: float) -> bool:
        """True once the consumers are drained and no write is pending or in flight; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    drained = [await consumer.wait_idle(timeout) for consumer in self._consumers.values()]
                    if all(drained) and not self._pending and not self._in_flight:
                        return True
                    await asyncio.sleep(0.02)
        except TimeoutError:
            return False

    def offer(self, intent: Intent) -> None:
        """Take the latest intent for its object; an older one than already pending, or a decision whose write is
        not due, is ignored."""
        if isinstance(intent, NodeResourceComputed) and not intent.write_due:
            self._writes.labels(OBJECT_NODE, "skipped").inc()
            return
        kind = OBJECT_NODEMETRIC if isinstance(intent, NodeMetricComputed) else OBJECT_NODE
        key = (kind, intent.node)
        now = self._clock()
        waiting = self._pending.get(key)
        if waiting is not None:
            if _intent_time(intent) >= _intent_time(waiting.intent):
                waiting.intent = intent
            return
        not_before = self._rate_limit.earliest(intent.node, now) if kind == OBJECT_NODEMETRIC else now
        self._pending[key] = _Pending(intent=intent, not_before=not_before)
        self._wake.set()

    # --- the writer task

    async def _run(self) -> None:
        concurrency = self.settings.write_concurrency
        while True:
            now = self._clock()
            due = [key for key, waiting in self._pending.items() if waiting.not_before <= now]
            if not due:
                self._wake.clear()
                next_at = min((waiting.not_before for waiting in self._pending.values()), default=None)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if next_at is None else max(next_at - now, 0.001)):
                        await self._wake.wait()
                continue
            for start in range(0, len(due), concurrency):
                await asyncio.gather(*(self._write(key) for key in due[start : start + concurrency]))

    async def _write(self, key: tuple[str, str]) -> None:
        kind, node = key
        waiting = self._pending.pop(key)
        self._in_flight += 1
        try:
            if isinstance(waiting.intent, NodeMetricComputed):
                result = await self.sink.write_nodemetric(waiting.intent)
            else:
                result = await self.sink.write_node_resources(waiting.intent)
        except WriteFailedError as err:
            self._failed(key, waiting, str(err), retry=err.retry)
            return
        except Exception as err:  # a loop that must outlive any one write: log it loudly, retry it
            log.exception("k8s writer: unexpected failure writing %s/%s", kind, node)
            self._failed(key, waiting, f"unexpected {type(err).__name__}: {err}", retry=True)
            return
        finally:
            self._in_flight -= 1
        self._health.succeeded()
        self._writes.labels(kind, result.action).inc()
        if result.action != "unchanged":
            log.info("k8s writer: %s %s: %s", result.action, result.object, "; ".join(result.changes))
        if kind == OBJECT_NODEMETRIC and result.action in ("created", "updated"):
            now = self._clock()
            self._rate_limit.wrote(node, now)
            if (newer := self._pending.get(key)) is not None:
                newer.not_before = max(newer.not_before, self._rate_limit.earliest(node, now))

    def _failed(self, key: tuple[str, str], waiting: _Pending, reason: str, *, retry: bool) -> None:
        kind, node = key
        self._health.failed(reason)
        self._writes.labels(kind, "failed" if retry else "rejected").inc()
        failures = waiting.failures + 1
        delay = core.backoff_delay(
            failures, initial=self.settings.backoff_initial_seconds, maximum=self.settings.backoff_max_seconds
        )
        log.warning(
            "k8s writer: writing %s/%s failed (%d in a row)%s: %s",
            kind,
            node,
            failures,
            f", retrying in {delay:.1f} s" if retry else ", not retried",
            reason,
        )
        newer = self._pending.get(key)
        if newer is not None:  # a newer intent arrived meanwhile: it inherits the backoff
            newer.failures = failures
            newer.not_before = max(newer.not_before, self._clock() + delay)
        elif retry:
            self._pending[key] = _Pending(intent=waiting.intent, not_before=self._clock() + delay, failures=failures)
            self._wake.set()
