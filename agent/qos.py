"""The QoS values the agent writes (issue 6), computed: resctrl schemata (spec §5.4) and BE pod cgroups (§5.7). Pure.

Resctrl: `l3_mask(cbm, start, end)` turns a class's cache range (percent of the L3 ways) into a CAT bit mask — the
mask is the ways [ceil(ways × start/100), ceil(ways × end/100)) of the root's `cbm_mask`, which must be all ones
from bit 0; `mba_value(percent, vendor)` is the MBA value (Intel: a percent rounded up to a multiple of 10; AMD:
2048 for 100%, else int(1.6 × percent) bandwidth units); `schemata_lines` renders `L3:<id>=<mask>;…` and
`MB:<id>=<v>;…` for every cache id. BE cgroups: Kubernetes' MilliCPUToShares / MilliCPUToQuota, the cgroup v2
weight conversions, and `be_cgroup(pod, …)` — a BE pod's and each container's cpu shares, CFS quota and memory limit
from their batch-cpu/batch-memory (the `node.koordinator.sh/extended-resource-spec` annotation, else the
containers' own kubernetes.io/batch-* resources), named as the cgroup version names the files. Used by the agent's
actuation loops and `koordbus calc resctrl|be-cgroup|be-cgroup-math`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

from schemas import kube, quantity, vocab

MIN_SHARES: Final = 2
MAX_SHARES: Final = 262144
MIN_WEIGHT: Final = 1
MAX_WEIGHT: Final = 10000
QUOTA_PERIOD_US: Final = 100000
MIN_QUOTA_US: Final = 1000
AMD_VENDOR: Final = "AuthenticAMD"
AMD_UNLIMITED_MBA: Final = 2048
EXTENDED_RESOURCE_SPEC: Final = "node.koordinator.sh/extended-resource-spec"


class QoSError(ValueError):
    """A value that cannot be computed (bad mask, bad range, out of range); the message says which."""


# --- resctrl (§5.4)


def parse_cbm(text: str) -> int:
    try:
        cbm = int(text, 16)
    except ValueError:
        raise QoSError(f"cbm mask {text!r} is not hexadecimal") from None
    if cbm <= 0 or (cbm + 1) & cbm:
        raise QoSError(f"cbm mask {text!r} is not contiguous ones from bit 0")
    return cbm


def l3_mask(cbm: int, start: float, end: float) -> str:
    """The CAT mask for [start%, end%) of the cache ways, lower-case hex without leading zeros ("0" if empty)."""
    if not (start >= 0 and end <= 100 and end > start):
        raise QoSError(f"cache range {start:g}%–{end:g}% is not 0 ≤ start < end ≤ 100")
    ways = cbm.bit_length()
    start_way = math.ceil(Fraction(ways) * Fraction(start) / 100)
    end_way = math.ceil(Fraction(ways) * Fraction(end) / 100)
    return format((1 << end_way) - (1 << start_way), "x")


def mba_value(percent: float | None, vendor: str) -> int | None:
    """The MB schemata value for a class's mbaPercent; None when unset, ≤ 0 or > 100 (MBA not written)."""
    if percent is None or percent <= 0 or percent > 100:
        return None
    if vendor == AMD_VENDOR:
        return AMD_UNLIMITED_MBA if percent == 100 else int(Fraction(16) * Fraction(percent) / 10)
    return math.ceil(Fraction(percent) / 10) * 10


def schemata_line(resource: str, cache_ids: Sequence[int], value: str | int) -> str:
    return f"{resource}:" + "".join(f"{cache_id}={value};" for cache_id in sorted(cache_ids))


# --- BE cgroups (§5.7)


