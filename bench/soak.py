"""Soak: `koordbus up --simulate-nodes N` for a long time under steady API traffic; does anything grow or fail?

Run as `python bench/soak.py [flags]` (see --help) and, at toy size, by tests/e2e/test_bench_soak_smoke.py.

What runs: a real `koordbus up` process (embedded nats-server, SQLite, every service, the local agent in dry-run, N
simulated nodes, the API on a free port) with its data dir in a temporary directory, logging JSON lines; the API
token is read from the data dir. Once it is ready, this process keeps, until --duration has passed:

* --subscribers SSE clients of `/api/v1/events/stream` (filters cycling through every event, the quota events, one
  node's NodeMetrics, the batch/mid decisions) and --websockets clients of `/api/v1/events/ws`, each reading
  everything it is sent and reconnecting from its last event id when dropped;
* every --write-interval, quota writes as a quota admin (a merge patch of a leaf's min, a temporary leaf created or
  deleted), a what-if, an admission check, and the reads the dashboard and `koordbus quota` make;
* every --sample-interval, the resident set of `koordbus up` and of each of its child processes (nats-server), and a
  /metrics scrape: consumer lag (koordbus_consumer_pending_messages), dead letters
  (koordbus_consumer_dead_lettered_total), 5xx answers as the API counted them; at the start, once a minute and at
  the end, the size of the data dir (per stream and database file).

Then it stops `koordbus up` (SIGTERM: a clean shutdown) and everything else it started, and prints one JSON line:
per process and for the tree, RSS at the start, once warm (after --warmup) and at the end, the growth since the
warm-up and the least-squares slope after it (% per hour), CPU; the consumer lag's maximum after (and during) the
warm-up; error and warning lines of up's log (with the first few) and nats-server's [ERR] lines; requests sent,
5xx answers (by route, with the first bodies), other 4xx answers and failed requests; dead letters; the data dir's
size at the end and its growth per hour after the warm-up, with its largest parts; events each
subscriber received; and whether the issue's target held (RSS growth < 5 % after the warm-up, no 5xx, no error
lines). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.simulate import simulated_node_names
from bench import measure, processes
from bench import soak_figures as figures
from bus.cluster import free_port
from services.common.tasks import cancel_and_wait

log = logging.getLogger("bench.soak")

READY_TIMEOUT_SECONDS = 300.0
TREE_READABLE_TIMEOUT_SECONDS = 120.0
REQUEST_TIMEOUT_SECONDS = 60.0
RECONNECT_DELAY_SECONDS = 1.0
NAMESPACE = "soak"
PARENT = "soak-org"
LEAVES = tuple(f"soak-team-{i}" for i in range(4))
SSE_FILTERS = ("", "?type=quota.event,quota.status,quota.tree", "?type=nodemetric.computed&node={node}",
               "?type=noderesource.computed")  # fmt: skip
WS_FILTER = "?type=nodemetric.computed,noderesource.computed,quota.event"
KEEP = 5
"""Examples kept of each kind of failure."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/soak.py",
        description="Run `koordbus up --simulate-nodes N` with event subscribers, quota writes and reads for a given "
        "time; print one JSON line: RSS per process (growth and slope after the warm-up), consumer lag, error log "
        "lines, 5xx answers, dead letters, and whether the target held (RSS growth < 5 % after the warm-up, no 5xx, "
        "no error lines).",
    )
    duration = figures.parse_duration
    p.add_argument("--duration", type=duration, default="60m", help="whole run once up is ready, e.g. 90s, 60m (60m)")
    p.add_argument("--warmup", type=duration, default="10m", help="part of it before RSS and lag are judged (10m)")
    p.add_argument("--nodes", type=int, default=1000, help="simulated nodes (1000)")
    p.add_argument("--pods", type=int, default=20, help="pods per simulated node (20, up's default)")
    p.add_argument("--subscribers", type=int, default=4, help="SSE event subscribers (4)")
    p.add_argument("--websockets", type=int, default=1, help="WebSocket event subscribers (1)")
    p.add_argument("--write-interval", type=duration, default="5s", help="quota writes, what-if and reads (5s)")
    p.add_argument("--sample-interval", type=duration, default="5s", help="RSS and /metrics samples (5s)")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory: data dir, up.log, samples.json (every sample: RSS, lag, the data dir's "
        "parts)",
    )
    args = p.parse_args(argv)
    if args.nodes < 1 or args.pods < 1 or args.subscribers < 0 or args.websockets < 0:
        p.error("--nodes and --pods must be at least 1, --subscribers and --websockets not negative")
    if not 0 <= args.warmup < args.duration or args.write_interval <= 0 or args.sample_interval <= 0:
        p.error("--warmup must be shorter than --duration; --write-interval and --sample-interval positive")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/soak.py", "--duration", f"{args.duration:g}s", "--warmup", f"{args.warmup:g}s"]
    parts += ["--nodes", str(args.nodes), "--pods", str(args.pods), "--subscribers", str(args.subscribers)]
    parts += ["--websockets", str(args.websockets), "--write-interval", f"{args.write_interval:g}s"]
    return shlex.join(parts)


