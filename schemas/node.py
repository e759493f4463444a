"""Node events: what an agent reports about its node, and what nodemetric computes from it.

Published by agent/ (NodeMetricsReported, NodeStateReported) and services/nodemetric
(NodeMetricComputed); read by nodemetric, the API and every later per-node service.
Field constraints are the first line of defence: a negative or absurd sample fails decoding
and the message goes to the dead-letter subject instead of into a window.

Wire format: the node subjects (`koord.v1.node.<node>.metrics|state`) carry msgpack, because the
float-heavy batches are the hottest input of the system (about half the bytes of JSON and cheaper to
decode); every other subject carries JSON. `encode_node_event` and `NODE_EVENT_DECODER` are the only
place that choice is made: publishers and the ingest consumer go through them.

The binary sample columns are checked where they cross a trust boundary, when decoded (NODE_EVENT_DECODER), with
numpy; building a batch (the agent) packs the columns with the standard library's `array` and checks nothing, so
an agent never loads numpy (16 MB of every node's agent). numpy is imported on first use.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import msgspec

from schemas import names
from schemas.cpi import PodCpiSamples, check_pod_cpi
from schemas.psi import PodPsiColumns, PsiMetric, PsiSamples

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# --- constrained scalars

NodeName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=names.MAX_OBJECT_NAME,
        pattern=names.SUBDOMAIN_PATTERN,
        description="Kubernetes node name (DNS-1123 subdomain)",
    ),
]
UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800, description="seconds since the epoch")]
Cores = Annotated[float, msgspec.Meta(ge=0, le=100_000, description="CPU usage in cores")]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**53, description="bytes")]
Seconds = Annotated[int, msgspec.Meta(ge=1, le=7 * 24 * 3600)]
MilliCores = Annotated[int, msgspec.Meta(ge=0, le=100_000_000, description="CPU in millicores")]

Sample = tuple[UnixSeconds, Cores, Bytes]
"""One collection: (time, CPU cores, memory bytes)."""
NumaId = Annotated[int, msgspec.Meta(ge=0, le=1023, description="NUMA node id")]
NumaSample = tuple[UnixSeconds, NumaId, Cores, Bytes, Cores, Bytes]
"""One NUMA node at one collection: (time, NUMA node id, CPU cores, memory bytes, system CPU cores, system memory
bytes); see agent.numa for how each is estimated."""
MAX_NUMA_SAMPLES = 1024 * 3600
MemorySample = tuple[UnixSeconds, Bytes]


# --- reported by the agent


class PodRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the agent knows about a pod: always its UID and kube QoS (from the cgroup path), the rest once the
    kubelet's pod list names the UID (agent.batch.attribute_pods): namespace, name, spec.priority,
    spec.priorityClassName and the Koordinator priority/QoS labels. A pod with an empty `name` is known by UID only
    (its cgroup appeared before the kubelet listed it)."""

    uid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    kube_qos: str = ""
    namespace: str = ""
    name: str = ""
    priority: int | None = None
    labels: dict[str, str] = {}
    priority_class_name: str = ""
    """spec.priorityClassName (informational: Koordinator's classes come from the labels and spec.priority)."""
    cpu_request: MilliCores = 0
    """The pod's effective CPU request (schemas.kube.pod_request) in millicores; with `memory_request`, what the
    prod predictor counts as the pod's request (spec §1.7)."""
    memory_request: Bytes = 0
    created_at: UnixSeconds | None = None
    """metadata.creationTimestamp: a prod pod younger than the predictor's cold start counts its whole request."""
    terminating: bool = False
    """deletionTimestamp set, or phase Succeeded/Failed: the predictors leave the pod out."""


PodIndex = Annotated[int, msgspec.Meta(ge=0, description="position of a pod in the batch's `pods`")]


class ContainerRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One container of a batch: the pod it belongs to (an index into `pods`), its runtime ID and name."""

    pod: PodIndex
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    name: str = ""


# --- binary sample columns

INDEX_DTYPE = "<u2"
"""Row -> pod (container) index: at most 65,535 pods or containers per batch."""
TIME_DTYPE = "<f8"
CPU_DTYPE = "<f8"
MEMORY_DTYPE = "<i8"
_ARRAY_CODE = {INDEX_DTYPE: "H", TIME_DTYPE: "d", MEMORY_DTYPE: "q"}
"""The standard library's `array` type code of each little-endian column type (the same sizes on every platform)."""
_TIME_RANGE = (0.0, 4_102_444_800.0)
_CPU_RANGE = (0.0, 100_000.0)
_MEMORY_RANGE = (0, 2**53)


@dataclass(frozen=True)
class SampleArrays:
    """The rows of a batch's pod (or container) samples as read-only numpy arrays; `index` is the pod or
    container of each row, `memory_with_page_cache` is empty or has one value per row."""

    index: npt.NDArray[np.uint16]
    t: npt.NDArray[np.float64]
    cpu: npt.NDArray[np.float64]
    memory: npt.NDArray[np.int64]
    memory_with_page_cache: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.index.size)

    def rows(self) -> list[tuple[int, float, float, int]]:
        """(index, t, cpu, memory) per row as Python numbers, for callers that think in rows."""
        return list(zip(self.index.tolist(), self.t.tolist(), self.cpu.tolist(), self.memory.tolist(), strict=True))


def _pack(values: Sequence[float], dtype: str) -> bytes:
    try:
        packed = array.array(_ARRAY_CODE[dtype], values)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"a value does not fit a {dtype} column: {e}") from None
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


