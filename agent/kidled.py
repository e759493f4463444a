"""Pure kidled arithmetic: parse a cgroup v1 `memory.idle_page_stats` file, sum its cold page cache and derive the
node memory "with hot page cache" (spec §1.4).

Called by agent/collect.py (parse + cold bytes, on the root memory cgroup's file when the kernel has kidled) and by
agent.core's Sampler (the hot-page formula). Nothing here reads files or clocks. The file is Alibaba Cloud Linux's
kidled report: '#' header lines (one of them `# buckets: 1,2,5,…`, the lower bounds of the idle-age buckets in scan
rounds) then one row per page type, e.g. `cfei` = clean, file, evictable, inactive, with one byte count per bucket.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

DEFAULT_COLD_BOUNDARY: Final = 5
"""Koordinator's default: buckets from index 5 ([60,120) scan rounds with the default buckets) upward are cold."""

FILE_PAGE_ROWS: Final = ("cfei", "dfei", "cfui", "dfui")
"""The inactive file-page rows (clean/dirty × evictable/unevictable) Koordinator counts as cold page cache. Active
file pages (`cfea` …) and anonymous/swap-backed rows are never cold page cache, however long they sat idle."""

_ROW_NAME_RE: Final = re.compile(r"^[a-z]+$")
_HEADER_RE: Final = re.compile(r"^#\s*([a-z_]+):\s*(.*?)\s*$")


class IdlePageStatsError(ValueError):
    """`memory.idle_page_stats` is not in the kidled format we know; the message names the offending line."""


@dataclass(frozen=True, kw_only=True)
class KidledStats:
    """One parsed `memory.idle_page_stats`: bucket lower bounds and, per page-type row, bytes per bucket."""

    buckets: tuple[int, ...]
    rows: Mapping[str, tuple[int, ...]]
    header: Mapping[str, str]
    """The other `# key: value` header lines (version, page_scans, scan_period_in_seconds, use_hierarchy …)."""


class MemTotals(Protocol):
    """The two /proc/meminfo fields the hot-page formula needs, in kB (agent.core.MemInfo has them)."""

    @property
    def total_kb(self) -> int: ...

    @property
    def free_kb(self) -> int: ...


def _parse_buckets(value: str, line_no: int, line: str) -> tuple[int, ...]:
    parts = [p.strip() for p in value.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise IdlePageStatsError(f"line {line_no}: buckets must be comma-separated integers: {line!r}")
    buckets = tuple(int(p) for p in parts)
    if any(lower >= upper for lower, upper in itertools.pairwise(buckets)):
        raise IdlePageStatsError(f"line {line_no}: buckets must be strictly increasing: {line!r}")
    return buckets


def _parse_row(fields: list[str], width: int, line_no: int, line: str) -> tuple[str, tuple[int, ...]]:
    name, values = fields[0], fields[1:]
    if not _ROW_NAME_RE.match(name) or not all(v.isdigit() for v in values):
        raise IdlePageStatsError(f"line {line_no}: expected a page-type name and byte counts: {line!r}")
    if len(values) != width:
        raise IdlePageStatsError(f"line {line_no}: row {name!r} has {len(values)} buckets, expected {width}: {line!r}")
    return name, tuple(int(v) for v in values)


def parse_idle_page_stats(text: str) -> KidledStats:
    """Parse the file; raises IdlePageStatsError (a ValueError) naming the line when it is malformed, and when the
    buckets header or one of the FILE_PAGE_ROWS is missing (a cold-page sum without them would be silently low)."""
    buckets: tuple[int, ...] | None = None
    header: dict[str, str] = {}
    rows: dict[str, tuple[int, ...]] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _HEADER_RE.match(line)
            if m and m.group(1) == "buckets":
                buckets = _parse_buckets(m.group(2), line_no, raw)
            elif m:
                header[m.group(1)] = m.group(2)
            continue  # the remaining '#' lines are the legend and the column titles
        if buckets is None:
            raise IdlePageStatsError(f"line {line_no}: page-type row before the '# buckets:' header: {raw!r}")
        name, values = _parse_row(line.split(), len(buckets), line_no, raw)
        if name in rows:
            raise IdlePageStatsError(f"line {line_no}: row {name!r} appears twice: {raw!r}")
        rows[name] = values
    if buckets is None:
        raise IdlePageStatsError("no '# buckets:' header line")
    missing = [name for name in FILE_PAGE_ROWS if name not in rows]
    if missing:
        raise IdlePageStatsError(f"file-page rows missing: {', '.join(missing)}")
    return KidledStats(buckets=buckets, rows=rows, header=header)


def cold_page_bytes(stats: KidledStats, *, cold_boundary: int = DEFAULT_COLD_BOUNDARY) -> int:
    """Σ over FILE_PAGE_ROWS of the buckets with index ≥ cold_boundary (a boundary past the last bucket gives 0)."""
    if cold_boundary < 0:
        raise ValueError(f"cold_boundary must be a bucket index ≥ 0, got {cold_boundary}")
    return sum(sum(stats.rows[name][cold_boundary:]) for name in FILE_PAGE_ROWS)


def node_memory_with_hot_page(meminfo: MemTotals, cold_bytes: int) -> int:
    """MemTotal×1024 − MemFree×1024 − cold page bytes, clamped at 0.

    Koordinator subtracts in unsigned arithmetic, so a cold count above the used memory (the two are read at
    different instants) would wrap to a huge number there; here it is 0.
    """
    return max((meminfo.total_kb - meminfo.free_kb) * 1024 - cold_bytes, 0)
