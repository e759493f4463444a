"""The writing half of the Kubernetes bridge: NodeMetric objects, node batch/mid resources, NUMA zone batch entries
on NodeResourceTopologies and the colocation ConfigMap's Events, written as decided.

`ClusterWriter` follows NodeMetricComputed (KOORD_NODEMETRIC), NodeResourceComputed and ColocationConfigStatus
(KOORD_NODERESOURCE) with durable consumers reset at start to the last message per subject, so a restart re-applies
the latest decision per node. The NodeMetric spec is owned by the NodeResourceComputed decisions (spec §1.3): each
decision carrying a `nodemetric_spec` (None while the ConfigMap is in error: the object keeps its spec) makes the
node's NodeMetric exist with that spec, whether or not its resource write is due; the writer skips it when that spec
was already confirmed on the server for the node. A NodeMetricComputed writes only the status, creating the object
first if missing (with the node's last decided spec, else the event's own). A ColocationConfigStatus becomes one
core/v1 Event on the ConfigMap per distinct error (a Warning), or a Normal one on recovery. A decision with NUMA
zones (§2.7) sets the zones' batch entries on the node's NodeResourceTopology with its due writes, and at once when
the node's zones were not written before (an absent object is skipped, never created). The Node tombstones the
observing half leaves on KOORD_CLUSTER (the noderesource service publishes nothing when a node goes) delete the
node's NodeMetric; until the Node is seen again, NodeMetric writes for it are dropped, so a late report or a
replayed decision does not bring the object back. It never writes from the consumer: the latest intent per object
waits in a pending map (a newer one replaces an unwritten older one; a NodeResourceComputed whose write is not due
is ignored for the Node) and a writer task drains it, with at most one NodeMetric status write per node every
`nodemetric_status_interval_seconds`. A write that fails is kept and retried with exponential backoff until it
succeeds or a newer intent replaces it (which inherits the backoff); the delays carry jitter, so objects that failed
together do not retry together; after `unhealthy_after_write_failures` consecutive failures `healthy()` is
False (for /readyz) until one succeeds.

Where the writes go is a services.k8s.sinks.WriteSink (the API server, or a record of the writes in
record-only mode). Built by the composition root (koordbus).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from prometheus_client import CollectorRegistry, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery
from schemas.node import MetricCollectPolicy, NodeMetricComputed
from schemas.noderesource import (
    COLOCATION_CONFIG_STATUS_DECODER,
    NODERESOURCE_COMPUTED_DECODER,
    ColocationConfigStatus,
    NodeResourceComputed,
)
from services.common import observe
from services.common.tasks import cancel_and_wait
from services.k8s import core, instruments, writes
from services.k8s.settings import K8sSettings
from services.k8s.sinks import WriteFailedError, WriteSink

log = logging.getLogger(__name__)

SERVICE: Final = "k8s-writer"
NODEMETRIC_CONSUMER: Final = "k8s-writer-nodemetric"
NODERESOURCE_CONSUMER: Final = "k8s-writer-noderesource"
CONFIG_STATUS_CONSUMER: Final = "k8s-writer-config-status"
NODES_CONSUMER: Final = "k8s-writer-nodes"
OBJECT_NODEMETRIC: Final = writes.OBJECT_NODEMETRIC
OBJECT_NODE: Final = writes.OBJECT_NODE
OBJECT_EVENT: Final = writes.OBJECT_EVENT
KEY_NODEMETRIC_SPEC: Final = "nodemetric-spec"
"""Pending-map kind of a NodeMetric spec write (counted under the `nodemetric` object label)."""
KEY_NODEMETRIC_DELETE: Final = "nodemetric-delete"
"""Pending-map kind of the deletion of a gone node's NodeMetric (counted under `nodemetric` too)."""


