"""The slo service shell: Nodes and the slo-controller-config ConfigMap in, each node's NodeSLO spec out into the
KOORD_SLO key-value bucket.

One durable consumer on KOORD_CLUSTER (nodes and the one ConfigMap), reset at start to the last message per
subject, feeds services.slo.core.SloState. Nothing is published until that start-up replay is done (a node rendered
before the ConfigMap arrives would get the defaults for a moment); after it, the specs that changed in each fetched
batch are put into the bucket once each: a NodeSloRendered on the node's key, or a KV delete marker when the node is
gone. Before the replay, the bucket's current values are read, so a restart puts nothing whose spec is already
there (no new revision, no NodeSLO rewrite, no agent re-applying). The ConfigMap keys in error go to the bucket's
`_config` key as a SloConfigStatus whenever they change (the API shows them; the previous good values stay in
effect). Built by the composition root (`koordbus up`, `koordbus service slo`) and the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, PublishOptions, msg_id
from schemas.cluster import CLUSTER_EVENT_DECODER, ConfigMapObserved, NodeObserved
from schemas.qos import NODE_SLO_DECODER, SLO_CONFIG_STATUS_DECODER, NodeSloRendered, SloConfigStatus
from services.common import observe
from services.common.kv import KV_DELETE, KV_OPERATION, is_delete_marker
from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.common.startup import wait_replayed
from services.slo.core import SloState

log = logging.getLogger(__name__)

SERVICE: Final = "slo"
CLUSTER_CONSUMER: Final = "slo-cluster"
_ENCODER = msgspec.json.Encoder(order="sorted")


class _ClusterHandler:
    def __init__(self, owner: SloService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        event = CLUSTER_EVENT_DECODER.decode(delivery.data)
        if isinstance(event, NodeObserved | ConfigMapObserved):
            self._owner.apply(event)

    async def flush(self) -> None:
        await self._owner.publish_pending()


class SloService:
    """Owns the SloState, the specs in the bucket, and the cluster consumer."""

    def __init__(
        self,
        bus: Bus,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        configmap_namespace: str = CONFIGMAP_NAMESPACE,
        configmap_name: str = CONFIGMAP_NAME,
        startup_timeout_seconds: float = 30.0,
    ) -> None:
        self.bus = bus
        self.state = SloState(configmap_namespace=configmap_namespace, configmap_name=configmap_name)
        self._configmap = (configmap_namespace, configmap_name)
        self._configmap_subject = subjects.cluster_configmap(configmap_namespace, configmap_name)
        self._configmap_version = ""
        self._clock = clock
        self._registry = registry
        self._startup_timeout = startup_timeout_seconds
        self._in_bucket: dict[str, dict[str, Any]] = {}
        """Per node, the spec its key holds (read at start, then what we put)."""
        self._revisions: dict[str, int] = {}
        """Per key subject, its revision (stream sequence) as last read or put: a put's msg id names the revision it
        follows, so a retried put is stored once and a later put of an earlier value is not mistaken for it."""
        self._errors_in_bucket: dict[str, str] = {}
        """The errors the `_config` key holds (an absent key: none)."""
        self._pending: dict[str, dict[str, Any] | None] = {}
        self._ready = False
        self._lock = asyncio.Lock()
        self._consumer: Consumer | None = None
        self._published = Counter(
            "koordbus_slo_specs_published", "NodeSLO specs put into the bucket (and deletions)", registry=registry
        )
        self._config_errors = Gauge(
            "koordbus_slo_config_errors",
            "slo-controller-config keys in error (their last good value stays in effect)",
            registry=registry,
        )
        self._nodes = Gauge("koordbus_slo_nodes", "Nodes with a rendered NodeSLO", registry=registry)

    async def start(self) -> None:
        await self._read_bucket()
        self._consumer = self.bus.consume(
            ConsumerSpec(
                durable=CLUSTER_CONSUMER,
                stream=streams.KOORD_CLUSTER,
                filter_subjects=(subjects.CLUSTER_NODES, self._configmap_subject),
                service=SERVICE,
                deliver_policy="last_per_subject",
            ),
            _ClusterHandler(self),
            reset=True,
        )
        observe.watch_consumers(self._registry, service=SERVICE, consumers={CLUSTER_CONSUMER: self._consumer})
        if not await wait_replayed(self._consumer, what="slo: cluster", stall_seconds=self._startup_timeout):
            log.warning("slo: cluster replay stalled for %.0f s, publishing anyway", self._startup_timeout)
        self._ready = True
        await self.publish_pending()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            observe.retire_consumers(self._registry, service=SERVICE, names=(CLUSTER_CONSUMER,))
            self._consumer = None
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def consumer(self) -> Consumer | None:
        return self._consumer

    async def _read_bucket(self) -> None:
        for delivery in await self.bus.read_recent(streams.KV_KOORD_SLO, subjects.SLO_ALL, since=0, limit=1 << 30):
            node = subjects.node_of_slo_key(delivery.subject)
            self._revisions[delivery.subject] = delivery.stream_seq
            if is_delete_marker(delivery) or (node is None and delivery.subject != subjects.SLO_CONFIG_STATUS):
                continue
            try:
                if node is None:
                    self._errors_in_bucket = SLO_CONFIG_STATUS_DECODER.decode(delivery.data).errors
                else:
                    self._in_bucket[node] = NODE_SLO_DECODER.decode(delivery.data).spec
            except msgspec.DecodeError as e:  # rewritten on the next render
                log.warning("slo: bucket key %s is unreadable (%s); it will be rewritten", delivery.subject, e)

    def apply(self, event: NodeObserved | ConfigMapObserved) -> None:
        if isinstance(event, ConfigMapObserved) and (event.namespace, event.name) == self._configmap:
            self._configmap_version = event.resource_version
        for node, spec in self.state.apply(event).items():
            self._pending[node] = spec

    async def publish_pending(self) -> None:
        """Put the specs changed since the last call, and the config status if it changed (after each batch)."""
        if not self._ready:
            return
        async with self._lock:
            pending, self._pending = self._pending, {}
            now = self._clock()
            try:
                for node, spec in sorted(pending.items()):
                    await self._put(node, spec, now)
                    pending.pop(node)
                await self._put_status(now)
            finally:
                # Not put (the bus failed): kept for the next batch, unless a newer render replaced it meanwhile.
                self._pending = {**pending, **self._pending}
            self._nodes.set(len(self.state.nodes()))

    async def _put(self, node: str, spec: dict[str, Any] | None, now: float) -> None:
        if spec is None:
            if self._in_bucket.pop(node, None) is None:
                return
            await self._put_key(subjects.slo_key(node), b"", headers={KV_OPERATION: KV_DELETE})
        else:
            if self._in_bucket.get(node) == spec:
                return
            await self._put_key(
                subjects.slo_key(node), _ENCODER.encode(NodeSloRendered(node=node, spec=spec, rendered_at=now))
            )
            self._in_bucket[node] = spec
        self._published.inc()

    async def _put_key(self, subject: str, data: bytes, *, headers: dict[str, str] | None = None) -> None:
        after = self._revisions.get(subject, 0)
        ack = await self.bus.publish(
            subject, data, msg_id=msg_id(subject, after), options=PublishOptions(headers=headers or {})
        )
        self._revisions[subject] = ack.seq

    async def _put_status(self, now: float) -> None:
        errors = dict(self.state.errors)
        self._config_errors.set(len(errors))
        if errors == self._errors_in_bucket:
            return
        for key, reason in sorted(errors.items()):
            log.warning("slo: slo-controller-config key %s: %s (its last good value stays in effect)", key, reason)
        status = SloConfigStatus(
            errors=errors,
            at=now,
            configmap_namespace=self._configmap[0],
            configmap_name=self._configmap[1],
            resource_version=self._configmap_version,
        )
        data = _ENCODER.encode(status)
        await self._put_key(subjects.SLO_CONFIG_STATUS, data)
        self._errors_in_bucket = errors
