"""Pressure stall information (PSI): pure parsing of the kernel's pressure files and stall ratios from their counters.

A pressure file (`/proc/pressure/{cpu,memory,io}` for the node, `{cpu,memory,io}.pressure` in a cgroup v2 directory,
or a v1 one where the kernel provides them) holds a `some` line and, on most kernels, a `full` line:

    some avg10=0.88 avg60=3.83 avg300=12.07 total=413343227
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

`total` is the cumulative stall time in µs. The agent does not use the kernel's decaying averages: like CPU usage
from counters, a stall ratio is Δtotal / Δwall over each collection interval (agent.core.Sampler calls
`PsiSampler`), so the nodemetric service can average it over any window. The first reading of a node or pod gives
no ratio, nor does one whose counter went back (a cgroup removed and created again).

Called by agent.collect (parsing what it read) and agent.core (sampling). Nothing here touches files or clocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from schemas.psi import PsiSample

_MAX_TOTAL_US = 2**63 - 1


class PsiTotals(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The `total` counters (µs) of one pressure file; `full` is None where the file has no full line (the node's
    cpu file before Linux 5.13)."""

    some: int
    full: int | None = None


class PsiReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The counters of the pressure files of the node or of one cgroup, as one collection read them; a file that was
    not there (or not readable) is None."""

    cpu: PsiTotals | None = None
    memory: PsiTotals | None = None
    io: PsiTotals | None = None

    def by_resource(self) -> tuple[PsiTotals | None, PsiTotals | None, PsiTotals | None]:
        return self.cpu, self.memory, self.io


class PsiParseError(ValueError):
    """A pressure file's text is not what the kernel writes."""


def _total(line: str) -> tuple[str, int]:
    kind, *fields = line.split()
    values: dict[str, str] = {}
    for field in fields:
        key, eq, value = field.partition("=")
        if not eq:
            raise PsiParseError(f"{kind} line: {field!r} is not key=value")
        values[key] = value
    raw = values.get("total")
    if raw is None:
        raise PsiParseError(f"{kind} line has no total= (truncated?): {line!r}")
    if not raw.isdigit() or int(raw) > _MAX_TOTAL_US:
        raise PsiParseError(f"{kind} line: total={raw!r} is not a count of microseconds")
    for key in ("avg10", "avg60", "avg300"):
        if key not in values:
            raise PsiParseError(f"{kind} line has no {key}= (truncated?): {line!r}")
    return kind, int(raw)


def parse_pressure(text: str) -> PsiTotals:
    """The `total` counters of a pressure file; PsiParseError when the `some` line is missing or a `some`/`full`
    line is malformed or truncated (other lines, which no kernel writes today, are ignored)."""
    totals: dict[str, int] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        kind = stripped.split(maxsplit=1)[0]
        if kind not in ("some", "full"):
            continue
        if kind in totals:
            raise PsiParseError(f"two {kind} lines")
        totals[kind] = _total(stripped)[1]
    if "some" not in totals:
        raise PsiParseError("no some line")
    return PsiTotals(some=totals["some"], full=totals.get("full"))


def stall_ratio(prev_us: int | None, cur_us: int | None, *, wall_seconds: float) -> float | None:
    """Δtotal µs / Δwall µs, at most 1 (the counters and the wall clock are read at slightly different instants);
    None without a previous counter, when time did not advance or when the counter went back."""
    if prev_us is None or cur_us is None or wall_seconds <= 0 or cur_us < prev_us:
        return None
    return min((cur_us - prev_us) / (wall_seconds * 1e6), 1.0)


def psi_sample(prev: PsiReading, cur: PsiReading, *, at: float, wall_seconds: float) -> PsiSample | None:
    """The stall ratios between two readings of the same node or cgroup; None when no ratio could be computed."""
    ratios: list[float | None] = []
    for before, now in zip(prev.by_resource(), cur.by_resource(), strict=True):
        if before is None or now is None:
            ratios += [None, None]
            continue
        ratios.append(stall_ratio(before.some, now.some, wall_seconds=wall_seconds))
        ratios.append(stall_ratio(before.full, now.full, wall_seconds=wall_seconds))
    if all(r is None for r in ratios):
        return None
    cpu_some, cpu_full, memory_some, memory_full, io_some, io_full = ratios
    return PsiSample(
        t=at,
        cpu_some=cpu_some,
        cpu_full=cpu_full,
        memory_some=memory_some,
        memory_full=memory_full,
        io_some=io_some,
        io_full=io_full,
    )


class PsiSampler:
    """Turns successive PSI readings of the node and of its pods into samples, remembering only the latest reading of
    each (pods missing from a reading are forgotten, as agent.core.Sampler forgets their CPU counters)."""

    def __init__(self) -> None:
        self._node: PsiReading | None = None
        self._pods: dict[str, PsiReading] = {}

    def observe_node(self, reading: PsiReading | None, *, at: float, wall_seconds: float) -> PsiSample | None:
        prev, self._node = self._node, reading
        if prev is None or reading is None:
            return None
        return psi_sample(prev, reading, at=at, wall_seconds=wall_seconds)

    def observe_pods(
        self, readings: Iterable[tuple[str, PsiReading | None]], *, at: float, wall_seconds: float
    ) -> Mapping[str, PsiSample]:
        """Samples by pod uid, for the pods with a previous reading and a ratio."""
        prev, self._pods = self._pods, {uid: r for uid, r in readings if r is not None}
        samples: dict[str, PsiSample] = {}
        for uid, reading in self._pods.items():
            before = prev.get(uid)
            if before is not None and (sample := psi_sample(before, reading, at=at, wall_seconds=wall_seconds)):
                samples[uid] = sample
        return samples
