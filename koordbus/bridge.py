"""What `koordbus up` and `koordbus service k8s` run of services.k8s: with a cluster, the observer, writer,
mirrors, the agents' eviction executor and the responders that carry out verbs other services ask for (bind, the
migration executor's cluster verbs); without one (`up`), recording sinks whose writes the API shows."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from services.common import settings as settings_loader


@dataclass
class Bridge:
    """What `koordbus up` runs of services.k8s: a banner line, readiness checks, and in record-only mode the
    recording sink's export for the API."""

    banner: str
    readiness: list[tuple[str, Any]]
    recorded_writes: Any = None
    recorded_verbs: Any = None
    """With `record_verbs` and no cluster: the services.k8s.recording_verbs.RecordingVerbs answering the migration
    executor (its `on_evict` is set by whatever stands in for the cluster)."""


async def bridge_cluster(
    stack: AsyncExitStack,
    bus: Any,
    registry: Any,
    *,
    kubeconfig: str | None,
    record_only_without_config: bool,
    dry_run: bool = False,
    record_verbs: bool = False,
) -> Bridge:
    """With a kubeconfig (or, for `service k8s`, in a pod): watch that cluster and write results back. Without
    one, `koordbus up` records what would be written; `service k8s` refuses to start. `record_verbs`: without a
    cluster, also answer the migration executor's verbs (for the simulated cluster of `up --simulate-nodes`)."""
    from services.k8s.binder import BindResponder, KubeBinder
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.eviction_executor import EvictionExecutor, KubeEvictor
    from services.k8s.nodeslo_mirror import KubeNodeSloSink, NodeSloMirror
    from services.k8s.observer import ClusterObserver
    from services.k8s.profile_mirror import KubeProfileSink, ProfileMirror
    from services.k8s.quota_mirror import KubeQuotaSink, QuotaMirror
    from services.k8s.settings import K8sSettings
    from services.k8s.sinks import KubeSink, RecordingSink
    from services.k8s.topology_mirror import KubeTopologySink, TopologyMirror
    from services.k8s.verbs import KubeVerbs, VerbResponder
    from services.k8s.writer import ClusterWriter

    settings = settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig})
    in_cluster = not record_only_without_config and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not settings.kubeconfig and not in_cluster:
        if not record_only_without_config:
            raise SystemExit("koordbus: no cluster: pass --kubeconfig (or KOORDBUS_KUBECONFIG), or run in a pod")
        recorder = RecordingSink(keep=settings.recorded_writes_kept)
        writer = ClusterWriter(bus, recorder, settings=settings, registry=registry)
        await writer.start()
        stack.push_async_callback(writer.stop)
        recorded_verbs = None
        if record_verbs:
            from services.k8s.recording_verbs import RecordingVerbs

            recorded_verbs = RecordingVerbs(bus, keep=settings.recorded_writes_kept)
            responder = VerbResponder(bus, recorded_verbs, registry=registry)
            await responder.start()
            stack.push_async_callback(responder.stop)
        return Bridge(
            banner="none: record-only, see /api/v1/k8s/recorded-writes (--kubeconfig watches and writes a cluster)",
            readiness=[],
            recorded_writes=await record_quotas(stack, bus, registry, settings, recorder.export, verbs=recorded_verbs),
            recorded_verbs=recorded_verbs,
        )
    try:
        api = await api_client(settings)
    except KubeConfigError as e:
        raise SystemExit(f"koordbus: {e}") from None
    stack.push_async_callback(api.close)
    observer = ClusterObserver(bus, api, settings, registry=registry)
    await observer.start()
    stack.push_async_callback(observer.stop)
    source = settings.kubeconfig or "the in-cluster service account"
    if dry_run:  # watch the real cluster, decide, but only record what would be written
        recorder = RecordingSink(keep=settings.recorded_writes_kept)
        writer = ClusterWriter(bus, recorder, settings=settings, registry=registry)
        await writer.start()
        stack.push_async_callback(writer.stop)
        return Bridge(
            banner=f"watching via {source}, dry run: see /api/v1/k8s/recorded-writes",
            readiness=[],
            recorded_writes=await record_quotas(stack, bus, registry, settings, recorder.export),
        )
    sink = KubeSink(
        api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
    )
    writer = ClusterWriter(bus, sink, settings=settings, registry=registry)
    await writer.start()
    stack.push_async_callback(writer.stop)
    readiness: list[tuple[str, Any]] = [("kubernetes", writer.readiness)]
    nodeslo_mirror = NodeSloMirror(
        bus,
        KubeNodeSloSink(
            api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
        ),
        settings=settings,
        registry=registry,
    )
    await nodeslo_mirror.start()
    stack.push_async_callback(nodeslo_mirror.stop)
    readiness.append(("kubernetes-nodeslos", nodeslo_mirror.readiness))
    if settings.mirror_topologies:
        topology_mirror = TopologyMirror(
            bus,
            KubeTopologySink(
                api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
            ),
            settings=settings,
            registry=registry,
        )
        await topology_mirror.start()
        stack.push_async_callback(topology_mirror.stop)
        readiness.append(("kubernetes-topologies", topology_mirror.readiness))
    evictions = EvictionExecutor(
        bus, KubeEvictor(api, request_timeout=settings.write_timeout_seconds), registry=registry
    )
    await evictions.start()
    stack.push_async_callback(evictions.stop)
    if settings.bind_pods:
        binder = BindResponder(bus, KubeBinder(api, request_timeout=settings.write_timeout_seconds), registry=registry)
        await binder.start()
        stack.push_async_callback(binder.stop)
    verbs = VerbResponder(bus, KubeVerbs(api, request_timeout=settings.write_timeout_seconds), registry=registry)
    await verbs.start()
    stack.push_async_callback(verbs.stop)
    if settings.mirror_quotas:
        quota_sink = KubeQuotaSink(
            api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
        )
        mirror = QuotaMirror(bus, quota_sink, settings=settings, registry=registry)
        await mirror.start()
        stack.push_async_callback(mirror.stop)
        readiness.append(("kubernetes-quotas", mirror.readiness))
    if settings.mirror_profiles:
        profile_sink = KubeProfileSink(
            api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
        )
        profile_mirror = ProfileMirror(bus, profile_sink, settings=settings, registry=registry)
        await profile_mirror.start()
        stack.push_async_callback(profile_mirror.stop)
        readiness.append(("kubernetes-colocation-profiles", profile_mirror.readiness))
    return Bridge(banner=f"watching and writing via {source}", readiness=readiness)


