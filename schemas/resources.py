"""Resource lists as plain integers, and the list algebra Koordinator's calculations use (spec conventions).

A ResourceList maps a resource name to an integer amount: `cpu` and every `*-cpu` resource in
millicores, everything else in base units (bytes for memory). Kubernetes quantity strings are
turned into these integers at the edges (schemas.quantity); calculations never see strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ResourceList = dict[str, int]

CPU = "cpu"
MEMORY = "memory"


def is_milli_resource(name: str) -> bool:
    """Whether amounts of `name` are counted in millicores (cpu, batch-cpu, mid-cpu …)."""
    return name == CPU or name.endswith("-cpu")


def add(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Union of keys, amounts summed (a missing key counts as 0)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Keys of both; a key only in `b` appears negated."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def sub_nonneg(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """`sub`, every result clamped at 0."""
    return {k: max(v, 0) for k, v in sub(a, b).items()}


def max_rl(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Union of keys; the larger amount where both have the key, the one amount where only one has it."""
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out[k], v) if k in out else v
    return out


def min_rl(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Intersection of keys, the smaller amount."""
    return {k: min(v, b[k]) for k, v in a.items() if k in b}


def mask(a: Mapping[str, int], names: Iterable[str]) -> ResourceList:
    """Only the listed keys."""
    keep = set(names)
    return {k: v for k, v in a.items() if k in keep}


def leq(a: Mapping[str, int], limit: Mapping[str, int]) -> bool:
    """True unless some key of `limit` that `a` also has is larger in `a` (keys absent from `limit` are free)."""
    return all(a[k] <= v for k, v in limit.items() if k in a)


def total(lists: Iterable[Mapping[str, int]]) -> ResourceList:
    """The sum of many lists."""
    out: ResourceList = {}
    for rl in lists:
        for k, v in rl.items():
            out[k] = out.get(k, 0) + v
    return out
