"""Pressure stall information (PSI) on the wire: the agent's per-collection stall ratios in its batches, and the
averages the nodemetric service publishes beside each NodeMetric report (issue 23, point 6).

A stall ratio is the share of one collection interval in which some (`some`) or all (`full`) non-idle tasks of the
node or of a pod's cgroup were stalled on a resource: Δ`total` µs of a pressure file over the interval's wall time,
in [0, 1] (agent.psi). A ratio the agent could not read is absent (None), never 0: a kernel without PSI, or a cgroup
without a pressure file, reports nothing.

Used by schemas.node (the batch fields `node_psi` and `pod_psi`, NodeMetricComputed's `psi`), agent.psi, agent.batch
and services.nodemetric.psi. Koordinator's NodeMetric has no PSI field: these stay out of the CRD object.
"""

from __future__ import annotations

import array
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800, description="seconds since the epoch")]
StallRatio = Annotated[float, msgspec.Meta(ge=0, le=1, description="share of an interval spent stalled")]

RESOURCES: Final = ("cpu", "memory", "io")
"""The pressure files read, in this order: /proc/pressure/<r> for the node, <r>.pressure for a pod's cgroup."""
SIGNALS: Final = ("cpu_some", "cpu_full", "memory_some", "memory_full", "io_some", "io_full")
"""The six stall ratios of a sample, in field order."""
MAX_PSI_SAMPLES: Final = 86_400
"""PSI samples of one series in one batch: a day of 1 s samples, far beyond any publish interval."""


class PsiSample(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """One collection's stall ratios of the node or of one pod, at `t`; a ratio not read is None."""

    t: UnixSeconds
    cpu_some: StallRatio | None = None
    cpu_full: StallRatio | None = None
    memory_some: StallRatio | None = None
    memory_full: StallRatio | None = None
    io_some: StallRatio | None = None
    io_full: StallRatio | None = None

    def values(self) -> tuple[float | None, ...]:
        """The six ratios in SIGNALS order."""
        return (self.cpu_some, self.cpu_full, self.memory_some, self.memory_full, self.io_some, self.io_full)


PsiSamples = Annotated[list[PsiSample], msgspec.Meta(max_length=MAX_PSI_SAMPLES)]


_INDEX_CODE, _TIME_CODE, _RATIO_CODE = "H", "d", "f"
_INDEX_DTYPE, _TIME_DTYPE, _RATIO_DTYPE = "<u2", "<f8", "<f4"
_TIME_RANGE = (0.0, 4_102_444_800.0)


def _pack(code: str, values: Sequence[float]) -> bytes:
    try:
        packed = array.array(code, values)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"a value does not fit a {code!r} column: {e}") from None
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