def milli_cpu_to_shares(milli: int) -> int:
    if milli <= 0:
        return MIN_SHARES
    return min(max(milli * 1024 // 1000, MIN_SHARES), MAX_SHARES)


def milli_cpu_to_quota(milli: int) -> int:
    if milli <= 0:
        return -1
    return max(milli * QUOTA_PERIOD_US // 1000, MIN_QUOTA_US)


def shares_to_weight(shares: int) -> int:
    if not MIN_SHARES <= shares <= MAX_SHARES:
        raise QoSError(f"cpu.shares {shares} is outside [{MIN_SHARES}, {MAX_SHARES}]")
    return min(max(1 + (shares - 2) * 9999 // 262142, MIN_WEIGHT), MAX_WEIGHT)


def weight_to_shares(weight: int) -> int:
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise QoSError(f"cpu.weight {weight} is outside [{MIN_WEIGHT}, {MAX_WEIGHT}]")
    return 2 + (weight - 1) * 262142 // 9999


def _batch(raw: Mapping[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in (vocab.BATCH_CPU, vocab.BATCH_MEMORY):
        if raw and name in raw:
            out[name] = quantity.amount(name, raw[name])
    return out


def container_batch(pod: kube.Pod) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """Container name → (batch requests, batch limits): the extended-resource-spec annotation, else the
    containers' own batch-cpu/batch-memory resources."""
    text = pod.metadata.annotations.get(EXTENDED_RESOURCE_SPEC)
    if text:
        try:
            spec = json.loads(text)
        except ValueError:
            raise QoSError(f"annotation {EXTENDED_RESOURCE_SPEC} is not JSON") from None
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(containers, dict):
            raise QoSError(f"annotation {EXTENDED_RESOURCE_SPEC} has no containers object")
        return {
            str(name): (_batch((c or {}).get("requests")), _batch((c or {}).get("limits")))
            for name, c in containers.items()
        }
    return {c.name: (_batch(c.resources.requests), _batch(c.resources.limits)) for c in pod.spec.containers or ()}


def _quota(milli_limit: int | None, *, ratio: float | None, cfs_quota: bool) -> int:
    if not cfs_quota or milli_limit is None:
        return -1
    quota = milli_cpu_to_quota(milli_limit)
    if quota > 0 and ratio is not None and ratio > 1:
        quota = math.ceil(Fraction(quota) / Fraction(ratio))
    return quota


def _files(shares: int, quota: int, memory: int, version: int) -> dict[str, int | str]:
    if version == 2:
        return {
            "cpu.weight": shares_to_weight(shares),
            "cpu.max": "max" if quota < 0 else quota,
            "memory.max": "max" if memory < 0 else memory,
        }
    return {"cpu.shares": shares, "cpu.cfs_quota_us": quota, "memory.limit_in_bytes": memory}


def be_cgroup(
    pod: kube.Pod, *, version: int, cfs_quota: bool = True, ratio: float | None = None
) -> tuple[dict[str, int | str], dict[str, dict[str, int | str]]]:
    """(pod files, container name → files) for a BE pod; two empty maps for any other pod."""
    if pod.metadata.labels.get(vocab.QOS_CLASS_LABEL) != vocab.QOS_BE:
        return {}, {}
    containers = container_batch(pod)
    out: dict[str, dict[str, int | str]] = {}
    total_request, total_cpu_limit, total_memory = 0, 0, 0
    cpu_unlimited = memory_unlimited = False
    for name, (requests, limits) in containers.items():
        cpu_limit = limits.get(vocab.BATCH_CPU)
        memory_limit = limits.get(vocab.BATCH_MEMORY)
        total_request += requests.get(vocab.BATCH_CPU, 0)
        cpu_unlimited |= cpu_limit is None
        memory_unlimited |= memory_limit is None
        total_cpu_limit += cpu_limit or 0
        total_memory += memory_limit or 0
        out[name] = _files(
            milli_cpu_to_shares(requests.get(vocab.BATCH_CPU, 0)),
            _quota(cpu_limit, ratio=ratio, cfs_quota=cfs_quota),
            -1 if memory_limit is None else memory_limit,
            version,
        )
    pod_files = _files(
        milli_cpu_to_shares(total_request),
        _quota(None if cpu_unlimited or not containers else total_cpu_limit, ratio=ratio, cfs_quota=cfs_quota),
        -1 if memory_unlimited or not containers else total_memory,
        version,
    )
    return pod_files, out
