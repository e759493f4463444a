"""The node's memory sysctls from the NodeSLO's systemStrategy (issue 23, point 1; koordlet's SystemConfig). Pure.

`system_wants` says what to write, as koordlet computes it:
* `<proc>/sys/vm/min_free_kbytes` = MemTotal (kB) × minFreeKbytesFactor / 10000 (integer division), only when that
  lands in [10 MiB, 10 GiB] in kB;
* `<proc>/sys/vm/watermark_scale_factor` = watermarkScaleFactor, only in [10, 400];
* `<sys>/kernel/mm/memcg_reaper/reap_background` = memcgReapBackGround, only 0 or 1 and only where the file exists (a
  kernel with the memcg reaper).
A value outside its range is not written, and said (`Skipped`). pageCacheLimitEnabled is Anolis OS only in
koordlet: not written here, and said when set. Each file's path is relative to its root (proc or sys), so the
loop (agent.loops.system) writes it through that root's confined files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

MIN_FREE_KBYTES: Final = "sys/vm/min_free_kbytes"
WATERMARK_SCALE_FACTOR: Final = "sys/vm/watermark_scale_factor"
REAP_BACKGROUND: Final = "kernel/mm/memcg_reaper/reap_background"
MIN_FREE_KBYTES_RANGE: Final = (10 * 1024, 10 * 1024 * 1024)
WATERMARK_SCALE_FACTOR_RANGE: Final = (10, 400)
REAP_BACKGROUND_RANGE: Final = (0, 1)

Root = Literal["proc", "sys"]


@dataclass(frozen=True, kw_only=True)
class SystemWant:
    root: Root
    path: str
    value: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Skipped:
    field: str
    why: str


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def system_wants(strategy: Mapping[str, Any], *, mem_total_kb: int) -> tuple[list[SystemWant], list[Skipped]]:
    wants: list[SystemWant] = []
    skipped: list[Skipped] = []
    factor = _int(strategy.get("minFreeKbytesFactor"))
    if factor is not None:
        if mem_total_kb <= 0:
            skipped.append(Skipped(field="minFreeKbytesFactor", why=f"MemTotal {mem_total_kb} kB is not usable"))
        else:
            value = mem_total_kb * factor // 10000
            low, high = MIN_FREE_KBYTES_RANGE
            reason = f"MemTotal {mem_total_kb} kB × minFreeKbytesFactor {factor} / 10000 = {value} kB"
            if low <= value <= high:
                wants.append(SystemWant(root="proc", path=MIN_FREE_KBYTES, value=str(value), reason=reason))
            else:
                skipped.append(Skipped(field="minFreeKbytesFactor", why=f"{reason}, outside [{low}, {high}]"))
    for field, root, path, (low, high) in (
        ("watermarkScaleFactor", "proc", WATERMARK_SCALE_FACTOR, WATERMARK_SCALE_FACTOR_RANGE),
        ("memcgReapBackGround", "sys", REAP_BACKGROUND, REAP_BACKGROUND_RANGE),
    ):
        given = _int(strategy.get(field))
        if given is None:
            continue
        if low <= given <= high:
            wants.append(SystemWant(root=root, path=path, value=str(given), reason=f"{field} {given}"))  # type: ignore[arg-type]
        else:
            skipped.append(Skipped(field=field, why=f"{field} {given} outside [{low}, {high}]"))
    if strategy.get("pageCacheLimitEnabled") is not None:
        skipped.append(Skipped(field="pageCacheLimitEnabled", why="written by koordlet on Anolis OS only: not here"))
    return wants, skipped
