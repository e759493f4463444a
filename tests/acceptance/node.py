"""The acceptance suite's real node: a private kubepods cgroup hierarchy on this machine's kernel, processes inside it
that burn a known share of a CPU and hold a known amount of memory, and a kubelet-shaped `/pods` endpoint.

`Hierarchy` makes `/sys/fs/cgroup/<controller>/koordbus-acceptance-<pid>-<hex>/kubepods/...` in the cpu, cpuacct,
cpuset and memory hierarchies (cgroup v1, the kubelet's cgroupfs layout; the tree weighs CPUs × 1024 shares against
the machine's other tasks, as the kubelet's kubepods does), and in perf_event too where this machine mounts it
writable on v1 (the agent's CPI counters count a pod's cgroup of that hierarchy), starts `Burner` processes that move
themselves into a container's cgroups before they burn, and on `close()` kills every process it started (and any
other task left in its cgroups) and removes its directories leaf first — also when the test failed. `leftovers()`
says what of it is still there, for the test that teardown leaves nothing behind. `Kubelet` serves the fake API
server's pods of the node as the kubelet's `/pods` does. Used by tests/acceptance/test_node_acceptance.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
OPTIONAL_CONTROLLERS = ("perf_event",)
"""Made too where this machine mounts them writable on v1; the suite runs without them."""
QOS_DIRS = {"Guaranteed": "kubepods", "Burstable": "kubepods/burstable", "BestEffort": "kubepods/besteffort"}

# Burns `share` of one CPU in 10 ms slices and holds `mib` MiB (every page written), after moving itself into the
# cgroup.procs files it is given; prints "ready" once it is inside all of them and holds its memory.
_BURNER = """
import os, sys, time
share, mib = float(sys.argv[1]), int(sys.argv[2])
paths = sys.argv[3:]
# The memory is charged where it is touched, so the memory cgroup comes first (on v2 the one cgroup); the CPU ones
# after the allocation, which a suppressed besteffort quota (2 ms per 100 ms) would otherwise stretch to minutes.
first = [p for p in paths if "/memory/" in p] or paths
def join(group):
    for procs in group:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
join(first)
held = b"\\x01" * (mib << 20)
join([p for p in paths if p not in first])
print("ready", flush=True)
period = 0.01
while True:
    start = time.monotonic()
    while time.monotonic() - start < share * period:
        pass
    rest = start + period - time.monotonic()
    if rest > 0:
        time.sleep(rest)
