"""A node's host applications in its streaming window (spec §1.6 item 6): their samples kept as pods' are, one
bucket per application and chunk of the report grid, for the hostApplicationMetric of each report.

Called by services.nodemetric.window: a NodeWindow makes its `HostApps` on the first batch carrying host
applications and drops it when the last bucket expires, so the 10,000-node service spends nothing on the many nodes
without any. An application is known by name; its priority and QoS are the newest batch's. Memory follows the node
memory collect policy as pods' does: usageWithPageCache reads the agent's page-cache variant (memory.usage_in_bytes
/ memory.current), the others the samples' memory without page cache (agents report no hot-page variant for host
applications). Pure.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from schemas import koordinator, node
from services.nodemetric.core import HostAppBuckets, HostAppInfo
from services.nodemetric.tables import F4, F8, I8, ChunkBuckets

_INITIAL_ROWS = 16  # two applications' buckets over a 6-minute horizon in 60 s chunks, with room


class HostApps:
    def __init__(self, memory_policy: str) -> None:
        self._with_page_cache = memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE
        self._buckets = ChunkBuckets(_INITIAL_ROWS)
        self._slot_of: dict[str, int] = {}
        self._infos: list[HostAppInfo | None] = []
        self._seen: list[float] = []
        self._free: list[int] = []

    def add(self, batch: node.NodeMetricsReported, *, chunk: float, inside_one_chunk: bool) -> None:
        """One bucket per application of the batch (a decoded batch names each once), merged into its bucket of the
        open chunk where there is one."""
        apps = batch.host_applications
        slots = np.fromiter((self._slot_for(app, batch.window_end) for app in apps), I8, len(apps))
        count = [float(len(app.samples)) for app in apps]
        memory = [self._memory(app) for app in apps]
        self._buckets.add(
            {
                "slot": slots,
                "count": np.asarray(count, F4),
                "cpu_sum": np.asarray([sum(s[1] for s in app.samples) for app in apps], F8),
                "mem_count": np.asarray([c for c, _ in memory], F4),
                "mem_sum": np.asarray([m for _, m in memory], F8),
                "t_min": np.asarray([min(s[0] for s in app.samples) for app in apps], F8),
                "t_max": np.asarray([max(s[0] for s in app.samples) for app in apps], F8),
            },
            chunk=chunk,
            inside_one_chunk=inside_one_chunk,
            slots=len(self._infos),
        )

    def _memory(self, app: node.HostApplicationSamples) -> tuple[float, float]:
        """(samples, their sum) of the memory the collect policy reads; (0, 0) when the batch has none of it."""
        if not self._with_page_cache:
            return float(len(app.samples)), float(sum(s[2] for s in app.samples))
        if not app.memory_with_page_cache:
            return 0.0, 0.0
        return float(len(app.memory_with_page_cache)), float(sum(app.memory_with_page_cache))

    def _slot_for(self, app: node.HostApplicationSamples, seen_at: float) -> int:
        """The application's slot, allocating one for a new name; what the newest batch says of it wins."""
        slot = self._slot_of.get(app.name)
        if slot is None:
            slot = self._free.pop() if self._free else len(self._infos)
            if slot == len(self._infos):
                self._infos.append(None)
                self._seen.append(-math.inf)
            self._slot_of[app.name] = slot
        if seen_at >= self._seen[slot]:
            info = HostAppInfo(app.name, app.priority, app.qos)
            if info != self._infos[slot]:
                self._infos[slot] = info
            self._seen[slot] = seen_at
        return slot

    def expire(self, cutoff: float) -> bool:
        """Drop buckets whose first sample is before `cutoff` and free the slots left without one; True when no
        bucket is left."""
        if not self._buckets.expire(cutoff):
            return False
        used = self._buckets.used(len(self._infos))
        for slot in np.flatnonzero(~used).tolist():
            info = self._infos[slot]
            if info is None:
                continue
            del self._slot_of[info.name]
            self._infos[slot] = None
            self._seen[slot] = -math.inf
            self._free.append(slot)
        return self._buckets.table.size == 0

    def buckets(self) -> HostAppBuckets:
        table = self._buckets.table
        app: npt.NDArray[np.int64] = table.col("slot").astype(I8)
        return HostAppBuckets(
            app=app,
            count=table.col("count").astype(F8),
            cpu_sum=table.col("cpu_sum"),
            mem_count=table.col("mem_count").astype(F8),
            mem_sum=table.col("mem_sum"),
            t_min=table.col("t_min"),
            t_max=table.col("t_max"),
            infos=self._infos,
        )

    def capacities(self) -> dict[str, int]:
        return {"host_apps": self._buckets.table.capacity, "host_app_slots": len(self._infos)}