class _SampleColumns(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Rows of samples as parallel little-endian binary columns (msgpack bin): the index column names the pod
    or container of each row, then time, CPU cores, memory bytes (and, for pods, memory with page cache).

    Binary instead of msgpack arrays of numbers because this is the system's hottest input: a column decodes
    as one buffer that numpy reads in place, instead of a Python object per number (about 15x cheaper for
    a 100-pod batch). Validation is vectorised too: every row is checked against the same ranges the scalar
    fields have, and a bad batch fails decoding with the column and row named.
    """

    _table: ClassVar[str]
    _index_name: ClassVar[str]

    t: bytes = b""
    cpu: bytes = b""
    memory: bytes = b""
    memory_with_page_cache: bytes = b""

    def _index_bytes(self) -> bytes:
        raise NotImplementedError

    def arrays(self) -> SampleArrays:
        """The columns as numpy views of the message's buffers (no copy)."""
        import numpy as np

        return SampleArrays(
            index=np.frombuffer(self._index_bytes(), INDEX_DTYPE),
            t=np.frombuffer(self.t, TIME_DTYPE),
            cpu=np.frombuffer(self.cpu, CPU_DTYPE),
            memory=np.frombuffer(self.memory, MEMORY_DTYPE),
            memory_with_page_cache=np.frombuffer(self.memory_with_page_cache, MEMORY_DTYPE),
        )

    def __len__(self) -> int:
        return len(self._index_bytes()) // 2  # INDEX_DTYPE's size

    def check(self) -> None:
        """ValueError, saying what is wrong, when the columns are inconsistent or a value is out of range."""
        import numpy as np

        table, index_name = self._table, self._index_name
        index = _column(table, index_name, self._index_bytes(), INDEX_DTYPE, None)
        rows = index.size
        for name, raw, dtype, bounds in (
            ("t", self.t, TIME_DTYPE, _TIME_RANGE),
            ("cpu", self.cpu, CPU_DTYPE, _CPU_RANGE),
            ("memory", self.memory, MEMORY_DTYPE, _MEMORY_RANGE),
        ):
            size = _column(table, name, raw, dtype, bounds).size
            if size != rows:
                raise ValueError(
                    f"{table}: every column needs {rows} rows, one per `{index_name}` entry, but `{name}` has {size}"
                )
        if self.memory_with_page_cache:
            size = _column(
                table, "memory_with_page_cache", self.memory_with_page_cache, MEMORY_DTYPE, _MEMORY_RANGE
            ).size
            if size != rows:
                raise ValueError(
                    f"{table}: `memory_with_page_cache` is optional but then needs {rows} rows, it has {size}"
                )
        if rows > 1 and (decreasing := np.flatnonzero(index[1:] < index[:-1])).size:
            row = int(decreasing[0]) + 1
            raise ValueError(
                f"{table}: rows must be grouped by {index_name} in list order, but row {row} ({index_name} "
                f"{index[row]}) follows {index_name} {index[row - 1]}"
            )


def _column(table: str, name: str, raw: bytes, dtype: str, bounds: tuple[float, float] | None) -> npt.NDArray[Any]:
    import numpy as np

    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise ValueError(f"{table}: `{name}` holds {len(raw)} bytes, not a whole number of {itemsize}-byte values")
    values = np.frombuffer(raw, dtype)
    if bounds is None or not values.size:
        return values
    low, high = bounds
    if values.min() >= low and values.max() <= high:  # NaN propagates through min/max and fails both
        return values
    row = int(np.flatnonzero(~((values >= low) & (values <= high)))[0])
    raise ValueError(f"{table}: `{name}` row {row} is {values[row]}, outside [{low:g}, {high:g}]")


class PodSampleColumns(_SampleColumns, frozen=True, kw_only=True, omit_defaults=True):
    """Every pod sample of a batch: row i is pod `pod[i]` (an index into the batch's `pods`) at t[i].

    Rows of one pod are contiguous and in time order, pods in `pods` order. Memory excludes page cache
    (spec §1.4); `memory_with_page_cache` is either empty or has one value per row. Build with `of`.
    """

    _table: ClassVar[str] = "pod_samples"
    _index_name: ClassVar[str] = "pod"

    pod: bytes = b""

    def _index_bytes(self) -> bytes:
        return self.pod

    @classmethod
    def of(
        cls,
        *,
        pod: Sequence[int],
        t: Sequence[float],
        cpu: Sequence[float],
        memory: Sequence[int],
        memory_with_page_cache: Sequence[int] = (),
    ) -> PodSampleColumns:
        """Columns from per-row sequences (not checked: see the module docstring); ValueError when a value does not
        fit its column type."""
        return cls(
            pod=_pack(pod, INDEX_DTYPE),
            t=_pack(t, TIME_DTYPE),
            cpu=_pack(cpu, CPU_DTYPE),
            memory=_pack(memory, MEMORY_DTYPE),
            memory_with_page_cache=_pack(memory_with_page_cache, MEMORY_DTYPE),
        )


class ContainerSampleColumns(_SampleColumns, frozen=True, kw_only=True, omit_defaults=True):
    """Every container sample of a batch, grouped by container like PodSampleColumns by pod (no page-cache column)."""

    _table: ClassVar[str] = "container_samples"
    _index_name: ClassVar[str] = "container"

    container: bytes = b""

    def _index_bytes(self) -> bytes:
        return self.container

    @classmethod
    def of(
        cls, *, container: Sequence[int], t: Sequence[float], cpu: Sequence[float], memory: Sequence[int]
    ) -> ContainerSampleColumns:
        return cls(
            container=_pack(container, INDEX_DTYPE),
            t=_pack(t, TIME_DTYPE),
            cpu=_pack(cpu, CPU_DTYPE),
            memory=_pack(memory, MEMORY_DTYPE),
        )


def _require_grouped(table: str, index: list[int], what: str) -> None:
    """Rows of one pod (container) are contiguous and in the order of the list they index: no index decreases."""
    # sorted() over an already sorted list is one linear pass in C, far cheaper than a Python loop over the rows.
    if index != sorted(index):
        row = next(i for i in range(1, len(index)) if index[i] < index[i - 1])
        raise ValueError(
            f"{table}: rows must be grouped by {what} in list order, but row {row} ({what} {index[row]}) "
            f"follows {what} {index[row - 1]}"
        )


def _require_in_range(table: str, index: Sequence[int] | npt.NDArray[Any], size: int, listed: str) -> None:
    import numpy as np

    if len(index) and (highest := int(np.max(index))) >= size:
        raise ValueError(f"{table}: index {highest} is out of range, the batch lists {size} {listed}")


TRAINING_PERCENTILE = 0.9
"""A training round's sample of a series is the nearest-rank p90 of its values over the round (spec §1.7)."""
MAX_TRAINING_ROUND_SECONDS = 3600


class TrainingRound(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One training round of the prod predictor's models (spec §1.7), as the agent measured it over [start, end):
    the nearest-rank p90 of the node's CPU and memory samples (absent without node samples) and, per pod of the
    batch's pod list that had samples, of its CPU and (without page cache) memory samples. `pods` indexes the
    batch's pod list; `pod_cpu` and `pod_memory` are parallel to it."""

    start: UnixSeconds
    end: UnixSeconds
    node_cpu: Cores | None = None
    node_memory: Bytes | None = None
    pods: list[PodIndex] = []
    pod_cpu: list[Cores] = []
    pod_memory: list[Bytes] = []

    def check(self, listed_pods: int | None) -> None:
        """ValueError, saying what is wrong, when the round is inconsistent; `listed_pods` is the size of the
        batch's pod list, None when the batch names it by digest (the reader checks the indexes then)."""
        if not self.start < self.end <= self.start + MAX_TRAINING_ROUND_SECONDS:
            raise ValueError(
                f"training: `end` {self.end} must be after `start` {self.start} by at most "
                f"{MAX_TRAINING_ROUND_SECONDS} s"
            )
        if (self.node_cpu is None) != (self.node_memory is None):
            raise ValueError("training: `node_cpu` and `node_memory` come together or not at all")
        if not len(self.pods) == len(self.pod_cpu) == len(self.pod_memory):
            raise ValueError(
                f"training: `pods`, `pod_cpu` and `pod_memory` must be parallel, they have {len(self.pods)}, "
                f"{len(self.pod_cpu)} and {len(self.pod_memory)} entries"
            )
        if len(set(self.pods)) != len(self.pods):
            raise ValueError("training: a pod appears twice in `pods`")
        if listed_pods is not None:
            _require_in_range("training.pods", self.pods, listed_pods, "pods")


MAX_HOST_APPLICATIONS = 64
"""Host applications one batch may carry (Koordinator sets no bound; a node runs a handful)."""
MAX_HOST_APPLICATION_SAMPLES = 86_400
"""Samples of one host application in one batch: a day of 1 s samples, far beyond any publish interval."""

PriorityClassName = Literal["", "koord-prod", "koord-mid", "koord-batch", "koord-free"]
"""Koordinator's priority classes (schemas.vocab; "" is None)."""
QoSClassName = Literal["", "LSE", "LSR", "LS", "BE", "SYSTEM"]
"""Koordinator's QoS classes (schemas.vocab; "" is None)."""
HostApplicationName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=names.MAX_HOST_APPLICATION_NAME,
        pattern=names.HOST_APPLICATION_NAME_PATTERN,
        description="a NodeSLO host application's name (schemas.names.host_application_name)",
    ),
]


