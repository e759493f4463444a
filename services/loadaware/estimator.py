"""Koordinator's DefaultEstimator (spec §6.3): what a pod will use, and what a node offers. Pure.

`estimate_factors` is Koordinator's EstimatePod: per scaling-factor key, the pod's effective request (or limit,
whichever is larger) scaled by the factor and rounded like Go's `math.Round(float64(v) × float64(f) / 100)`, capped
at the limit; Kubernetes' defaults (250m cpu, 200 MiB memory) for a pod that asks for nothing. Batch and mid pods are
estimated on batch-*/mid-* resources, keyed by the plain name because node usage is; a key their class has no
resource for (and every key of a koord-free pod) estimates 0. With allowCustomizeEstimation the pod's annotation
replaces the factors (any int64, as Koordinator reads it). `estimate_pod` is that map without its zeros.
`estimation_windows` reads the seconds after PodScheduled / Initialized during which an estimate keeps counting;
`estimate_node` is the node's allocatable before Koordinator's amplification. Used by services.loadaware.state
(assigned pods), core (the incoming pod) and `koordbus calc loadaware-estimate`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from schemas import kube, quantity, resources, vocab
from services.common import gojson
from services.loadaware.args import LoadAwareArgs

DEFAULT_MILLI_CPU_REQUEST: Final = 250
DEFAULT_MEMORY_REQUEST: Final = 200 * 1024 * 1024

ANNOTATION_SCALING_FACTORS: Final = "scheduling.koordinator.sh/load-estimated-scaling-factors"
ANNOTATION_AFTER_SCHEDULED: Final = "scheduling.koordinator.sh/load-estimated-seconds-after-pod-scheduled"
ANNOTATION_AFTER_INITIALIZED: Final = "scheduling.koordinator.sh/load-estimated-seconds-after-initialized"
ANNOTATION_RAW_ALLOCATABLE: Final = "node.koordinator.sh/raw-allocatable"

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
_GO_DECIMAL_INT: Final = re.compile(r"[+-]?[0-9]+")
"""What Go's strconv.ParseInt(s, 10, 64) accepts (besides the range): a sign and ASCII digits, nothing else."""

_TRANSLATED: Final[Mapping[str, Mapping[str, str]]] = {
    vocab.PRIORITY_BATCH: {resources.CPU: vocab.BATCH_CPU, resources.MEMORY: vocab.BATCH_MEMORY},
    vocab.PRIORITY_MID: {resources.CPU: vocab.MID_CPU, resources.MEMORY: vocab.MID_MEMORY},
}
_UNTRANSLATED: Final = frozenset({vocab.PRIORITY_PROD, vocab.PRIORITY_NONE})


def go_round(x: float) -> float:
    """Go's math.Round: to the nearest integer, halves away from zero (exact for every float64)."""
    whole = math.trunc(x)
    return whole + math.copysign(1.0, x) if abs(x - whole) >= 0.5 else whole


def _custom_factors(raw: str) -> dict[str, int] | None:
    """The annotation as Go's json.Unmarshal into map[ResourceName]int64 reads it (services.common.gojson); None when
    that fails. `null` is an empty map."""
    problems: list[gojson.Problem] = []
    try:
        decoded = gojson.decode_onto(gojson.UNSET, gojson.parse(raw), "int64-map", "$", problems)
    except gojson.GoJsonError:
        return None
    if problems:
        return None
    return {} if decoded is gojson.UNSET else dict(decoded)


def scaling_factors(pod: kube.Pod, args: LoadAwareArgs) -> Mapping[str, int]:
    """The args' factors, or with allowCustomizeEstimation the pod's annotation completed by them (an annotation
    that is not a JSON object of integers, or an empty one, leaves the args' factors)."""
    if not args.allow_customize_estimation:
        return args.estimated_scaling_factors
    raw = pod.metadata.annotations.get(ANNOTATION_SCALING_FACTORS, "")
    custom = _custom_factors(raw) if raw else None
    if not custom:
        return args.estimated_scaling_factors
    return {**args.estimated_scaling_factors, **custom}


