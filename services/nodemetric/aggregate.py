"""Koordinator's metric-cache aggregations (spec §1.5): avg, nearest-rank percentiles, last, count.

Pure functions over sample values, used by the NodeMetric status assembly (services.nodemetric.core) and by
`koordbus calc nodemetric-aggregate`. Percentile indices reproduce Koordinator's float32 arithmetic exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from schemas.percentile import nearest_rank_index

FloatArray = npt.NDArray[np.float64]
AVG, P50, P90, P95, P99, LAST, COUNT = "avg", "p50", "p90", "p95", "p99", "last", "count"
PERCENTILES: Mapping[str, float] = {P50: 0.5, P90: 0.9, P95: 0.95, P99: 0.99}
STATUS_AGGREGATIONS = (AVG, P50, P90, P95, P99)
AGGREGATIONS = (*STATUS_AGGREGATIONS, LAST, COUNT)


class AggregationError(ValueError):
    """A query Koordinator's metric cache rejects: no samples in the window, or an unknown aggregation."""


def _array(values: Iterable[float] | FloatArray) -> FloatArray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)


def _values(values: Iterable[float] | FloatArray) -> FloatArray:
    arr = _array(values)
    if arr.size == 0:
        raise AggregationError("no samples to aggregate")
    return arr


def avg(values: Iterable[float] | FloatArray) -> float:
    arr = _values(values)
    return float(arr.sum() / arr.size)


def percentile(values: Iterable[float] | FloatArray, p: float) -> float:
    """Nearest-rank percentile without interpolation: the sorted value at `nearest_rank_index`."""
    arr = _values(values)
    idx = nearest_rank_index(arr.size, p)
    return float(np.partition(arr, idx)[idx])


def last(values: Iterable[float] | FloatArray, times: Iterable[float] | FloatArray | None = None) -> float:
    """The value with the latest timestamp (the last one when times are not given or tie)."""
    arr = _values(values)
    if times is None:
        return float(arr[-1])
    t = _array(times)
    return float(arr[t.size - 1 - int(np.argmax(t[::-1]))])


def count(values: Iterable[float] | FloatArray) -> int:
    """Number of samples; unlike the others it answers 0 for none, as Koordinator's Count() does."""
    return int(_array(values).size)


def aggregate(name: str, values: Iterable[float] | FloatArray) -> float:
    """One aggregation by its Koordinator name; samples are in time order."""
    arr = _array(values)
    match name:
        case "avg":
            return avg(arr)
        case "p50" | "p90" | "p95" | "p99":
            return percentile(arr, PERCENTILES[name])
        case "last":
            return last(arr)
        case "count":
            return count(arr)
        case _:
            raise AggregationError(f"unknown aggregation {name!r} (known: {', '.join(AGGREGATIONS)})")


@functools.lru_cache(maxsize=4096)
def _status_percentile_indices(n: int) -> npt.NDArray[np.intp]:
    """The sorted-order indices of p50, p90, p95, p99 among n samples (read-only); windows repeat their sizes."""
    indices = np.array([nearest_rank_index(n, p) for p in PERCENTILES.values()], dtype=np.intp)
    indices.flags.writeable = False
    return indices


def status_values(arr: FloatArray) -> list[float]:
    """avg, p50, p90, p95, p99 (STATUS_AGGREGATIONS order) of a non-empty window.

    One partition on all four indices places each percentile where a full sort would, for less.
    """
    indices = _status_percentile_indices(arr.size)
    arranged = arr.copy()
    arranged.partition(indices)
    return [float(arr.sum() / arr.size), *arranged.take(indices).tolist()]


def status_aggregates(arr: FloatArray) -> dict[str, float]:
    """avg and the four percentiles of a non-empty window, by name."""
    return dict(zip(STATUS_AGGREGATIONS, status_values(arr), strict=True))
