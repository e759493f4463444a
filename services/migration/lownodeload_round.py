"""Koordinator's LowNodeLoad (spec §11) as the migration service runs it every descheduling interval. Pure.

The args file's `lowNodeLoadArgs` section is Koordinator's LowNodeLoadArgs v1alpha2 as written; beside it, at the
top level as in Koordinator's DeschedulerConfiguration, `deschedulingInterval` (a Go duration, ours defaults to 60 s)
and the descheduler's eviction limits `maxNoOfPodsToEvictPerNode`, `maxNoOfPodsToEvictPerNamespace`,
`maxNoOfPodsToEvictTotal` (unset: unlimited; counted per round, as the descheduler's PodEvictor is reset every
cycle). `read_section` decodes, defaults and validates it (ArgsError with Koordinator's validation message), and
refuses a document that also has the older simplified `lowNodeLoad` section (services.migration.lownodeload).
`effective_args` applies the slo-controller-config's load-watermarks-config to the top-level thresholds it names
(usageThresholds → highThresholds, lowThresholds, nodeMetricExpirationSeconds), so the default pool and every pool
that inherits them draw the scheduler's line. `run_round` builds the Balance round's inputs from what the service
holds (kube Nodes and Pods as the cluster stream carries them, NodeMetricComputed) in name order, runs
services.migration.lownodeload_balance with the caller's detectors, forgets the detectors not checked for
detectorCacheTimeout, and returns the round's `Decision`; the service turns its evictions into MigrationRequested.
Called by services.migration.service and koordbus.parts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Annotated, Any, Final

import msgspec

from schemas import kube, resources
from schemas.koordinator import parse_go_duration
from schemas.node import NodeMetricComputed
from schemas.qos import WatermarksInEffect
from schemas.scheduling import SchedulingNode, SchedulingPod, SchedulingPodSpec
from services.common import args as common_args
from services.common.args import ArgsError
from services.common.watermarks import WatermarkConfig, Watermarks, fields_set
from services.migration import anomaly
from services.migration import lownodeload_balance as balance
from services.migration.lownodeload_args import (
    DEFAULT_EXPIRATION_SECONDS,
    LowNodeLoadArgs,
    LowNodeLoadArgsJSON,
    error_message,
    resolve,
)

SECTION: Final = "lowNodeLoadArgs"
OLD_SECTION: Final = "lowNodeLoad"
DEFAULT_INTERVAL: Final = "60s"
DEFAULT_DETECTOR_CACHE_TIMEOUT: Final = Fraction(300)

Limit = Annotated[int, msgspec.Meta(ge=0)] | None


class DeschedulerJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The DeschedulerConfiguration fields read from the top level of the args file."""

    descheduling_interval: str = DEFAULT_INTERVAL
    max_no_of_pods_to_evict_per_node: Limit = None
    max_no_of_pods_to_evict_per_namespace: Limit = None
    max_no_of_pods_to_evict_total: Limit = None


@dataclass(frozen=True)
class Descheduling:
    """The LowNodeLoad plugin as configured: its args as written (the watermarks apply to a copy), the interval and
    the per-round eviction limits."""

    raw: LowNodeLoadArgsJSON
    interval_seconds: float
    limits: balance.Limits
    detector_cache_timeout: Fraction


def read_section(document: Any, *, source: str) -> Descheduling | None:
    """The `lowNodeLoadArgs` section of an args document (None when absent); ArgsError naming what is wrong."""
    if not isinstance(document, Mapping) or SECTION not in document:
        return None
    if OLD_SECTION in document:
        raise ArgsError(
            f"{source}: both {OLD_SECTION} and {SECTION} are set: write only {SECTION} (Koordinator's LowNodeLoadArgs: "
            f"highThresholds, lowThresholds, anomalyCondition.consecutiveAbnormalities, nodeMetricExpirationSeconds "
            f"…; maxNoOfPodsToEvictPerNode and deschedulingInterval at the top level)"
        )
    section = document[SECTION]
    raw = common_args.convert(section, LowNodeLoadArgsJSON, name="LowNodeLoadArgs", source=f"{source}: {SECTION}")
    top = common_args.convert(
        {k: document[k] for k in DESCHEDULER_KEYS if k in document},
        DeschedulerJSON,
        name="DeschedulerConfiguration",
        source=source,
    )
    interval = common_args.duration_seconds(top.descheduling_interval, field="deschedulingInterval", negative=False)
    if interval <= 0:
        raise ArgsError(f"{source}: deschedulingInterval must be positive, got {top.descheduling_interval!r}")
    try:
        cache_timeout = (
            parse_go_duration(raw.detector_cache_timeout)
            if raw.detector_cache_timeout
            else DEFAULT_DETECTOR_CACHE_TIMEOUT
        )
    except ValueError:
        raise ArgsError(
            f"{source}: {SECTION}.detectorCacheTimeout: invalid duration {raw.detector_cache_timeout!r}"
        ) from None
    resolved = _resolve(raw, source=source)
    if resolved.problems:
        raise ArgsError(f"{source}: {SECTION}: {error_message(resolved.problems)}")
    return Descheduling(
        raw=raw,
        interval_seconds=float(interval),
        limits=balance.Limits(
            per_node=top.max_no_of_pods_to_evict_per_node,
            per_namespace=top.max_no_of_pods_to_evict_per_namespace,
            total=top.max_no_of_pods_to_evict_total,
        ),
        detector_cache_timeout=cache_timeout,
    )