class HostApplicationSamples(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One host application of the node's NodeSLO (`spec.hostApplications`, spec §7.1) over one batch: its samples
    taken on its cgroup as a pod's are (spec §1.4: CPU cores, memory without page cache), the page cache variant
    (memory.usage_in_bytes, v2 memory.current) one per sample or none, and the priority and QoS classes the NodeSLO
    gives it."""

    name: HostApplicationName
    samples: Annotated[list[Sample], msgspec.Meta(min_length=1, max_length=MAX_HOST_APPLICATION_SAMPLES)]
    memory_with_page_cache: Annotated[list[Bytes], msgspec.Meta(max_length=MAX_HOST_APPLICATION_SAMPLES)] = []
    priority: PriorityClassName = ""
    qos: QoSClassName = ""

    def check(self) -> None:
        """ValueError, saying what is wrong, when the page-cache column does not match the samples."""
        if self.memory_with_page_cache and len(self.memory_with_page_cache) != len(self.samples):
            raise ValueError(
                f"host application {self.name!r}: `memory_with_page_cache` is optional but then needs "
                f"{len(self.samples)} values, one per sample, it has {len(self.memory_with_page_cache)}"
            )


def _check_host_applications(apps: Sequence[HostApplicationSamples]) -> None:
    seen: dict[str, int] = {}
    for i, app in enumerate(apps):
        where = f" - at `$.host_applications[{i}]`"
        if (first := seen.setdefault(app.name, i)) != i:
            raise ValueError(f"host_applications: {app.name!r} appears twice (entries {first} and {i}){where}")
        try:
            app.check()
        except ValueError as e:
            raise ValueError(f"{e}{where}") from None


class NodeMetricsReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.metrics_reported.v1"
):
    """One publish interval of 1 s samples from one node, [window_start, window_end).

    `node` samples carry MemTotal−MemAvailable memory; the page-cache and hot-page variants
    are present only where the agent could collect them. `system` is node − pods − host apps.
    Pod and container samples are columnar (see PodSampleColumns) and point into `pods` and
    `containers` by index; an inconsistent batch fails decoding like an out-of-range sample.
    `host_applications` holds the NodeSLO's host applications that had samples in the window, by name (a
    handful at most, so plain lists rather than binary columns).
    """

    node: NodeName
    window_start: UnixSeconds
    window_end: UnixSeconds
    sent_at: UnixSeconds
    node_samples: list[Sample] = []
    memory_with_page_cache: list[MemorySample] = []
    memory_with_hot_page: list[MemorySample] = []
    system_samples: list[Sample] = []
    pods: list[PodRef] = []
    pod_samples: PodSampleColumns = PodSampleColumns()
    containers: list[ContainerRef] = []
    container_samples: ContainerSampleColumns = ContainerSampleColumns()
    dropped_batches: int = 0
    pods_digest: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    """Names the pod list that `pod_samples` and `containers` index (`pod_list_digest`). 0: `pods` is that list.
    Otherwise `pods` may be empty, meaning "the list I last sent with this digest" (agents resend it on every
    change and periodically, see agent.batch.PodListThinner); a reader that does not hold that list cannot
    attribute the pod rows and drops them, and only them."""
    numa_samples: Annotated[list[NumaSample], msgspec.Meta(max_length=MAX_NUMA_SAMPLES)] = []
    """Each NUMA node's usage at each collection (empty on machines without NUMA nodes in sysfs)."""
    training: TrainingRound | None = None
    """Present on the batch that ends a training round of the prod predictor's models (the agent's rounds end
    on wall-clock minutes, with the batch window ending there)."""
    host_applications: Annotated[list[HostApplicationSamples], msgspec.Meta(max_length=MAX_HOST_APPLICATIONS)] = []
    node_psi: PsiSamples = []
    """The node's PSI stall ratios at each collection (schemas.psi); empty where the kernel has no PSI."""
    pod_psi: PodPsiColumns = PodPsiColumns()
    """The pods' PSI stall ratios, rows by index into `pods` like `pod_samples`; empty where cgroups have no
    pressure files."""
    pod_cpi: PodCpiSamples = []
    """The pods' cycles and instructions over the agent's CPI counting windows (schemas.cpi), by index into `pods`;
    empty where CPI is off or the kernel does not allow it (left off the wire then)."""

    def check(self) -> None:
        """ValueError, saying what is wrong, when the sample columns are inconsistent, out of range, or point
        outside the pod and container lists (NODE_EVENT_DECODER calls it on every batch it decodes)."""
        import numpy as np

        for table, columns in (("pod_samples", self.pod_samples), ("container_samples", self.container_samples)):
            try:
                columns.check()
            except ValueError as e:
                raise ValueError(f"{e} - at `$.{table}`") from None
        pod_rows = np.frombuffer(self.pod_samples.pod, INDEX_DTYPE)
        container_pods = [c.pod for c in self.containers]
        _require_grouped("containers", container_pods, "pod")
        if self.pods or not self.pods_digest:  # indexes into a pod list sent earlier are checked by the reader
            _require_in_range("pod_samples", pod_rows, len(self.pods), "pods")
            _require_in_range("containers", container_pods, len(self.pods), "pods")
        container_rows = np.frombuffer(self.container_samples.container, INDEX_DTYPE)
        _require_in_range("container_samples", container_rows, len(self.containers), "containers")
        if self.training is not None:
            try:
                self.training.check(len(self.pods) if self.pods or not self.pods_digest else None)
            except ValueError as e:
                raise ValueError(f"{e} - at `$.training`") from None
        if self.host_applications:
            _check_host_applications(self.host_applications)
        if self.pod_psi != _NO_POD_PSI:
            try:
                self.pod_psi.check(len(self.pods) if self.pods or not self.pods_digest else None)
            except ValueError as e:
                raise ValueError(f"{e} - at `$.pod_psi`") from None
        if self.pod_cpi:
            check_pod_cpi(self.pod_cpi, len(self.pods) if self.pods or not self.pods_digest else None)