async def record_quotas(
    stack: AsyncExitStack, bus: Any, registry: Any, settings: Any, nodes_export: Any, *, verbs: Any = None
) -> Callable[[], Any]:
    """Record-only mode for the quota, NodeSLO, topology and (when on) ClusterColocationProfile mirrors, the agents'
    evictions and the load-aware extender's bindings too: what the recorded-writes route shows, ElasticQuotas,
    NodeSLOs, NodeResourceTopologies, evictions and Bindings included (and the migration executor's verbs, when
    `verbs` records them)."""
    from services.k8s.binder import BindResponder, RecordingBinder
    from services.k8s.eviction_executor import EvictionExecutor, RecordingEvictor
    from services.k8s.nodeslo_mirror import NodeSloMirror, RecordingNodeSloSink
    from services.k8s.profile_mirror import ProfileMirror, RecordingProfileSink
    from services.k8s.quota_mirror import QuotaMirror, RecordingQuotaSink
    from services.k8s.topology_mirror import RecordingTopologySink, TopologyMirror

    evictor = RecordingEvictor(keep=settings.recorded_writes_kept)
    executor = EvictionExecutor(bus, evictor, registry=registry)
    await executor.start()
    stack.push_async_callback(executor.stop)
    binder = RecordingBinder(keep=settings.recorded_writes_kept)
    if settings.bind_pods:
        responder = BindResponder(bus, binder, registry=registry)
        await responder.start()
        stack.push_async_callback(responder.stop)
    nodeslo_sink = RecordingNodeSloSink(keep=settings.recorded_writes_kept)
    nodeslo_mirror = NodeSloMirror(bus, nodeslo_sink, settings=settings, registry=registry)
    await nodeslo_mirror.start()
    stack.push_async_callback(nodeslo_mirror.stop)
    topology_sink = None
    if settings.mirror_topologies:
        topology_sink = RecordingTopologySink(keep=settings.recorded_writes_kept)
        topology_mirror = TopologyMirror(bus, topology_sink, settings=settings, registry=registry)
        await topology_mirror.start()
        stack.push_async_callback(topology_mirror.stop)
    quota_sink = None
    if settings.mirror_quotas:
        quota_sink = RecordingQuotaSink(keep=settings.recorded_writes_kept)
        mirror = QuotaMirror(bus, quota_sink, settings=settings, registry=registry)
        await mirror.start()
        stack.push_async_callback(mirror.stop)

    profile_sink = None
    if settings.mirror_profiles:
        profile_sink = RecordingProfileSink(keep=settings.recorded_writes_kept)
        profile_mirror = ProfileMirror(bus, profile_sink, settings=settings, registry=registry)
        await profile_mirror.start()
        stack.push_async_callback(profile_mirror.stop)

    def export() -> Any:
        quotas = {"quotas": quota_sink.export()} if quota_sink is not None else {}
        quotas |= {"colocationprofiles": profile_sink.export()} if profile_sink is not None else {}
        topologies = {"noderesourcetopologies": topology_sink.export()} if topology_sink is not None else {}
        return {
            **nodes_export(),
            **quotas,
            **topologies,
            "nodeslos": nodeslo_sink.export(),
            "evictions": evictor.export(),
            "bindings": binder.export(),
            **({"verbs": verbs.export()} if verbs is not None else {}),
        }

    return export