def _real_resource(priority_class: str, name: str) -> str | None:
    """The resource a pod of this class is estimated on for factor key `name`; None: its class has none."""
    if priority_class in _UNTRANSLATED:
        return name
    return _TRANSLATED.get(priority_class, {}).get(name)


def _estimate(requests: Mapping[str, int], limits: Mapping[str, int], real: str | None, factor: int) -> int:
    if real is None:
        return 0
    limit = limits.get(real, 0)
    wanted = max(requests.get(real, 0), limit)
    if wanted == 0:
        if real in (resources.CPU, vocab.BATCH_CPU):
            return DEFAULT_MILLI_CPU_REQUEST
        if real in (resources.MEMORY, vocab.BATCH_MEMORY):
            return DEFAULT_MEMORY_REQUEST
        return 0
    estimate = int(go_round(float(wanted) * float(factor) / 100))
    return limit if 0 < limit < estimate else estimate


def estimate_factors(pod: kube.Pod, args: LoadAwareArgs) -> dict[str, int]:
    """Koordinator's EstimatePod: one estimate per scaling-factor key, zeros included (cpu in millicores)."""
    priority_class = kube.pod_priority_class(pod)
    requests, limits = kube.pod_request(pod), kube.pod_limit(pod)
    return {
        name: _estimate(requests, limits, _real_resource(priority_class, name), factor)
        for name, factor in scaling_factors(pod, args).items()
    }


def estimate_pod(pod: kube.Pod, args: LoadAwareArgs) -> resources.ResourceList:
    """`estimate_factors` without its zeros (the calculations read it on the resource vector only)."""
    return {name: amount for name, amount in estimate_factors(pod, args).items() if amount}


def _annotated_seconds(pod: kube.Pod, annotation: str) -> int:
    """Koordinator's GetCustomEstimatedSeconds…: the annotation as a base-10 int64, else -1."""
    raw = pod.metadata.annotations.get(annotation, "")
    if _GO_DECIMAL_INT.fullmatch(raw) and INT64_MIN <= (value := int(raw)) <= INT64_MAX:
        return value
    return -1


def estimation_windows(pod: kube.Pod, args: LoadAwareArgs) -> tuple[int, int]:
    """(seconds after PodScheduled, seconds after Initialized) during which the pod's estimate counts even once
    NodeMetric reports its usage; -1: none. With allowCustomizeEstimation the pod's annotations first; where that
    leaves a negative value the args' value applies when set."""
    after_scheduled = after_initialized = -1
    if args.allow_customize_estimation:
        after_scheduled = _annotated_seconds(pod, ANNOTATION_AFTER_SCHEDULED)
        after_initialized = _annotated_seconds(pod, ANNOTATION_AFTER_INITIALIZED)
    if after_scheduled < 0 and args.estimated_seconds_after_pod_scheduled is not None:
        after_scheduled = args.estimated_seconds_after_pod_scheduled
    if after_initialized < 0 and args.estimated_seconds_after_initialized is not None:
        after_initialized = args.estimated_seconds_after_initialized
    return after_scheduled, after_initialized


def raw_allocatable(annotations: Mapping[str, str]) -> resources.ResourceList | None:
    """The raw-allocatable annotation as Go reads it into a ResourceList; None when absent or unreadable."""
    raw = annotations.get(ANNOTATION_RAW_ALLOCATABLE)
    if raw is None:
        return None
    try:
        decoded: Any = json.loads(raw)
        if decoded is None:
            return {}
        if not isinstance(decoded, dict):
            return None
        return quantity.resource_list({str(k): v for k, v in decoded.items()})
    except ValueError:  # not JSON, or a quantity that does not parse (QuantityError is a ValueError)
        return None


def estimate_node(node: kube.Node) -> resources.ResourceList:
    """EstimateNode: allocatable, with the entries of the raw-allocatable annotation (before amplification) when it
    can be read and is not empty; an unreadable one is ignored, as Koordinator does."""
    allocatable = kube.node_allocatable(node)
    original = raw_allocatable(node.metadata.annotations)
    if original:
        allocatable.update(original)
    return allocatable