class NodeLifecycle(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.node_observed.v1"):
    """What the writer reads of a schemas.cluster.NodeObserved: whether the Node exists (the object itself is
    skipped, not decoded)."""

    name: str
    observed_at: float
    deleted: bool = False


Intent = NodeMetricComputed | NodeResourceComputed | ColocationConfigStatus | NodeLifecycle
Json = dict[str, Any]


# --- the writer


@dataclass(kw_only=True)
class _Pending:
    intent: Intent
    not_before: float
    failures: int = 0


_NODEMETRIC_DECODER: Final = msgspec.json.Decoder(NodeMetricComputed)
_NODE_LIFECYCLE_DECODER: Final = msgspec.json.Decoder(NodeLifecycle)


def _intent_time(intent: Intent) -> float:
    match intent:
        case NodeMetricComputed():
            return intent.report_time
        case NodeResourceComputed():
            return intent.computed_at
        case ColocationConfigStatus():
            return intent.at
        case NodeLifecycle():
            return intent.observed_at


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
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.bus = bus
        self.sink = sink
        self.settings = settings
        self.registry = registry
        self._clock = clock
        self._jitter = jitter
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._specs: dict[str, NodeResourceComputed] = {}
        """Per node, its latest decision carrying a NodeMetric spec (kept while the node is gone, for its return)."""
        self._confirmed_specs: dict[str, MetricCollectPolicy] = {}
        """Per node, the spec last written or found on its NodeMetric (a decision with the same one writes nothing)."""
        self._zones_written: dict[str, set[str]] = {}
        """Per node, the NUMA zone names last queued for its NodeResourceTopology."""
        self._gone: set[str] = set()
        """Nodes whose last state seen is a tombstone: their NodeMetric is deleted and not written again."""
        self._in_flight = 0
        self._rate_limit = writes.StatusRateLimit(settings.nodemetric_status_interval_seconds)
        self._health = writes.WriteHealth(settings.unhealthy_after_write_failures)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumers: dict[str, Consumer] = {}
        self._writes = instruments.kube_writes(registry)
        self._summary = instruments.WriteSummary("k8s writer", log, clock=clock)
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
            CONFIG_STATUS_CONSUMER: self.bus.consume(
                self._spec(CONFIG_STATUS_CONSUMER, streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_CONFIG_STATUS),
                _IntentHandler(self, COLOCATION_CONFIG_STATUS_DECODER.decode),
                reset=True,
            ),
            NODES_CONSUMER: self.bus.consume(
                self._spec(NODES_CONSUMER, streams.KOORD_CLUSTER, subjects.CLUSTER_NODES),
                _IntentHandler(self, _NODE_LIFECYCLE_DECODER.decode),
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
            await cancel_and_wait(self._task)
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
        """Take the latest intent for its object; an older one than already pending is ignored, and so is a
        decision whose write is not due (for the Node; its NodeMetric spec is still ensured)."""
        now = self._clock()
        if isinstance(intent, NodeMetricComputed | NodeResourceComputed) and intent.node in self._gone:
            if isinstance(intent, NodeResourceComputed):  # may come before the Node's return: written then
                self._remember_spec(intent)
            self._writes.labels(OBJECT_NODEMETRIC, "skipped").inc()  # a late report or a replayed decision
            return
        match intent:
            case NodeLifecycle():
                self._offer_lifecycle(intent, now)
            case ColocationConfigStatus():
                event = writes.config_event(
                    intent, namespace=self.settings.configmap_namespace, name=self.settings.configmap_name
                )
                if event is not None:  # one key per Event: distinct errors are not coalesced away
                    self._queue((OBJECT_EVENT, event["metadata"]["name"]), intent, now)
            case NodeMetricComputed():
                self._queue((OBJECT_NODEMETRIC, intent.node), intent, self._rate_limit.earliest(intent.node, now))
            case NodeResourceComputed():
                self._offer_spec(intent, now)
                if intent.zones and (intent.write_due or self._zones_written.get(intent.node) != set(intent.zones)):
                    # §2.7: zone values go with the node's due writes, and at once for zones not written yet.
                    self._zones_written[intent.node] = set(intent.zones)
                    self._queue((writes.OBJECT_TOPOLOGY, intent.node), intent, now)
                if not intent.node_write_due:
                    self._writes.labels(OBJECT_NODE, "skipped").inc()
                    return
                self._queue((OBJECT_NODE, intent.node), intent, now)

    def _offer_lifecycle(self, node: NodeLifecycle, now: float) -> None:
        name = node.name
        if not node.deleted:
            if name in self._gone:  # the Node is back: its NodeMetric is written again
                self._gone.discard(name)
                self._pending.pop((KEY_NODEMETRIC_DELETE, name), None)
                if (decision := self._specs.get(name)) is not None:
                    self._queue((KEY_NODEMETRIC_SPEC, name), decision, now)
            return
        self._gone.add(name)
        for kind in (OBJECT_NODEMETRIC, KEY_NODEMETRIC_SPEC, OBJECT_NODE, writes.OBJECT_TOPOLOGY):
            self._pending.pop((kind, name), None)
        self._confirmed_specs.pop(name, None)
        self._queue((KEY_NODEMETRIC_DELETE, name), node, now)

    def _remember_spec(self, decision: NodeResourceComputed) -> bool:
        """Keep the decision as the node's latest spec; False when it carries none or an older one is held."""
        held = self._specs.get(decision.node)
        if decision.nodemetric_spec is None or (held is not None and held.computed_at > decision.computed_at):
            return False
        self._specs[decision.node] = decision
        return True

    def _offer_spec(self, decision: NodeResourceComputed, now: float) -> None:
        if not self._remember_spec(decision):
            return
        if self._confirmed_specs.get(decision.node) == decision.nodemetric_spec:
            self._pending.pop((KEY_NODEMETRIC_SPEC, decision.node), None)  # an older, different one is moot
            return
        self._queue((KEY_NODEMETRIC_SPEC, decision.node), decision, now)

    def _queue(self, key: tuple[str, str], intent: Intent, not_before: float) -> None:
        waiting = self._pending.get(key)
        if waiting is not None:
            if _intent_time(intent) >= _intent_time(waiting.intent):
                waiting.intent = intent
            return
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
            result = await self._write_intent(kind, node, waiting.intent)
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
        self._writes.labels(_object_label(kind), result.action).inc()
        self._summary.count(_object_label(kind), result.action)
        if result.action != "unchanged":
            log.debug("k8s writer: %s %s: %s", result.action, result.object, "; ".join(result.changes))
        if result.action == "created" and kind in (OBJECT_NODEMETRIC, KEY_NODEMETRIC_SPEC) and node in self._gone:
            self._queue((KEY_NODEMETRIC_DELETE, node), NodeLifecycle(name=node, observed_at=0.0, deleted=True), 0.0)
            return  # created while the node's tombstone arrived: delete it again
        if kind == OBJECT_NODEMETRIC and result.action in ("created", "updated"):
            now = self._clock()
            self._rate_limit.wrote(node, now)
            if (newer := self._pending.get(key)) is not None:
                newer.not_before = max(newer.not_before, self._rate_limit.earliest(node, now))

    async def _write_intent(self, kind: str, name: str, intent: Intent) -> writes.WriteResult:
        match intent:
            case NodeMetricComputed():
                held = self._specs.get(name)
                return await self.sink.write_nodemetric(intent, spec=held.nodemetric_spec if held is not None else None)
            case NodeResourceComputed() if kind == KEY_NODEMETRIC_SPEC:
                spec = intent.nodemetric_spec
                if spec is None:  # not queued so; kept total for the type checker
                    return writes.WriteResult(object=f"{OBJECT_NODEMETRIC}/{name}", action="skipped")
                result = await self.sink.write_nodemetric_spec(name, spec)
                self._confirmed_specs[name] = spec
                return result
            case NodeResourceComputed() if kind == writes.OBJECT_TOPOLOGY:
                return await self.sink.write_topology_zones(intent)
            case NodeResourceComputed():
                return await self.sink.write_node_resources(intent)
            case ColocationConfigStatus():
                event = writes.config_event(
                    intent, namespace=self.settings.configmap_namespace, name=self.settings.configmap_name
                )
                if event is None:
                    return writes.WriteResult(object=f"{OBJECT_EVENT}/{name}", action="skipped")
                return await self.sink.write_event(event)
            case NodeLifecycle():
                if name not in self._gone:  # seen again while the deletion waited
                    return writes.WriteResult(object=f"{OBJECT_NODEMETRIC}/{name}", action="skipped")
                return await self.sink.delete_nodemetric(name)

    def _failed(self, key: tuple[str, str], waiting: _Pending, reason: str, *, retry: bool) -> None:
        kind, node = key
        self._health.failed(reason)
        self._writes.labels(_object_label(kind), "failed" if retry else "rejected").inc()
        self._summary.count(_object_label(kind), "failed" if retry else "rejected")
        failures = waiting.failures + 1
        delay = core.backoff_delay(
            failures,
            initial=self.settings.backoff_initial_seconds,
            maximum=self.settings.backoff_max_seconds,
            jitter=self._jitter(),
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


def _object_label(kind: str) -> str:
    """The `object` label of the writes counter: spec writes and deletions are NodeMetric writes."""
    return OBJECT_NODEMETRIC if kind in (KEY_NODEMETRIC_SPEC, KEY_NODEMETRIC_DELETE) else kind