DESCHEDULER_KEYS: Final = (
    "deschedulingInterval",
    "maxNoOfPodsToEvictPerNode",
    "maxNoOfPodsToEvictPerNamespace",
    "maxNoOfPodsToEvictTotal",
)


def _copy(raw: LowNodeLoadArgsJSON) -> LowNodeLoadArgsJSON:
    """A deep copy: resolve and the round write into the threshold maps and conditions they are given."""
    return msgspec.convert(msgspec.to_builtins(raw), LowNodeLoadArgsJSON)


def _resolve(raw: LowNodeLoadArgsJSON, *, source: str) -> LowNodeLoadArgs:
    try:
        return resolve(_copy(raw))
    except ValueError as err:
        raise ArgsError(f"{source}: {SECTION}.{err}") from None


def effective_args(descheduling: Descheduling, marks: Watermarks) -> LowNodeLoadArgs:
    """The resolved args with the load-watermarks-config applied to the top-level fields it names: usageThresholds
    become highThresholds (a 0, a resource the scheduler does not check, becomes 100: never over), lowThresholds
    lowThresholds, nodeMetricExpirationSeconds the expiration. Pools with their own maps keep them. The result may
    carry validation problems (e.g. a watermark low above a pool's high): the round does not run then."""
    return resolve(_with_marks(descheduling, marks))


def _with_marks(descheduling: Descheduling, marks: Watermarks) -> LowNodeLoadArgsJSON:
    raw = _copy(descheduling.raw)
    if marks.usage_thresholds is not None:
        raw.high_thresholds = {r: float(v) if v > 0 else 100.0 for r, v in marks.usage_thresholds.items()}
    if marks.low_thresholds is not None:
        raw.low_thresholds = {r: float(v) for r, v in marks.low_thresholds.items()}
    if marks.node_metric_expiration_seconds is not None:
        raw.node_metric_expiration_seconds = marks.node_metric_expiration_seconds
    return raw


# --- inputs


def scheduling_node(node: kube.Node) -> SchedulingNode:
    """The node as the round reads it (the cluster stream carries SchedulingNodes: taints and unschedulable; a plain
    kube.Node, as tests and calc inputs may give, has neither)."""
    if isinstance(node, SchedulingNode):
        return node
    return SchedulingNode(metadata=node.metadata, status=node.status)


def scheduling_pod(pod: kube.Pod) -> SchedulingPod:
    """The pod as the round reads it (the cluster stream carries SchedulingPods: nodeSelector, affinity and
    tolerations; a plain kube.Pod has none)."""
    if isinstance(pod, SchedulingPod):
        return pod
    spec = SchedulingPodSpec(**{f.name: getattr(pod.spec, f.name) for f in msgspec.structs.fields(pod.spec)})
    return SchedulingPod(metadata=pod.metadata, spec=spec, status=pod.status)


def _amounts(raw: Mapping[str, int]) -> dict[str, Fraction]:
    """NodeMetric integer amounts (millicores for cpu-like resources, units otherwise) as exact quantity values."""
    return {name: Fraction(v, 1000) if resources.is_milli_resource(name) else Fraction(v) for name, v in raw.items()}


def metric_view(metric: NodeMetricComputed) -> balance.NodeMetricView:
    status = metric.status
    return balance.NodeMetricView(
        update_time=Fraction(status.update_time) if status.update_time else None,
        has_node_metric=True,
        system_usage=_amounts(status.node_metric.system_usage.resources),
        pods=[(f"{m.namespace}/{m.name}", _amounts(m.pod_usage.resources)) for m in status.pods_metric],
    )


# --- the round


def job_name(pod: kube.Pod) -> str:
    """The descheduler's job name for a pod (from its uid): a pod is asked for once, however many rounds pick it."""
    meta = pod.metadata
    digest = hashlib.blake2b(f"{meta.namespace}/{meta.name}/{meta.uid}".encode(), digest_size=8).hexdigest()
    return "lownodeload-" + digest


