"""Cycles per instruction (CPI) on the wire: the hardware counters the agent counted for each pod's cgroup over a
collection window, in its batches (issue 23, point 6).

Koordinator's koordlet (feature CPICollector) counts `cycles` and `instructions` of each container's perf_event
cgroup on every online CPU for `cpiCollectorTimeWindowSeconds` (10 s) every `cpiCollectorInterval` (60 s) and reports
both counts; CPI = cycles / instructions. koordbus counts per pod the same way (agent.cpi, agent.cpi_collect). A pod
not counted has no row, never zeros: a kernel without a usable PMU (most VMs), a container without the permission, a
cgroup the kernel refused. A row's counts are the kernel's, scaled up where the PMU was multiplexed (agent.cpi).

Used by schemas.node (the batch field `pod_cpi`), agent.batch. The nodemetric service decodes and validates the field
and keeps nothing of it; Koordinator's NodeMetric has no CPI field either.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

MAX_POD_CPI_SAMPLES: Final = 65_536
"""CPI rows in one batch: one per pod per counting window, so a batch holds a few hundred at most; this bound is one
row for every index a pod list can have."""
MAX_WINDOW_SECONDS: Final = 3600.0
"""The longest counting window a row may report (agent.settings caps the window below it)."""
MAX_COUNT: Final = float(2**64)
"""A count above the kernel's 64-bit counter is not a count."""

UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800, description="seconds since the epoch")]
PodIndex = Annotated[int, msgspec.Meta(ge=0, le=65_535, description="index into the batch's pod list")]
WindowSeconds = Annotated[
    float, msgspec.Meta(gt=0, le=MAX_WINDOW_SECONDS, description="seconds the counters were enabled")
]
Count = Annotated[float, msgspec.Meta(ge=0, le=MAX_COUNT, description="events counted, scaled for multiplexing")]


class PodCpiSample(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """One pod's counts over one counting window that ended at `t` and lasted `seconds`, summed over the node's
    online CPUs. On the wire a row is `[pod, t, seconds, cycles, instructions]`."""

    pod: PodIndex
    t: UnixSeconds
    seconds: WindowSeconds
    cycles: Count
    instructions: Count

    @property
    def cpi(self) -> float | None:
        """Cycles per instruction; None when no instruction was counted (a pod idle for the whole window)."""
        return self.cycles / self.instructions if self.instructions > 0 else None


PodCpiSamples = Annotated[list[PodCpiSample], msgspec.Meta(max_length=MAX_POD_CPI_SAMPLES)]


def check_pod_cpi(rows: list[PodCpiSample], listed_pods: int | None) -> None:
    """ValueError, naming the row, when a row's index is outside the batch's pod list (`listed_pods`: its size; None
    when the batch names the list by digest, the reader checks then) or a pod has two rows for one window end."""
    seen: set[tuple[int, float]] = set()
    for i, row in enumerate(rows):
        if listed_pods is not None and row.pod >= listed_pods:
            raise ValueError(
                f"pod_cpi: index {row.pod} is out of range, the batch lists {listed_pods} pods - at `$.pod_cpi[{i}]`"
            )
        key = (row.pod, row.t)
        if key in seen:
            raise ValueError(f"pod_cpi: pod {row.pod} has two rows ending at {row.t} - at `$.pod_cpi[{i}]`")
        seen.add(key)