_NO_POD_PSI = PodPsiColumns()


def pod_list_digest(pods: Sequence[PodRef]) -> int:
    """A stable non-zero 63-bit digest of a pod list (of its msgpack form): equal lists, equal digests."""
    digest = hashlib.blake2b(_NODE_EVENT_ENCODER.encode(pods), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 1) or 1


class NodeStateReported(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.state_reported.v1"):
    """The agent's view of its node: capacity, cgroup layout and the pods it found. Sent at start and on change."""

    node: NodeName
    at: UnixSeconds
    agent_version: str = ""
    cpu_cores: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    memory_total: Bytes = 0
    cgroup_version: int = 0
    cgroup_driver: str = ""
    pods: list[PodRef] = []


# --- computed by nodemetric


class ResourceMap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Koordinator's ResourceMap: empty `resources` means "no data", which is not the same as zeros."""

    resources: dict[str, int] = {}


class AggregatedUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage over one duration, keyed by aggregation type (avg, p50, p90, p95, p99)."""

    duration_seconds: int
    usage: dict[str, ResourceMap]


class PodMetric(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    namespace: str
    name: str
    uid: str = ""
    pod_usage: ResourceMap
    priority: str = ""
    qos: str = ""


class HostApplicationMetric(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One `hostApplicationMetric` entry: a host application's average usage and the classes its NodeSLO entry
    gives it (spec §1.6 item 6)."""

    name: str
    usage: ResourceMap
    priority: str = ""
    qos: str = ""


class NumaUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One NUMA node's average usage and system usage over the aggregate window (Koordinator's NUMAUsage)."""

    numa_node_id: NumaId
    node_usage: ResourceMap
    system_usage: ResourceMap


class NodeMetricInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    node_usage: ResourceMap
    aggregated_node_usages: list[AggregatedUsage]
    system_usage: ResourceMap
    aggregated_system_usages: list[AggregatedUsage]
    numa_usages: list[NumaUsage] = []
    """Per NUMA node with samples in the window, by id; empty where the agent reports no NUMA nodes."""


class NodeMetricStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """NodeMetric `.status` with integer amounts (cpu millicores, memory bytes).

    `prod_reclaimable` and `prod_peak` are the prod predictor's answers (spec §1.7), None until its first round;
    as in Koordinator, a failed prediction leaves `prod_reclaimable` present with no data and `prod_peak` out.
    `host_applications` is Koordinator's hostApplicationMetric, sorted by name (empty: no host application had
    samples in the aggregate window)."""

    update_time: UnixSeconds
    node_metric: NodeMetricInfo
    pods_metric: list[PodMetric]
    prod_reclaimable: ResourceMap | None = None
    prod_peak: ResourceMap | None = None
    host_applications: list[HostApplicationMetric] = []


class MetricCollectPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """NodeMetric `.spec.metricCollectPolicy` with Koordinator's defaults (spec §1.3)."""

    aggregate_duration_seconds: int = 300
    report_interval_seconds: int = 60
    durations_seconds: tuple[int, ...] = (300, 600, 1800)
    node_memory_collect_policy: str = "usageWithoutPageCache"