# --- the API traffic


@dataclass
class Answers:
    """Every answer the soak got, counted; a few of each kind of failure kept."""

    requests: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    first_server_errors: list[str] = field(default_factory=list)
    first_client_errors: list[str] = field(default_factory=list)
    failures: int = 0
    first_failures: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    """Each answered request's time to its whole answer (event streams excluded)."""
    slowest: tuple[float, str] = (0.0, "")

    def timed(self, what: str, seconds: float) -> None:
        self.seconds.append(seconds)
        if seconds > self.slowest[0]:
            self.slowest = (seconds, what)

    def record(self, what: str, status: int, body: bytes) -> None:
        self.by_class[f"{status // 100}xx"] += 1
        shown = f"{what} -> {status} {body[:300].decode(errors='replace')}"
        if status >= 500:
            self.server_errors[what] += 1
            _keep(self.first_server_errors, shown)
        elif status >= 400:
            _keep(self.first_client_errors, shown)

    def failed(self, what: str, error: BaseException) -> None:
        self.failures += 1
        _keep(self.first_failures, f"{what}: {type(error).__name__}: {error}")


def _keep(examples: list[str], text: str) -> None:
    if len(examples) < KEEP:
        examples.append(text)


class Api:
    """The API as the soak uses it: `call` counts every answer; 404 is fine where `missing_ok` (a node not yet
    reported)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str) -> None:
        self.session, self.base, self.answers = session, base, Answers()
        self.headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, route: str, path: str, body: Any = None, *, missing_ok: bool = False) -> Any:
        what = f"{method} {route}"
        self.answers.requests += 1
        started = time.monotonic()
        try:
            async with self.session.request(method, self.base + path, json=body, headers=self.headers) as response:
                data = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            self.answers.failed(what, e)
            return None
        self.answers.timed(what, time.monotonic() - started)
        if status == 404 and missing_ok:
            self.answers.by_class["4xx"] += 1
            return None
        self.answers.record(what, status, data)
        return json.loads(data) if status < 300 and data else None


def _quota(name: str, *, parent: str | None, cpu: int, is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}  # none: under the root
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"min": {"cpu": str(cpu), "memory": f"{2 * cpu}Gi"}, "max": {"cpu": str(5 * cpu), "memory": "1Ti"}},
    }


def _pod(name: str, leaf: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"quota.scheduling.koordinator.sh/name": leaf}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]},
    }


async def create_tree(api: Api) -> None:
    """The soak's quota tree, created and then read back: reads come from the quota projections, which trail a write
    by a flush (seconds while the start-up backfill keeps SQLite busy), so the traffic starts once every leaf reads
    (a 404 before that is not an error of the steady state the soak measures)."""
    await api.call("POST", "/quotas", "/api/v1/quotas", _quota(PARENT, parent=None, cpu=100, is_parent=True))
    for leaf in LEAVES:
        await api.call("POST", "/quotas", "/api/v1/quotas", _quota(leaf, parent=PARENT, cpu=10))
    deadline = time.monotonic() + TREE_READABLE_TIMEOUT_SECONDS
    for leaf in LEAVES:
        while await api.call("GET", "/quotas/{name}", f"/api/v1/quotas/{leaf}", missing_ok=True) is None:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"soak: quota {leaf} still unreadable {TREE_READABLE_TIMEOUT_SECONDS:.0f} s after its create"
                )
            await asyncio.sleep(0.2)


async def traffic(api: Api, nodes: list[str], interval: float, counts: Counter[str]) -> None:
    """Every `interval`: quota writes, a what-if, a check and the reads, one round after the other."""
    temporary: str | None = None
    for round_ in itertools.count():
        started = time.monotonic()
        leaf, node = LEAVES[round_ % len(LEAVES)], nodes[round_ % len(nodes)]
        patch = {"spec": {"min": {"cpu": str(10 + round_ % 5)}}}  # a leaf's next visit always changes its min
        await api.call("PATCH", "/quotas/{name}", f"/api/v1/quotas/{leaf}", patch)
        if temporary is None:
            temporary = f"soak-tmp-{round_}"
            await api.call("POST", "/quotas", "/api/v1/quotas", _quota(temporary, parent=PARENT, cpu=1))
        else:
            await api.call("DELETE", "/quotas/{name}", f"/api/v1/quotas/{temporary}")
            temporary = None
        what_if = {"patch": {leaf: {"spec": {"min": {"cpu": "12"}}}}, "pods": [{"pod": _pod("w", leaf), "count": 3}]}
        await api.call("POST", "/quotas/what-if", "/api/v1/quotas/what-if", what_if)
        await api.call("POST", "/quotas/check", "/api/v1/quotas/check", _pod(f"c{round_}", leaf))
        counts["quota_writes"] += 2
        counts["what_ifs"] += 1
        for route, path in (
            ("/quotas", "/api/v1/quotas"),
            ("/quotas/{name}", f"/api/v1/quotas/{leaf}"),
            ("/quotas/{name}/explain", f"/api/v1/quotas/{leaf}/explain"),
            ("/quotas/{name}/history", f"/api/v1/quotas/{leaf}/history"),
            ("/quota-trees", "/api/v1/quota-trees"),
            ("/nodemetrics", "/api/v1/nodemetrics?limit=100"),
            ("/overview/nodes", "/api/v1/overview/nodes?limit=100"),
            ("/events", "/api/v1/events?type=quota.event&limit=50"),
            ("/migrations", "/api/v1/migrations"),
        ):
            await api.call("GET", route, path)
        for route, path in (
            ("/nodemetrics/{node}", f"/api/v1/nodemetrics/{node}"),
            ("/nodes/{node}/resources", f"/api/v1/nodes/{node}/resources"),
            ("/nodes/{node}/slo", f"/api/v1/nodes/{node}/slo"),
        ):
            await api.call("GET", route, path, missing_ok=True)
        counts["rounds"] += 1
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


@dataclass
class Subscriber:
    """One event subscriber's figures."""

    path: str
    events: int = 0
    drops: int = 0
    reconnects: int = 0
    last_event_at: float = field(default_factory=time.monotonic)
    last_id: str = ""
    drop_reasons: list[str] = field(default_factory=list)