@dataclass
class Evictor(balance.Evictor):
    """The descheduler's limits in front of the MigrationController's Evict: a pod that already has a job (an active
    one, §4.5 1, or the one this descheduler asked for) is refused, so it is skipped with no accounting (§11.6)."""

    refused: Collection[str] = ()
    """namespace/name of the pods refused."""

    def evict(self, pod: kube.Pod) -> bool:
        return kube.pod_key(pod) not in self.refused and super().evict(pod)


@dataclass
class Detectors:
    """The anomaly detectors kept across rounds (node level and prod level) and when each was last checked."""

    node: dict[str, anomaly.Detector] = field(default_factory=dict)
    prod: dict[str, anomaly.Detector] = field(default_factory=dict)
    checked: dict[str, Fraction] = field(default_factory=dict)
    prod_checked: dict[str, Fraction] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """One round's outcome, kept by the service for the API and dashboard."""

    at: float
    dry_run: bool
    paused: bool
    problems: tuple[str, ...]
    """Validation problems of the effective args (the round did not run)."""
    pools: tuple[balance.PoolResult, ...] = ()
    evictions: tuple[balance.Eviction, ...] = ()


def _forget(
    detectors: MutableMapping[str, anomaly.Detector],
    checked: MutableMapping[str, Fraction],
    now_checked: Iterable[str],
    now: Fraction,
    timeout: Fraction,
) -> None:
    for name in now_checked:
        if name in detectors:
            checked[name] = now
    for name in list(detectors):
        last = checked.setdefault(name, now)
        if now - last >= timeout:
            del detectors[name]
            del checked[name]
    for name in list(checked):
        if name not in detectors:
            del checked[name]


def run_round(
    args: LowNodeLoadArgs,
    *,
    nodes: Iterable[kube.Node],
    metrics: Mapping[str, NodeMetricComputed],
    pods: Iterable[kube.Pod],
    limits: balance.Limits,
    detectors: Detectors,
    cache_timeout: Fraction = DEFAULT_DETECTOR_CACHE_TIMEOUT,
    refused: Collection[str] = (),
    now: float,
) -> Decision:
    """One Balance round over the service's view (nodes and pods in name order, Koordinator's being arbitrary);
    `refused`: the pods (namespace/name) the evictor refuses, having a job already."""
    if args.problems:
        return Decision(at=now, dry_run=args.dry_run, paused=args.paused, problems=args.problems)
    at = Fraction(now)
    ordered_nodes: Sequence[SchedulingNode] = [scheduling_node(n) for n in sorted(nodes, key=lambda n: n.metadata.name)]
    ordered_pods = [scheduling_pod(p) for p in sorted(pods, key=kube.pod_key)]
    rnd = balance.Round(
        args=args,
        nodes=ordered_nodes,
        metrics={name: metric_view(m) for name, m in metrics.items()},
        pods_on=balance.pods_by_node(ordered_pods),
        now=at,
        evictor=Evictor(limits, refused=refused),
        detectors=detectors.node,
        prod_detectors=detectors.prod,
    )
    balance.balance(rnd)
    _forget(
        detectors.node, detectors.checked, [n for p in rnd.pools for n in p.classes["highNodes"]], at, cache_timeout
    )
    _forget(
        detectors.prod,
        detectors.prod_checked,
        [n for p in rnd.pools for n in p.classes["prodHighNodes"]],
        at,
        cache_timeout,
    )
    return Decision(
        at=now,
        dry_run=args.dry_run,
        paused=args.paused,
        problems=(),
        pools=tuple(rnd.pools),
        evictions=tuple(rnd.evictions),
    )


def stated_watermarks(descheduling: Descheduling, config: WatermarkConfig, *, at: float) -> WatermarksInEffect:
    """What the descheduler decides with (the top-level high and low thresholds and the expiration, as written with
    the watermarks applied, before a round fills in missing resources), as it states it on the KOORD_SLO bucket."""
    raw = _with_marks(descheduling, config.watermarks)
    expiration = raw.node_metric_expiration_seconds
    return WatermarksInEffect(
        service="descheduler",
        at=at,
        enabled=not raw.paused,
        usage_thresholds=dict(raw.high_thresholds or {}),
        low_thresholds=dict(raw.low_thresholds or {}),
        stale_after_seconds=float(DEFAULT_EXPIRATION_SECONDS if expiration is None else expiration),
        from_configmap=fields_set(config.watermarks),
        configmap_errors=dict(config.errors),
    )