"""


def v1_writable() -> str | None:
    """None when the cgroup v1 controllers this suite needs are mounted and writable here, else why not."""
    for controller in CONTROLLERS:
        path = CGROUP_ROOT / controller
        if not (path / "cgroup.procs").exists():
            return f"{path} is not a cgroup v1 hierarchy"
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
    return None


def _v1_writable(controller: str) -> bool:
    path = CGROUP_ROOT / controller
    return (path / "cgroup.procs").exists() and not (path / "cgroup.controllers").exists() and os.access(path, os.W_OK)


def v2_usable() -> str | None:
    """None when a unified (v2) hierarchy with the cpu and memory controllers is writable here, else why not."""
    for path in (CGROUP_ROOT / "unified", CGROUP_ROOT):
        controllers = path / "cgroup.controllers"
        if controllers.exists():
            have = set(controllers.read_text().split())
            if {"cpu", "memory"} <= have and os.access(path, os.W_OK):
                return None
            return f"{path} is cgroup v2 with controllers {sorted(have) or 'none'}: no cpu and memory to manage"
    return "no cgroup v2 hierarchy is mounted"


@dataclass(frozen=True)
class PodSpec:
    name: str
    namespace: str
    kube_qos: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    container_id: str = field(default_factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex)

    @property
    def rel(self) -> str:
        """The pod cgroup relative to the hierarchy's kubepods parent."""
        return f"{QOS_DIRS[self.kube_qos]}/pod{self.uid}"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Burner:
    """One process inside a container's cgroups; `stop()` kills it and waits for it."""

    def __init__(self, procs: list[Path], *, share: float, mib: int) -> None:
        self.share, self.mib = share, mib
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BURNER, str(share), str(mib), *map(str, procs)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        try:
            line = self.process.stdout.readline().strip()
        except BaseException:  # a test timeout while it starts: no process or pipe left behind
            self.stop()
            raise
        if line != "ready":
            self.stop()
            raise AssertionError(f"a burner did not start (it printed {line!r}): see its stderr above")

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Hierarchy:
    """A private kubepods tree in each v1 controller, its pods' cgroups and the processes started in them."""

    def __init__(self) -> None:
        self.parent = f"koordbus-acceptance-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.burners: list[Burner] = []
        self.made: list[Path] = []
        self.controllers = CONTROLLERS + tuple(c for c in OPTIONAL_CONTROLLERS if _v1_writable(c))
        """The hierarchies this tree is made in."""
        for qos_dir in QOS_DIRS.values():
            self._mkdirs(qos_dir)
        # the weight the kubelet gives kubepods against the rest of the machine: its CPUs × 1024 shares (our kubepods
        # sits one directory lower, so the directory competing with the machine's other tasks gets it)
        self.path("cpu").joinpath("cpu.shares").write_text(str((os.cpu_count() or 1) * 1024))

    def path(self, controller: str, rel: str = "") -> Path:
        return CGROUP_ROOT / controller / self.parent / rel if rel else CGROUP_ROOT / controller / self.parent

    def _mkdirs(self, rel: str) -> None:
        for controller in self.controllers:
            current = CGROUP_ROOT / controller
            for part in Path(self.parent, rel).parts:
                parent, current = current, current / part
                if current.is_dir():
                    continue
                current.mkdir()
                self.made.append(current)
                if controller == "cpuset":  # a v1 cpuset takes no task until it has CPUs and memory nodes
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (current / name).write_text((parent / name).read_text())

    def add_pod(self, pod: PodSpec) -> None:
        self._mkdirs(f"{pod.rel}/{pod.container_id}")

    def add_container(self, pod: PodSpec, container_id: str) -> None:
        """One more container cgroup in `pod` (the kubelet's pod list does not name it)."""
        self._mkdirs(f"{pod.rel}/{container_id}")

    def start(self, pod: PodSpec, *, share: float, mib: int, container_id: str = "") -> Burner:
        """A process in `pod`'s container (its own unless `container_id` names one added with add_container)
        burning `share` of a CPU and holding `mib` MiB."""
        rel = f"{pod.rel}/{container_id or pod.container_id}"
        procs = [self.path(c, rel) / "cgroup.procs" for c in self.controllers]
        burner = Burner(procs, share=share, mib=mib)
        self.burners.append(burner)
        return burner

    def cpu_ns(self, pod: PodSpec) -> int:
        return int(self.path("cpuacct", pod.rel).joinpath("cpuacct.usage").read_text())

    def read(self, controller: str, rel: str, name: str) -> str:
        return self.path(controller, rel).joinpath(name).read_text().strip()

    def tasks(self) -> list[int]:
        """Every task in any cgroup of the tree."""
        found: list[int] = []
        for controller in self.controllers:
            top = self.path(controller)
            if top.is_dir():
                for procs in top.rglob("cgroup.procs"):
                    found.extend(int(p) for p in procs.read_text().split())
        return sorted(set(found))

    def close(self) -> None:
        """Kill what was started (and anything else left in the tree), then remove the directories leaf first."""
        for burner in self.burners:
            burner.stop()
        for pid in self.tasks():  # only tasks inside this test's own cgroups
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.tasks() and time.monotonic() < deadline:
            time.sleep(0.05)  # a SIGKILLed task leaves its cgroups when the kernel has finished it
        for controller in self.controllers:
            top = self.path(controller)
            if top.is_dir():
                for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    self._rmdir(directory)
                self._rmdir(top)

    @staticmethod
    def _rmdir(directory: Path) -> None:
        try:
            directory.rmdir()
        except OSError as e:  # keep removing the rest; leftovers() names what stayed
            log.error("acceptance teardown: cannot remove %s: %s", directory, e)

    def leftovers(self) -> list[str]:
        """What of this tree is still there: directories and running processes."""
        left = [str(self.path(c)) for c in self.controllers if self.path(c).exists()]
        left += [f"pid {b.pid}" for b in self.burners if b.process.poll() is None]
        return left


@contextlib.contextmanager
def running_hierarchy() -> Iterator[Hierarchy]:
    """A Hierarchy closed on the way out however the block ends; AssertionError when something of it is left."""
    hierarchy = Hierarchy()
    try:
        yield hierarchy
    finally:
        hierarchy.close()
        left = hierarchy.leftovers()
        assert not left, f"teardown left behind: {left}"


class Kubelet:
    """A kubelet-shaped `GET /pods` (a PodList of the node's pods) serving what `pods()` returns at each request."""

    def __init__(self, pods: Callable[[], list[dict[str, Any]]]) -> None:
        self._pods = pods
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Kubelet:
        app = web.Application()
        app.router.add_get("/pods", self._list)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/pods"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": self._pods()})
