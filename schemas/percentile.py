"""Koordinator's nearest-rank percentile (spec §1.5) without numpy, shared by the agent and the nodemetric service.

The agent computes each training round's p90s itself (agent.batch) and must not load numpy; the nodemetric
service's aggregations (services.nodemetric.aggregate) take their index from here too, so both count the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_FLOAT32 = struct.Struct("<f")


def _float32(x: float) -> float:
    """`x` rounded to the nearest float32, as a Python float."""
    rounded: float = _FLOAT32.unpack(_FLOAT32.pack(x))[0]
    return rounded


def nearest_rank_index(n: int, p: float) -> int:
    """Koordinator's percentile index: int(float32(n) × float32(p)) − 1, at least 0. The product of two float32s
    is exact in float64, so rounding it to float32 gives what Go's float32 multiplication gives."""
    return max(int(_float32(_float32(float(n)) * _float32(p))) - 1, 0)


def nearest_rank(values: Sequence[float], p: float) -> float:
    """The sorted value at `nearest_rank_index`; ValueError when there are none."""
    if not values:
        raise ValueError("no samples to take a percentile of")
    return sorted(values)[nearest_rank_index(len(values), p)]