class PodPsiColumns(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every pod PSI sample of a batch as little-endian binary columns, as schemas.node.PodSampleColumns keeps pod
    samples (the same reasons: the hottest input, decoded as buffers numpy reads in place): row i is pod `pod[i]` (an
    index into the batch's `pods`; rows grouped by pod in list order, each pod's in time order) at `t[i]`, and one
    float32 column per signal (SIGNALS), NaN where the ratio was not read. Build with `of`; checked on decode."""

    pod: bytes = b""
    t: bytes = b""
    cpu_some: bytes = b""
    cpu_full: bytes = b""
    memory_some: bytes = b""
    memory_full: bytes = b""
    io_some: bytes = b""
    io_full: bytes = b""

    @classmethod
    def of(cls, rows: Sequence[tuple[int, PsiSample]]) -> PodPsiColumns:
        """Columns from (pod index, sample) rows (not checked; ValueError when a value does not fit its column)."""
        values = [sample.values() for _, sample in rows]
        ratios = {
            signal: _pack(_RATIO_CODE, [math.nan if (v := row[i]) is None else v for row in values])
            for i, signal in enumerate(SIGNALS)
        }
        return cls(
            pod=_pack(_INDEX_CODE, [pod for pod, _ in rows]),
            t=_pack(_TIME_CODE, [s.t for _, s in rows]),
            **ratios,
        )

    def __len__(self) -> int:
        return len(self.pod) // 2

    def arrays(self) -> tuple[npt.NDArray[np.uint16], npt.NDArray[np.float64], npt.NDArray[np.float32]]:
        """(pod index, t, ratios as one rows × 6 array in SIGNALS order, NaN where absent): views and one stack."""
        import numpy as np

        ratios = np.stack([np.frombuffer(getattr(self, s), _RATIO_DTYPE) for s in SIGNALS], axis=1)
        return np.frombuffer(self.pod, _INDEX_DTYPE), np.frombuffer(self.t, _TIME_DTYPE), ratios

    def rows(self) -> list[tuple[int, PsiSample]]:
        """(pod index, sample) per row as Python objects, for callers that think in rows (tests, tools)."""
        index, t, ratios = self.arrays()
        out = []
        for pod, at, values in zip(index.tolist(), t.tolist(), ratios.tolist(), strict=True):
            kept = {s: v for s, v in zip(SIGNALS, values, strict=True) if not math.isnan(v)}
            out.append((pod, PsiSample(t=at, **kept)))
        return out

    def check(self, listed_pods: int | None) -> None:
        """ValueError, naming the column and row, when the columns are inconsistent, a time or ratio is out of range
        (a ratio may be NaN: not read), rows are not grouped by pod, or (`listed_pods`: the size of the batch's pod
        list; None when the batch names it by digest, the reader checks then) an index is outside the list."""
        import numpy as np

        columns = {"pod": (self.pod, _INDEX_DTYPE), "t": (self.t, _TIME_DTYPE)}
        columns |= {s: (getattr(self, s), _RATIO_DTYPE) for s in SIGNALS}
        arrays: dict[str, npt.NDArray[Any]] = {}
        for name, (raw, dtype) in columns.items():
            size = np.dtype(dtype).itemsize
            if len(raw) % size:
                raise ValueError(f"pod_psi: `{name}` holds {len(raw)} bytes, not a whole number of {size}-byte values")
            arrays[name] = np.frombuffer(raw, dtype)
        rows = arrays["pod"].size
        for name, values in arrays.items():
            if values.size != rows:
                raise ValueError(
                    f"pod_psi: every column needs {rows} rows, one per `pod` entry, but `{name}` has {values.size}"
                )
        if not rows:
            return
        bad_t = ~((arrays["t"] >= _TIME_RANGE[0]) & (arrays["t"] <= _TIME_RANGE[1]))
        if bad_t.any():
            row = int(np.flatnonzero(bad_t)[0])
            raise ValueError(f"pod_psi: `t` row {row} is {arrays['t'][row]}, outside [0, {_TIME_RANGE[1]:g}]")
        for signal in SIGNALS:
            values = arrays[signal]
            bad = ~(np.isnan(values) | ((values >= 0) & (values <= 1)))
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise ValueError(f"pod_psi: `{signal}` row {row} is {values[row]}, outside [0, 1] (NaN: not read)")
        index = arrays["pod"]
        if rows > 1 and (decreasing := np.flatnonzero(index[1:] < index[:-1])).size:
            row = int(decreasing[0]) + 1
            raise ValueError(
                f"pod_psi: rows must be grouped by pod in list order, but row {row} (pod {index[row]}) follows pod "
                f"{index[row - 1]}"
            )
        if listed_pods is not None and (highest := int(index.max())) >= listed_pods:
            raise ValueError(f"pod_psi: index {highest} is out of range, the batch lists {listed_pods} pods")


# --- published by nodemetric


class PsiAverages(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Average stall ratios over a report's aggregate window; a signal without samples there is absent."""

    cpu_some: StallRatio | None = None
    cpu_full: StallRatio | None = None
    memory_some: StallRatio | None = None
    memory_full: StallRatio | None = None
    io_some: StallRatio | None = None
    io_full: StallRatio | None = None


class PodPsiMetric(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One pod's average stall ratios, named as the report's podsMetric names it."""

    namespace: str
    name: str
    uid: str = ""
    averages: PsiAverages


class PsiMetric(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The node's and its pods' average stall ratios over the report's aggregate window (`node` None: the node sent
    no node PSI there; pods without PSI there are left out), pods sorted by namespace and name."""

    node: PsiAverages | None = None
    pods: list[PodPsiMetric] = []
