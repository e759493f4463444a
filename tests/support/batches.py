"""Build and read NodeMetricsReported pod columns in per-pod terms, for tests that think in pods.

Tests describe a batch as pods with their (t, cpu, memory) samples; these helpers turn that into the
columnar wire form (schemas.node.PodSampleColumns) and back, so assertions stay about pods and samples.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.node import ContainerRef, NodeMetricsReported, PodRef, PodSampleColumns

Sample = tuple[float, float, int]


def pod_columns(
    pods: Sequence[tuple[PodRef, Sequence[Sample]]], *, memory_with_page_cache: Sequence[int] = ()
) -> dict[str, object]:
    """`pods=` and `pod_samples=` keyword arguments of a NodeMetricsReported holding `pods` in the given order."""
    index: list[int] = []
    rows: list[Sample] = []
    for i, (_ref, samples) in enumerate(pods):
        index += [i] * len(samples)
        rows += samples
    columns = PodSampleColumns.of(
        pod=index,
        t=[s[0] for s in rows],
        cpu=[s[1] for s in rows],
        memory=[int(s[2]) for s in rows],
        memory_with_page_cache=list(memory_with_page_cache),
    )
    return {"pods": [ref for ref, _ in pods], "pod_samples": columns}


def samples_by_pod(batch: NodeMetricsReported) -> list[tuple[PodRef, list[Sample]]]:
    """Every pod of the batch with its samples, in `pods` order (pods without rows get an empty list)."""
    out: list[tuple[PodRef, list[Sample]]] = [(ref, []) for ref in batch.pods]
    for i, t, cpu, mem in batch.pod_samples.arrays().rows():
        out[i][1].append((t, cpu, mem))
    return out


def page_cache_by_pod(batch: NodeMetricsReported) -> dict[str, list[tuple[float, int]]]:
    """(t, memory with page cache) per pod uid, for pods whose batch carries the page-cache column."""
    c = batch.pod_samples.arrays()
    out: dict[str, list[tuple[float, int]]] = {}
    for i, t, mem in zip(c.index.tolist(), c.t.tolist(), c.memory_with_page_cache.tolist(), strict=False):
        out.setdefault(batch.pods[i].uid, []).append((t, mem))
    return out


def containers_by_pod(batch: NodeMetricsReported) -> dict[str, list[tuple[ContainerRef, list[Sample]]]]:
    """Each pod uid's containers with their samples, in `containers` order."""
    per_container: list[list[Sample]] = [[] for _ in batch.containers]
    for i, t, cpu, mem in batch.container_samples.arrays().rows():
        per_container[i].append((t, cpu, mem))
    out: dict[str, list[tuple[ContainerRef, list[Sample]]]] = {}
    for ref, samples in zip(batch.containers, per_container, strict=True):
        out.setdefault(batch.pods[ref.pod].uid, []).append((ref, samples))
    return out
