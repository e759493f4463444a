"""Pods a simulated node (agent.simulate) runs besides the ones it starts with: pure.

`koordbus up --simulate-nodes` schedules pods onto simulated nodes as a cluster's scheduler would (koordbus.simcluster)
and moves them when a migration evicts them. Each such pod carries a `UsageProfile`: its mean CPU and memory, the
amplitude of its 24 h cycle and the hour it peaks, so a pod moved to another node uses there what it used before.
`usage` gives the per-second CPU (cores) and memory (bytes) of a set of profiles over an array of instants, in the
same shape agent.simulate draws its online pods' usage: a cosine over the day with a little noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

DAY = 86_400.0
FloatArray = npt.NDArray[np.float64]


class UsageProfile(NamedTuple):
    """How a pod uses its node: `cpu` cores on average, `memory` bytes, ± `amplitude` × cpu over a day peaking at
    `peak` seconds after midnight UTC."""

    cpu: float
    memory: float
    amplitude: float
    peak: float


def usage(profiles: Sequence[UsageProfile], t: FloatArray, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """(cpu, memory) arrays of shape (len(profiles), len(t)): each profile's usage at each instant."""
    n = len(profiles)
    if n == 0:
        empty = np.zeros((0, t.size))
        return empty, empty.copy()
    cpu_mean = np.array([p.cpu for p in profiles])[:, None]
    memory = np.array([p.memory for p in profiles])[:, None]
    amplitude = np.array([p.amplitude for p in profiles])[:, None]
    peak = np.array([p.peak for p in profiles])[:, None]
    diurnal = 1 + amplitude * np.cos(2 * np.pi * (t[None, :] - peak) / DAY)
    cpu = cpu_mean * diurnal * (1 + 0.08 * rng.standard_normal((n, t.size)))
    mem = memory * (0.9 + 0.1 * diurnal / 1.6) * (1 + 0.005 * rng.standard_normal((n, t.size)))
    return np.clip(cpu, 0.001, None), np.clip(mem, 0, None)