class NodeMetricComputed(msgspec.Struct, frozen=True, kw_only=True, tag="nodemetric.computed.v1"):
    """One report round of one node: the NodeMetric status and the spec it was computed with."""

    node: NodeName
    report_time: UnixSeconds
    spec: MetricCollectPolicy
    status: NodeMetricStatus
    samples_in_window: int = 0
    source_sent_at: UnixSeconds = 0.0
    """When the agent sent the batch that completed this report (for publish → projection latency)."""
    psi: PsiMetric | None = None
    """koordbus's own: the node's and its pods' average PSI stall ratios over the aggregate window (None: the node
    sent no PSI there). Koordinator's NodeMetric has no such field; it is never written to the NodeMetric object."""


class NodeMetricComputedRecord(msgspec.Struct, frozen=True, kw_only=True, tag="nodemetric.computed.v1"):
    """NodeMetricComputed as its projection reads it: the status stays the JSON it arrived as.

    Decoding 100 pods' metrics into objects only to encode them again for the database row cost the projector
    more than computing them; the row stores the status text as published. The envelope and spec are checked as
    usual and the status must be well-formed JSON; its shape is the publisher's (the nodemetric service, the
    subject's only writer) and is checked again wherever a row is read (NodeMetricStatus).

    It carries NodeMetricComputed's tag on purpose: it is another view of the same messages, and the tag is what it
    checks them by. It is never published or stored as itself (its encoding is NodeMetricComputed's), and no decoder
    takes both types (msgspec refuses a union of two structs with one tag when the decoder is built).
    """

    node: NodeName
    report_time: UnixSeconds
    spec: MetricCollectPolicy
    status: msgspec.Raw
    samples_in_window: int = 0
    source_sent_at: UnixSeconds = 0.0

    @classmethod
    def of(cls, event: NodeMetricComputed) -> NodeMetricComputedRecord:
        return msgspec.json.decode(msgspec.json.encode(event), type=cls)

    @property
    def update_time(self) -> float:
        """The status's updateTime, read without decoding the rest of it."""
        return _STATUS_UPDATE_TIME.decode(self.status).update_time


