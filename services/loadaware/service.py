"""The load-aware extender service (issue 9): cluster and NodeMetric events in, kube-scheduler extender verbs out.

Consumers (durable pull, reset at start: the state lives in memory and is rebuilt at every start, like
services.migration):
  * cluster (KOORD_CLUSTER nodes, pods and the slo-controller-config ConfigMap, last value per subject, then
    changes): allocatable, labels, the usage-thresholds annotation and the assigned pods of
    services.loadaware.state.LoadState. A pod counts on its node as soon as the bridge publishes it with a nodeName
    (bind-time accounting through the watch). The ConfigMap's load-watermarks-config overrides the args' thresholds
    and staleness rule, and its resource-threshold-config caps pods node QoS could evict (services.common.watermarks);
    a key in error keeps its last good value and is logged.
  * nodemetric (KOORD_NODEMETRIC, every partition, last value per subject, then new reports).
The HTTP routes (services.loadaware.http) call `filter`, `prioritize`, `assume` and `explain` on the event loop
between deliveries, so every answer reads one consistent state; so does `node_state`, which answers the API's state
export (request/reply on koord.v1.rpc.loadaware.state, the queue group of every replica: each holds the whole state)
with services.loadaware.snapshot's document. `bind` records the placement at once, then asks
the Kubernetes bridge to create the Binding (request/reply on koord.v1.rpc.k8s.bind, services.k8s.binder) and takes
the placement back when that fails or no answer comes within `bind_timeout_seconds`. Called by `koordbus service
loadaware`, `koordbus up` (koordbus.extender) and tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery, Responder
from bus.errors import BusError
from schemas import extender as wire
from schemas import kube
from schemas.cluster import CLUSTER_EVENT_DECODER, ConfigMapObserved, NodeObserved, PodObserved
from schemas.node import NodeMetricComputed
from schemas.qos import WatermarksInEffect
from services.common import observe, watermarks
from services.common.metrics import once_per_registry
from services.common.startup import wait_replayed
from services.common.watermark_feed import publish_watermarks
from services.loadaware import snapshot
from services.loadaware.args import DEFAULT_ARGS, LoadAwareArgs, apply_watermarks, stated_watermarks
from services.loadaware.extender import DECODE_ERRORS, Extender
from services.loadaware.fast import Matrix
from services.loadaware.settings import LoadAwareSettings
from services.loadaware.state import LoadState

log = logging.getLogger(__name__)

SERVICE = "loadaware"
CLUSTER_CONSUMER = "loadaware-cluster"
NODEMETRIC_CONSUMER = "loadaware-nodemetric"
_NODEMETRIC_DECODER: Final = msgspec.json.Decoder(NodeMetricComputed)
UNKNOWN_LOGGED_MAX = 10_000
RPC_QUEUE = "loadaware"


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "koordbus_loadaware_requests_total",
            "Extender requests by verb and outcome",
            ["verb", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "koordbus_loadaware_request_seconds",
            "Time to answer an extender request (decode, decide, encode)",
            ["verb"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        )
        self.binds = Counter(
            "koordbus_loadaware_binds_total",
            "Bind verbs by outcome: bound, rejected (the API server refused: pod gone, already bound …), "
            "unavailable (the bridge or the API server did not answer), refused (to a node unknown to the extender)",
            ["outcome"],
            registry=registry,
        )
        self.failed = Counter(
            "koordbus_loadaware_filtered_nodes_total",
            "Nodes the filter rejected, by reason",
            ["reason"],
            registry=registry,
        )


class _Handler:
    def __init__(self, apply: Callable[[bytes], None], flush: Callable[[], Awaitable[None]] | None = None) -> None:
        self._apply = apply
        self._flush = flush

    async def handle(self, delivery: Delivery) -> None:
        self._apply(delivery.data)

    async def flush(self) -> None:
        if self._flush is not None:
            await self._flush()


class LoadAwareService:
    def __init__(
        self,
        bus: Bus,
        settings: LoadAwareSettings,
        *,
        args: LoadAwareArgs = DEFAULT_ARGS,
        registry: CollectorRegistry,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.own_args = args
        """The args from the file or Helm values, before load-watermarks-config."""
        self.state = LoadState(args, assumed_ttl_seconds=settings.assumed_ttl_seconds)
        self.extender = Extender(self.state)
        self._registry = registry
        self._metrics = once_per_registry(registry, "loadaware-instruments", _Instruments)
        self._consumers: dict[str, Consumer] = {}
        self._responder: Responder | None = None
        self._unknown_logged: set[str] = set()
        self._stated: WatermarksInEffect | None = None
        self.replayed = False

    async def start(self) -> None:
        handlers = {
            CLUSTER_CONSUMER: _Handler(self.apply_cluster, self.state_watermarks),
            NODEMETRIC_CONSUMER: _Handler(self.apply_nodemetric),
        }
        for name, handler in handlers.items():
            self._consumers[name] = self.bus.consume(self._spec(name), handler, reset=True)
        observe.watch_consumers(self._registry, service=SERVICE, consumers=self._consumers)
        timeout = self.settings.startup_timeout_seconds
        for name, consumer in self._consumers.items():
            if not await wait_replayed(consumer, what=f"loadaware: {name}", stall_seconds=timeout):
                log.warning("loadaware: %s replay stalled for %.0f s; serving with what was read", name, timeout)
        self.ready_to_serve()
        await self.state_watermarks()
        self._responder = await self.bus.serve(subjects.LOADAWARE_RPC_STATE, self.node_state, queue=RPC_QUEUE)
        log.info("loadaware: serving with %d nodes", len(self.state.nodes))

    def ready_to_serve(self) -> None:
        """After the replay: build every node's rows (the first request should not pay for them). The process that
        owns the service then calls gc.freeze() (koordbus.service, bench/loadaware.py): with 100,000 pods replayed a
        full collection inside a request took 90–150 ms."""
        self.extender.matrix.refresh()
        self.replayed = True

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
            self._responder = None
        for consumer in self._consumers.values():
            await consumer.stop()
        if self._consumers:
            observe.retire_consumers(self._registry, service=SERVICE, names=tuple(self._consumers))
        self._consumers = {}

    def _spec(self, name: str) -> ConsumerSpec:
        filters: tuple[str, ...]
        if name == NODEMETRIC_CONSUMER:
            stream, filters = streams.KOORD_NODEMETRIC, (subjects.NODEMETRIC_COMPUTED_ALL,)
        else:
            configmap = subjects.cluster_configmap(self.settings.configmap_namespace, self.settings.configmap_name)
            stream, filters = streams.KOORD_CLUSTER, (subjects.CLUSTER_NODES, subjects.CLUSTER_PODS, configmap)
        return ConsumerSpec(
            durable=f"{name}-{self.settings.instance}" if self.settings.instance else name,
            stream=stream,
            filter_subjects=filters,
            service=SERVICE,
            deliver_policy="last_per_subject",
            batch_size=512,
        )

    @property
    def consumers(self) -> list[Consumer]:
        return list(self._consumers.values())

    # --- inputs

    def apply_cluster(self, data: bytes) -> None:
        match CLUSTER_EVENT_DECODER.decode(data):
            case NodeObserved(name=name, node=node, deleted=deleted):
                self.state.apply_node(name, None if deleted else node)
                if error := self.state.annotation_errors.get(name):
                    log.warning("loadaware: node %s: ignoring %s", name, error)
            case PodObserved() as seen:
                # keyed like its last-value subject: a pod recreated under the same name replaces the old one
                key = f"{seen.namespace}/{seen.name}"
                self.state.apply_pod(
                    key, None if seen.deleted else seen.pod, node=seen.node_name, seen_at=seen.observed_at
                )
            case ConfigMapObserved() as seen:
                self.apply_configmap(None if seen.deleted else seen.data)
            case _:
                pass

    def apply_configmap(self, data: dict[str, str] | None) -> None:
        """The slo-controller-config's data (None: deleted, the defaults): new effective args and QoS caps."""
        config = watermarks.read_watermarks(data, self.state.config)
        for key, error in config.errors.items():
            log.warning("loadaware: slo-controller-config %s in error, keeping its last good value: %s", key, error)
        args = apply_watermarks(self.own_args, config.watermarks)
        if config == self.state.config and args == self.state.args:
            return
        self.state.apply_config(args, config)
        self.extender.matrix = Matrix(self.state)
        if self.replayed:
            self.extender.matrix.refresh()  # now, rather than inside the next filter request
        log.info(
            "loadaware: watermarks now usageThresholds %s, prodUsageThresholds %s, NodeMetric expiry %d s, "
            "%d node QoS strategies, avoidEvictionLoops %s",
            args.usage_thresholds,
            args.prod_usage_thresholds,
            args.node_metric_expiration_seconds,
            len(self.state.qos_strategies),
            config.watermarks.avoid_eviction_loops,
        )

    async def state_watermarks(self) -> None:
        """Publish the watermarks in effect when they differ from the ones last stated (after the replay only)."""
        if not self.replayed:
            return
        stated = stated_watermarks(self.state.args, self.state.config, at=time.time())
        if self._stated is not None and msgspec.structs.replace(self._stated, at=stated.at) == stated:
            return
        if await publish_watermarks(self.bus, stated):
            self._stated = stated

    def apply_nodemetric(self, data: bytes) -> None:
        self.state.apply_metric(_NODEMETRIC_DECODER.decode(data))

    # --- verbs (the HTTP shell maps BadRequest to 400)

    def filter(self, body: bytes) -> bytes:
        started = time.perf_counter()
        answer, request = self.extender.filter(body, now=time.time())
        self._log_unknown(request.names)
        self._observe("filter", started)
        return answer

    def prioritize(self, body: bytes) -> bytes:
        started = time.perf_counter()
        answer, request = self.extender.prioritize(body, now=time.time())
        self._log_unknown(request.names)
        self._observe("prioritize", started)
        return answer

    def assume(self, body: bytes) -> bytes:
        started = time.perf_counter()
        answer = self.extender.assume(body, now=time.time())
        self._observe("assume", started)
        return answer

    async def bind(self, body: bytes) -> bytes:
        started = time.perf_counter()
        placement = self.extender.bind(body, now=time.time())
        binding = placement.binding
        pod = f"{binding.pod_namespace}/{binding.pod_name}"
        if placement.refused:
            self._metrics.binds.labels(outcome="refused").inc()
            self._observe("bind", started)
            log.warning("loadaware: not binding %s (%s): %s", pod, binding.pod_uid, placement.refused)
            return msgspec.json.encode(wire.ExtenderBindingResult(error=placement.refused))
        if not placement.known:
            log.info("loadaware: binding %s to %s without counting it: no filter request carried it", pod, binding.node)
        request = wire.PodBindRequest(
            namespace=binding.pod_namespace, name=binding.pod_name, uid=binding.pod_uid, node=binding.node
        )
        error, outcome = "", "unavailable"
        try:
            data = await self.bus.request(
                subjects.K8S_RPC_BIND, msgspec.json.encode(request), timeout=self.settings.bind_timeout_seconds
            )
            reply = wire.BIND_REPLY.decode(data)
            error = reply.error
            outcome = "bound" if not error else "rejected" if reply.status else "unavailable"
        except (BusError, msgspec.DecodeError, msgspec.ValidationError) as err:
            error = str(err)
        finally:
            if outcome != "bound":  # failed, or cancelled while waiting: the watch adds the pod if it was bound
                self.extender.undo(placement)
        self._metrics.binds.labels(outcome=outcome).inc()
        self._observe("bind", started)
        if error:
            log.warning("loadaware: binding %s (%s) to %s failed: %s", pod, binding.pod_uid, binding.node, error)
            return msgspec.json.encode(wire.ExtenderBindingResult(error=f"bind {pod} to {binding.node}: {error}"))
        return msgspec.json.encode(wire.ExtenderBindingResult())

    def explain(self, pod: kube.Pod, node: str) -> dict[str, object]:
        return self.extender.explain(pod, node, now=time.time())

    async def node_state(self, data: bytes) -> bytes:
        """A NodeStateRequest answered with the node's state document (no `state`: the node is unknown)."""
        try:
            request = wire.NODE_STATE_REQUEST.decode(data)
        except DECODE_ERRORS as err:
            return msgspec.json.encode(wire.NodeStateReply(error=f"not a NodeStateRequest: {err}"))
        now = time.time()
        self.state.expire_assumed(now)
        return msgspec.json.encode(wire.NodeStateReply(state=snapshot.export(self.state, request.node, now=now)))

    def bad_request(self, verb: str) -> None:
        self._metrics.requests.labels(verb=verb, outcome="bad_request").inc()

    def _observe(self, verb: str, started: float) -> None:
        self._metrics.requests.labels(verb=verb, outcome="ok").inc()
        self._metrics.seconds.labels(verb=verb).observe(time.perf_counter() - started)

    def _log_unknown(self, names: list[str]) -> None:
        for name in self.extender.unknown(names):
            if name not in self._unknown_logged and len(self._unknown_logged) < UNKNOWN_LOGGED_MAX:
                self._unknown_logged.add(name)
                log.info("loadaware: node %s is unknown (no Node or NodeMetric seen): it passes with score 0", name)
