"""The bounded numpy tables a node's window keeps its samples in: `Table` (columns whose live rows are squeezed in
place on expiry) and `ChunkBuckets` (per-slot sample sums merged per chunk of the report grid).

Callers: services.nodemetric.window (node and system series, pod buckets) and services.nodemetric.hostapps (host
application buckets). Pure: numpy arrays in, numpy arrays out; the memory model they serve is described in
services.nodemetric.window.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

F4, F8, I8 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
# Slots and counts are small integers (exact in int32 and float32); sums and times need float64.
BUCKET_COLUMNS: dict[str, np.dtype[Any]] = {
    "slot": np.dtype(np.int32),
    "count": F4,
    "cpu_sum": F8,
    "mem_count": F4,
    "mem_sum": F8,
    "t_min": F8,
    "t_max": F8,
}
"""One bucket: the slot (pod or host application) it belongs to, how many CPU and memory samples it sums, and the
first and last sample time."""
BUCKET_SUMS: tuple[str, ...] = ("count", "cpu_sum", "mem_count", "mem_sum")
"""The columns of BUCKET_COLUMNS that merging buckets adds up (the others are the slot and the time bounds)."""


class Table:
    """Numpy columns whose rows [0, size) are live; expired rows are squeezed out in place.

    Arrays are allocated on first use and grow (by a quarter: 10,000 nodes' slack adds up) only when live rows
    outgrow them, so a node under steady load allocates nothing per batch.
    """

    def __init__(self, dtypes: Mapping[str, np.dtype[Any]], initial_rows: int) -> None:
        self._dtypes = dict(dtypes)
        self._initial_rows = initial_rows
        self._cols: dict[str, npt.NDArray[Any]] = {name: np.empty(0, dtype) for name, dtype in dtypes.items()}
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(next(iter(self._cols.values())))

    def col(self, name: str) -> npt.NDArray[Any]:
        return self._cols[name][: self.size]

    def append(self, columns: Mapping[str, npt.ArrayLike], rows: int) -> None:
        needed = self.size + rows
        if needed > self.capacity:
            self._resize(max(needed, self.capacity + self.capacity // 4, self._initial_rows))
        for name, col in self._cols.items():
            col[self.size : needed] = columns[name]
        self.size = needed

    def expire(self, time_column: str, cutoff: float) -> npt.NDArray[np.bool_] | None:
        """Drop rows whose `time_column` is before `cutoff`; None when none went, else which rows stayed."""
        t = self.col(time_column)
        if self.size == 0 or float(t.min()) >= cutoff:
            return None
        keep = t >= cutoff
        kept = int(keep.sum())
        for col in self._cols.values():
            col[:kept] = col[: self.size][keep]
        self.size = kept
        return keep

    def clear(self) -> None:
        self.size = 0

    def _resize(self, rows: int) -> None:
        for name, col in self._cols.items():
            grown = np.empty(rows, self._dtypes[name])
            grown[: self.size] = col[: self.size]
            self._cols[name] = grown


class ChunkBuckets:
    """Buckets of BUCKET_COLUMNS, at most one per slot in the open chunk of the report grid: a batch inside that chunk
    merges into its slots' buckets there (a slot without one gets one); a batch straddling chunks, or of a chunk
    older than the open one (late), gets buckets of its own. Other columns may be given (`columns`, with `slot`,
    `t_min` and `t_max` among them) with the ones merging adds up (`sums`)."""

    def __init__(
        self,
        initial_rows: int,
        *,
        columns: Mapping[str, np.dtype[Any]] = BUCKET_COLUMNS,
        sums: tuple[str, ...] = BUCKET_SUMS,
    ) -> None:
        self.table = Table(columns, initial_rows)
        self._sums = sums
        self._open_chunk: float | None = None  # chunk whose buckets are the newest rows of the table
        self._open_rows: npt.NDArray[np.int64] = np.empty(0, I8)  # slot -> its row in the open chunk, or -1

    def add(self, buckets: dict[str, npt.NDArray[Any]], *, chunk: float, inside_one_chunk: bool, slots: int) -> None:
        """Take one batch's buckets (one per distinct slot; `slots`: how many slots exist)."""
        table = self.table
        if not inside_one_chunk or (self._open_chunk is not None and chunk < self._open_chunk):
            table.append(buckets, buckets["slot"].size)  # straddling or late: a bucket of its own
            return
        if chunk != self._open_chunk:
            self._open_chunk = chunk
            self._open_rows = np.full(slots, -1, I8)
        elif self._open_rows.size < slots:
            self._open_rows = np.concatenate((self._open_rows, np.full(slots - self._open_rows.size, -1)))
        rows = self._open_rows[buckets["slot"]]
        merge = rows >= 0
        merging = int(np.count_nonzero(merge))
        if merging == rows.size:  # the common case: every slot already has a bucket in this chunk
            self._merge(rows, buckets)
            return
        if merging:
            self._merge(rows[merge], {name: col[merge] for name, col in buckets.items()})
            new = (~merge).nonzero()[0]
            buckets = {name: col[new] for name, col in buckets.items()}
        self._open_rows[buckets["slot"]] = np.arange(table.size, table.size + buckets["slot"].size)
        table.append(buckets, buckets["slot"].size)

    def _merge(self, rows: npt.NDArray[np.int64], buckets: dict[str, npt.NDArray[Any]]) -> None:
        """Add buckets into existing rows (`rows` are distinct: one per slot)."""
        table = self.table
        for name in self._sums:
            table.col(name)[rows] += buckets[name]
        t_min, t_max = table.col("t_min"), table.col("t_max")
        t_min[rows] = np.minimum(t_min[rows], buckets["t_min"])
        t_max[rows] = np.maximum(t_max[rows], buckets["t_max"])

    def expire(self, cutoff: float) -> bool:
        """Drop buckets whose first sample is before `cutoff`; True when some went."""
        kept = self.table.expire("t_min", cutoff)
        if kept is None:
            return False
        # Point the open chunk's row map at where its rows went when expiry squeezed the table.
        listed = np.flatnonzero(self._open_rows >= 0)
        rows = self._open_rows[listed]
        moved_to = np.cumsum(kept) - 1
        self._open_rows[listed] = np.where(kept[rows], moved_to[rows], -1)
        return True

    def used(self, slots: int) -> npt.NDArray[np.bool_]:
        """Which of `slots` slots have a bucket."""
        used = np.zeros(slots, dtype=bool)
        used[self.table.col("slot")] = True
        return used
