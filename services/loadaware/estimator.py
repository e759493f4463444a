"""Koordinator's DefaultEstimator (spec §6.3): what a pod will use, and what a node offers. Pure.

`estimate_pod` scales the pod's effective request (or limit, whichever is larger) by the estimated scaling factor
of each resource, with Kubernetes' defaults (250m cpu, 200 MiB memory) for a pod that asks for nothing, capped at
the limit. Batch and mid pods are estimated on batch-*/mid-* resources but the estimate is keyed by the plain name,
because node usage is. `estimate_node` is the node's allocatable before Koordinator's amplification. Used by
services.loadaware.state (assigned pods) and core (the incoming pod).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from schemas import kube, resources, vocab
from services.loadaware.args import LoadAwareArgs

DEFAULT_MILLI_CPU_REQUEST: Final = 250
DEFAULT_MEMORY_REQUEST: Final = 200 * 1024 * 1024

ANNOTATION_SCALING_FACTORS: Final = "scheduling.koordinator.sh/load-estimated-scaling-factors"
ANNOTATION_AFTER_SCHEDULED: Final = "scheduling.koordinator.sh/load-estimated-seconds-after-pod-scheduled"
ANNOTATION_AFTER_INITIALIZED: Final = "scheduling.koordinator.sh/load-estimated-seconds-after-initialized"
ANNOTATION_RAW_ALLOCATABLE: Final = "node.koordinator.sh/raw-allocatable"

_TRANSLATED: Final[Mapping[str, Mapping[str, str]]] = {
    vocab.PRIORITY_BATCH: {resources.CPU: vocab.BATCH_CPU, resources.MEMORY: vocab.BATCH_MEMORY},
    vocab.PRIORITY_MID: {resources.CPU: vocab.MID_CPU, resources.MEMORY: vocab.MID_MEMORY},
}


def scaling_factors(pod: kube.Pod, args: LoadAwareArgs) -> Mapping[str, int]:
    """The args' factors, overlaid by the pod's annotation when allowCustomizeEstimation (a bad one is ignored)."""
    if not args.allow_customize_estimation:
        return args.estimated_scaling_factors
    raw = pod.metadata.annotations.get(ANNOTATION_SCALING_FACTORS)
    if raw is None:
        return args.estimated_scaling_factors
    try:
        custom = json.loads(raw)
    except ValueError:
        return args.estimated_scaling_factors
    if not isinstance(custom, dict) or not all(isinstance(v, int) and 0 <= v <= 100 for v in custom.values()):
        return args.estimated_scaling_factors
    return {**args.estimated_scaling_factors, **custom}


def estimate_pod(pod: kube.Pod, args: LoadAwareArgs) -> resources.ResourceList:
    """EstimatePod: per scaling-factor resource, round(max(request, limit) × factor / 100) capped at the limit;
    defaults for a pod that neither requests nor limits cpu or memory. Zero estimates are left out."""
    translate = _TRANSLATED.get(kube.pod_priority_class(pod), {})
    requests, limits = kube.pod_request(pod), kube.pod_limit(pod)
    out: resources.ResourceList = {}
    for name, factor in scaling_factors(pod, args).items():
        real = translate.get(name, name)
        limit = limits.get(real, 0)
        wanted = max(requests.get(real, 0), limit)
        if wanted == 0:
            if real in (resources.CPU, vocab.BATCH_CPU):
                estimate = DEFAULT_MILLI_CPU_REQUEST
            elif real in (resources.MEMORY, vocab.BATCH_MEMORY):
                estimate = DEFAULT_MEMORY_REQUEST
            else:
                estimate = 0
        else:
            estimate = (2 * wanted * factor + 100) // 200  # Go's math.Round of wanted × factor / 100 (non-negative)
            if limit > 0:
                estimate = min(estimate, limit)
        if estimate:
            out[name] = estimate
    return out


def _annotated_seconds(pod: kube.Pod, annotation: str, default: int | None, args: LoadAwareArgs) -> int | None:
    if args.allow_customize_estimation and (raw := pod.metadata.annotations.get(annotation)) is not None:
        try:
            return int(raw)
        except ValueError:
            return default
    return default


def estimation_windows(pod: kube.Pod, args: LoadAwareArgs) -> tuple[int | None, int | None]:
    """(seconds after PodScheduled, seconds after Initialized) during which the pod's estimate counts even once
    NodeMetric reports its usage; the args' values, or the pod's annotations when allowCustomizeEstimation."""
    return (
        _annotated_seconds(pod, ANNOTATION_AFTER_SCHEDULED, args.estimated_seconds_after_pod_scheduled, args),
        _annotated_seconds(pod, ANNOTATION_AFTER_INITIALIZED, args.estimated_seconds_after_initialized, args),
    )


def estimate_node(node: kube.Node) -> resources.ResourceList:
    """EstimateNode: allocatable, with the entries of the raw-allocatable annotation (before amplification)."""
    allocatable = kube.node_allocatable(node)
    raw = node.metadata.annotations.get(ANNOTATION_RAW_ALLOCATABLE)
    if raw:
        try:
            original = json.loads(raw)
            if isinstance(original, dict):
                allocatable.update(kube.resource_amounts({str(k): v for k, v in original.items()}))
        except ValueError:
            pass  # a bad annotation is ignored, as Koordinator does
    return allocatable