class _StatusUpdateTime(msgspec.Struct, frozen=True):
    update_time: UnixSeconds


_STATUS_UPDATE_TIME = msgspec.json.Decoder(_StatusUpdateTime)


NodeEvent = NodeMetricsReported | NodeStateReported


def encode_node_event(event: NodeEvent) -> bytes:
    """The wire form of a node-subject event (msgpack; see the module docstring)."""
    return _NODE_EVENT_ENCODER.encode(event)


class NodeEventDecoder:
    """msgspec's decoder of node events, then the checks of NodeMetricsReported.check: a bad batch fails decoding
    with msgspec.ValidationError like any other invalid message."""

    def __init__(self) -> None:
        self._decoder: msgspec.msgpack.Decoder[NodeEvent] = msgspec.msgpack.Decoder(NodeEvent)

    def decode(self, data: bytes | bytearray | memoryview) -> NodeEvent:
        event = self._decoder.decode(data)
        if isinstance(event, NodeMetricsReported):
            try:
                event.check()
            except ValueError as e:
                raise msgspec.ValidationError(str(e)) from None
        return event


_NODE_EVENT_ENCODER = msgspec.msgpack.Encoder()
NODE_EVENT_DECODER = NodeEventDecoder()
"""Decodes (and validates) what `encode_node_event` wrote; raises msgspec.DecodeError/ValidationError otherwise."""