async def follow_sse(api: Api, sub: Subscriber) -> None:
    """Read the SSE stream at `sub.path` forever; after a drop or an end, reconnect from the last event id."""
    while True:
        headers = {**api.headers, "Accept": "text/event-stream"}
        if sub.last_id:
            headers["Last-Event-ID"] = sub.last_id
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_read=60)  # keepalives come every 15 s
            async with api.session.get(api.base + sub.path, headers=headers, timeout=timeout) as response:
                api.answers.requests += 1
                if response.status != 200:
                    api.answers.record("GET /events/stream", response.status, await response.read())
                else:
                    api.answers.by_class["2xx"] += 1
                    dropped = False
                    async for line in response.content:
                        if line.startswith(b"id: "):
                            sub.events += 1
                            sub.last_event_at = time.monotonic()
                            sub.last_id = line[4:].strip().decode()
                        elif line.startswith(b"event: dropped"):
                            sub.drops += 1
                            dropped = True
                        elif dropped and line.startswith(b"data: "):
                            _keep(sub.drop_reasons, line[6:].strip().decode(errors="replace"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: a line over read_bufsize
            api.answers.failed(f"GET /events/stream{sub.path}", e)
        sub.reconnects += 1
        await asyncio.sleep(RECONNECT_DELAY_SECONDS)


async def follow_ws(api: Api, sub: Subscriber) -> None:
    """Read the WebSocket at `sub.path` forever; after a drop or a close, reconnect from the last event id."""
    while True:
        path = sub.path + (f"&cursor={sub.last_id}" if sub.last_id else "")
        try:
            async with api.session.ws_connect(api.base + path, headers=api.headers, max_msg_size=0) as socket:
                api.answers.requests += 1
                api.answers.by_class["1xx"] += 1  # 101 Switching Protocols
                async for message in socket:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        continue
                    frame = json.loads(message.data)
                    if "id" in frame:
                        sub.events += 1
                        sub.last_event_at = time.monotonic()
                        sub.last_id = str(frame["id"])
                    elif frame.get("type") == "dropped":
                        sub.drops += 1
                        _keep(sub.drop_reasons, message.data)
                    elif frame.get("type") == "error":
                        api.answers.record("WS /events/ws", int(frame.get("status", 0)), message.data.encode())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            api.answers.failed(f"WS /events/ws{sub.path}", e)
        sub.reconnects += 1
        await asyncio.sleep(RECONNECT_DELAY_SECONDS)


# --- the process tree


def process_tree(root: int) -> list[int]:
    """`root` and every process descended from it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def process_name(pid: int, root: int) -> str:
    if pid == root:
        return "koordbus-up"
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return f"pid-{pid}"


@dataclass
class Samples:
    """RSS per process over time, CPU at the first and last sample, the lag and dead letters seen, the data dir's
    size."""

    names: dict[int, str] = field(default_factory=dict)
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    cpu: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    """name → (first seconds, first CPU seconds, last seconds, last CPU seconds)."""
    lag_max: tuple[float, str] = (0.0, "")
    lag_max_warmup: tuple[float, str] = (0.0, "")
    lag: list[tuple[float, float]] = field(default_factory=list)
    """(seconds, the largest consumer lag) at each scrape."""
    disk: list[tuple[float, int]] = field(default_factory=list)
    """(seconds, bytes in the data dir) at the start, once a minute and at the end."""
    disk_parts: dict[str, int] = field(default_factory=dict)
    """The last measure's bytes per stream and per database file."""
    disk_parts_series: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """Each measure's bytes per stream and per database file (samples.json)."""
    """(seconds, the largest consumer lag) at each scrape."""
    lag_at_warmup: dict[str, float] | None = None
    """Each consumer's lag at the first sample after the warm-up (to compare with the end: shrinking or growing)."""
    last_scrape: figures.Scrape | None = None
    scrape_failures: int = 0

    async def measure_disk(self, data_dir: Path, *, at: float) -> None:
        self.disk_parts = await asyncio.to_thread(disk_usage, data_dir)
        self.disk.append((at, sum(self.disk_parts.values())))
        self.disk_parts_series.append((at, self.disk_parts))

    def name(self, pid: int, root: int) -> str:
        if pid not in self.names:
            name = process_name(pid, root)
            self.names[pid] = name if name not in self.names.values() else f"{name}-{pid}"
        return self.names[pid]


async def sample(api: Api, root: int, samples: Samples, *, at: float, warmup: float) -> None:
    total = 0
    for pid in process_tree(root):
        try:
            proc = measure.read_proc(pid)
        except (OSError, ValueError):
            continue  # gone between the listing and the read
        name = samples.name(pid, root)
        samples.rss.setdefault(name, []).append((at, proc.rss_bytes))
        first = samples.cpu.get(name, (at, proc.cpu_seconds, at, proc.cpu_seconds))
        samples.cpu[name] = (first[0], first[1], at, proc.cpu_seconds)
        total += proc.rss_bytes
    samples.rss.setdefault("total", []).append((at, total))
    try:
        async with api.session.get(api.base + "/metrics", headers=api.headers) as response:
            scrape = figures.parse_scrape(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        samples.scrape_failures += 1
        log.warning("/metrics scrape failed: %s", e)
        return
    samples.last_scrape = scrape
    if at >= warmup and samples.lag_at_warmup is None:
        samples.lag_at_warmup = scrape.lag
    if scrape.lag:
        consumer, lag = max(scrape.lag.items(), key=lambda item: item[1])
        samples.lag.append((at, lag))
        if at < warmup and lag > samples.lag_max_warmup[0]:
            samples.lag_max_warmup = (lag, consumer)
        elif at >= warmup and lag > samples.lag_max[0]:
            samples.lag_max = (lag, consumer)


def disk_usage(data_dir: Path) -> dict[str, int]:
    """Bytes per JetStream stream (its directory) and per other file of `up`'s data dir (the SQLite database)."""
    parts: dict[str, int] = {}
    streams = data_dir.glob("nats/jetstream/jetstream/*/streams/*")
    for part in [*streams, *(p for p in data_dir.iterdir() if p.is_file())]:
        files = [part] if part.is_file() else [f for f in part.rglob("*") if f.is_file()]
        with contextlib.suppress(OSError):
            parts[part.name] = sum(f.stat().st_size for f in files)
    return parts


def stop_leftovers(pids: list[int]) -> list[int]:
    """SIGTERM then SIGKILL any of `pids` (children of `koordbus up`) still running; the ones that were."""
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in left):
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
        return text[text.rindex(")") + 2 :].split()[0]
    except OSError:
        return ""


# --- the run


async def wait_until_up(
    session: aiohttp.ClientSession, base: str, up: subprocess.Popen[bytes], token_file: Path, log_path: Path
) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"koordbus up exited during start-up:\n{processes.tail(log_path)}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            async with session.get(base + "/readyz") as response:
                if response.status == 200:  # up wrote its token before it started serving
                    return (await asyncio.to_thread(token_file.read_text)).strip()
        await asyncio.sleep(0.5)
    raise RuntimeError(f"koordbus up was not ready within {READY_TIMEOUT_SECONDS:.0f} s:\n{processes.tail(log_path)}")


async def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Start `koordbus up`, `drive` it for --duration once it is ready, stop it and what it left behind; the figures."""
    port, data_dir, log_path = free_port(), workdir / "data", workdir / "up.log"
    command = [sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
               "--simulate-nodes", str(args.nodes), "--simulate-pods", str(args.pods),
               "--log-format", "json"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    samples, counts = Samples(), Counter[str]()
    launched = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    children: set[int] = set()
    try:
        with processes.pinned_process(command, cpu=None, log_path=log_path, env=env) as up:
            log.info("koordbus up pid %d on port %d, %d simulated nodes; data in %s", up.pid, port, args.nodes,
                     data_dir)  # fmt: skip
            try:
                async with aiohttp.ClientSession(timeout=timeout, read_bufsize=2**22) as session:
                    token = await wait_until_up(session, base, up, data_dir / "api-token", log_path)
                    started = time.monotonic()
                    log.info("ready after %.1f s; soaking for %g s (warm-up %g s)", started - launched, args.duration,
                             args.warmup)  # fmt: skip
                    api = Api(session, base, token)
                    subscribers = await drive(args, api, up, samples, counts, started=started, log_path=log_path,
                                              data_dir=data_dir)  # fmt: skip
                    ended = time.monotonic()
            finally:
                children = {pid for pid in [*samples.names, *process_tree(up.pid)] if pid != up.pid}
    finally:  # up stops its children itself (also on Ctrl-C); any it leaves behind are stopped here
        leftovers = stop_leftovers(sorted(children))
    return report(args, samples, api, subscribers, counts, log_path=log_path, nats_log=data_dir / "nats-server.log",
                  seconds=ended - started, startup=started - launched, exit_code=up.returncode,
                  leftovers=leftovers, ended=ended)  # fmt: skip


async def drive(
    args: argparse.Namespace,
    api: Api,
    up: subprocess.Popen[bytes],
    samples: Samples,
    counts: Counter[str],
    *,
    started: float,
    log_path: Path,
    data_dir: Path,
) -> list[Subscriber]:
    """The soak proper: the quota tree, then traffic and subscribers running and a sample every --sample-interval
    until --duration has passed since `started`; the subscribers' figures."""
    nodes = simulated_node_names(args.nodes)
    # The subscribers first, as up becomes ready: they see the start-up backfill's reports flow, where one node's live
    # report comes once a minute (a short run that starts them late may see none)
    subscribers: list[Subscriber] = []
    tasks: list[asyncio.Task[None]] = []
    for i in range(args.subscribers):
        subscribers.append(
            Subscriber("/api/v1/events/stream" + SSE_FILTERS[i % len(SSE_FILTERS)].format(node=nodes[0]))
        )
        tasks.append(asyncio.create_task(follow_sse(api, subscribers[-1])))
    for _ in range(args.websockets):
        subscribers.append(Subscriber("/api/v1/events/ws" + WS_FILTER))
        tasks.append(asyncio.create_task(follow_ws(api, subscribers[-1])))
    try:
        await create_tree(api)
        tasks.append(asyncio.create_task(traffic(api, nodes, args.write_interval, counts)))
        await samples.measure_disk(data_dir, at=time.monotonic() - started)
        next_report = started + 60
        next_sample = time.monotonic()
        while (now := time.monotonic()) < started + args.duration:
            if up.poll() is not None:
                raise RuntimeError(f"koordbus up died during the soak:\n{processes.tail(log_path)}")
            await sample(api, up.pid, samples, at=now - started, warmup=args.warmup)
            if now >= next_report:
                next_report += 60
                await samples.measure_disk(data_dir, at=now - started)
                log.info("%.0f s: RSS %.0f MiB, data dir %.0f MiB, %d requests, %d 5xx", now - started,
                         samples.rss["total"][-1][1] / 2**20, samples.disk[-1][1] / 2**20, api.answers.requests,
                         sum(api.answers.server_errors.values()))  # fmt: skip
            # at a fixed rate: the time a sample takes (a slow /metrics scrape on a busy machine) is not added to it
            next_sample = max(next_sample + args.sample_interval, time.monotonic())
            await processes.pause(min(next_sample, started + args.duration) - time.monotonic())
        await sample(api, up.pid, samples, at=time.monotonic() - started, warmup=args.warmup)
        await samples.measure_disk(data_dir, at=time.monotonic() - started)
    finally:
        await asyncio.gather(*(cancel_and_wait(task) for task in tasks))
    return subscribers


def report(
    args: argparse.Namespace,
    samples: Samples,
    api: Api,
    subscribers: list[Subscriber],
    counts: Counter[str],
    *,
    log_path: Path,
    nats_log: Path,
    seconds: float,
    startup: float,
    exit_code: int | None,
    leftovers: list[int],
    ended: float,
) -> dict[str, Any]:
    series = {"rss_bytes": samples.rss, "max_consumer_lag": samples.lag, "disk_bytes": samples.disk_parts_series}
    (log_path.parent / "samples.json").write_text(json.dumps(series))  # kept with --keep
    lines = figures.classify_log(log_path.read_text(errors="replace").splitlines())
    nats_errors = figures.nats_log_errors(
        nats_log.read_text(errors="replace").splitlines() if nats_log.exists() else []
    )
    per_process = {}
    for name, points in samples.rss.items():
        trend = figures.rss_trend(points, warmup=args.warmup)
        entry: dict[str, Any] = {
            "rss_start_mb": trend.start_mb,
            "rss_after_warmup_mb": trend.after_warmup_mb,
            "rss_end_mb": trend.end_mb,
            "rss_peak_mb": trend.peak_mb,
            "rss_growth_percent_after_warmup": trend.growth_percent_after_warmup,
            "rss_slope_percent_per_hour": trend.slope_percent_per_hour,
        }
        if name in samples.cpu:
            t0, cpu0, t1, cpu1 = samples.cpu[name]
            entry["cpu_cores"] = round((cpu1 - cpu0) / (t1 - t0), 3) if t1 > t0 else 0.0
        per_process[name] = entry
    total = per_process.pop("total")
    answers = api.answers
    http_5xx = sum(answers.server_errors.values())
    scrape = samples.last_scrape or figures.Scrape(lag={}, dead_letters={}, server_5xx={})
    dead = {k: int(v) for k, v in scrape.dead_letters.items() if v}
    misses = figures.misses(
        growth_percent=total["rss_growth_percent_after_warmup"], http_5xx=http_5xx, error_lines=lines.errors
    )
    return {
        "bench": "soak",
        "nodes": args.nodes,
        "pods_per_node": args.pods,
        "duration_s": round(seconds, 1),
        "warmup_s": args.warmup,
        "startup_s": round(startup, 1),
        "samples": len(samples.rss["total"]),
        **{k: v for k, v in total.items()},
        "processes": per_process,
        "consumer_lag_max": int(samples.lag_max[0]),
        "consumer_lag_max_consumer": samples.lag_max[1],
        "consumer_lag_max_during_warmup": int(samples.lag_max_warmup[0]),
        "consumer_lag_settled_s": _rounded(figures.settled_at(samples.lag, limit=args.nodes)),
        "consumer_lag_at_warmup": {k: int(v) for k, v in (samples.lag_at_warmup or {}).items() if v},
        "consumer_lag_end": {k: int(v) for k, v in scrape.lag.items() if v},
        "consumers_watched": len(scrape.lag),
        "error_log_lines": lines.errors,
        "error_log_first": lines.first_errors,
        "warning_log_lines": lines.warnings,
        "warning_log_first": lines.first_warnings,
        "nats_error_lines": len(nats_errors),
        "nats_error_first": nats_errors[:KEEP],
        "data_dir_mb_end": round(samples.disk[-1][1] / 2**20, 1),
        "data_dir_growth_mb_per_hour": round(
            figures.slope([(t, b) for t, b in samples.disk if t >= args.warmup]) * 3600 / 2**20, 1
        ),
        "data_dir_largest_mb": {
            name: round(size / 2**20, 1)
            for name, size in sorted(samples.disk_parts.items(), key=lambda item: -item[1])[:KEEP]
        },
        "requests_total": answers.requests,
        "request_p50_s": _rounded(measure.quantile(answers.seconds, 0.5)),
        "request_p99_s": _rounded(measure.quantile(answers.seconds, 0.99)),
        "request_max_s": round(answers.slowest[0], 3),
        "request_slowest": answers.slowest[1],
        "answers": dict(sorted(answers.by_class.items())),
        "http_5xx": http_5xx,
        "http_5xx_by_route": dict(answers.server_errors),
        "http_5xx_first": answers.first_server_errors,
        "server_5xx_by_route": {k: int(v) for k, v in scrape.server_5xx.items()},
        "http_4xx_first": answers.first_client_errors,
        "request_failures": answers.failures,
        "request_failures_first": answers.first_failures,
        "metrics_scrape_failures": samples.scrape_failures,
        "traffic_rounds": counts["rounds"],
        "quota_writes": counts["quota_writes"],
        "what_ifs": counts["what_ifs"],
        "subscribers": [
            {
                "path": s.path,
                "events": s.events,
                "drops": s.drops,
                "drop_reasons": s.drop_reasons,
                "reconnects": s.reconnects,
                "last_event_age_s": round(ended - s.last_event_at, 1),
            }
            for s in subscribers
        ],
        "dead_letters": sum(dead.values()),
        "dead_letters_by_consumer": dead,
        "up_exit_code": exit_code,
        "leftover_processes": leftovers,
        "target_held": not misses,
        "target_misses": misses,
        "command": command_line(args),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def main(argv: list[str] | None = None) -> int:
    return processes.run_bench(parse_args(argv), soak, prefix="koordbus-soak-")


if __name__ == "__main__":
    sys.exit(main())
