"""`koordbus calc resctrl`, `be-cgroup` and `be-cgroup-math` (../shared/design/CALC-CONTRACT.md, spec §5.4, §5.7).

Registered in koordbus.calc.CALCULATORS; runs agent.qos, the same pure math the agent's actuation uses.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agent import qos
from koordbus.calc_errors import InputError
from schemas import kube, quantity


class ResctrlClass(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cat_range_start_percent: float | None = None
    cat_range_end_percent: float | None = None
    mba_percent: float | None = None


class ResctrlInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    vendor: str = "GenuineIntel"
    cbm_mask: str
    cache_ids: list[int]
    classes: dict[str, ResctrlClass]


def resctrl(inp: ResctrlInput) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, klass in inp.classes.items():
        try:
            l3: str | None = None
            if klass.cat_range_start_percent is not None or klass.cat_range_end_percent is not None:
                start = klass.cat_range_start_percent if klass.cat_range_start_percent is not None else 0
                end = klass.cat_range_end_percent if klass.cat_range_end_percent is not None else 100
                mask = qos.l3_mask(qos.parse_cbm(inp.cbm_mask), start, end)
                l3 = qos.schemata_line("L3", inp.cache_ids, mask)
            mba = qos.mba_value(klass.mba_percent, inp.vendor)
            mb = None if mba is None else qos.schemata_line("MB", inp.cache_ids, mba)
        except qos.QoSError as err:
            out[group] = {"error": str(err)}
            continue
        out[group] = {"l3": l3, "mb": mb}
    return out


class BeCgroupInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cgroup_version: Literal[1, 2]
    pod: kube.Pod
    enable_cfs_quota: bool = msgspec.field(default=True, name="enableCFSQuota")
    cpu_normalization_ratio: float | None = None


def be_cgroup(inp: BeCgroupInput) -> dict[str, Any]:
    try:
        pod_files, containers = qos.be_cgroup(
            inp.pod, version=inp.cgroup_version, cfs_quota=inp.enable_cfs_quota, ratio=inp.cpu_normalization_ratio
        )
    except (qos.QoSError, quantity.QuantityError) as err:
        raise InputError(f"$.pod: {err}") from None
    return {"pod": pod_files, "containers": containers}


class BeCgroupMathInput(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["milliCPUToShares", "milliCPUToQuota", "sharesToWeight", "weightToShares"]
    value: int


def be_cgroup_math(inp: BeCgroupMathInput) -> dict[str, Any]:
    functions = {
        "milliCPUToShares": qos.milli_cpu_to_shares,
        "milliCPUToQuota": qos.milli_cpu_to_quota,
        "sharesToWeight": qos.shares_to_weight,
        "weightToShares": qos.weight_to_shares,
    }
    try:
        return {"value": functions[inp.op](inp.value)}
    except qos.QoSError as err:
        return {"error": str(err)}
