"""`koordbus up` supervises its nats-server and always stops in time (issue #19, point 3), as real processes.

* Its nats-server killed: `up` used to keep answering /healthz 200 and every write 503 forever; now it stops within
  the bound, exits non-zero and says why.
* SIGTERM or SIGINT reaching both `up` and its nats-server, in either order (a supervisor may signal every
  process): `up` exits within 10 s (it used to reconnect forever, deaf to further signals).
* A terminal's Ctrl-C (SIGINT to `up`'s process group, as on `make up`): `up` stops cleanly, exit 0, its services
  first and then its nats-server (the server shared the group, stopped at once under the services still using it,
  and `up` exited 1 at its 8 s shutdown deadline).
* Started again on the same port right after a SIGKILL, with a connection of the killed process in TIME_WAIT: it
  starts (the port check bound without SO_REUSEADDR and refused for about a minute).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.cluster import free_port

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

EXIT_BOUND_SECONDS = 10.0


class Up:
    """One `koordbus up` process with its output in a file."""

    def __init__(self, data_dir: Path, port: int, log_path: Path, *args: str) -> None:
        self.data_dir, self.port, self.log_path = data_dir, port, log_path
        command = [sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data_dir), "--port", str(port), *args]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(  # a process group of its own, as a terminal's foreground job
                [*command, "--no-agent"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"koordbus up exited early:\n{self.log()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"koordbus up not ready within 60 s:\n{self.log()}")

    def nats_pid(self) -> int:
        """The embedded nats-server's pid, from the ports file it writes (named after its pid)."""
        (ports,) = (self.data_dir / "nats" / "ports").glob("*.ports")
        return int(ports.stem.rsplit("_", 1)[1])

    def exit_code_within(self, seconds: float) -> int:
        try:
            return self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"koordbus up still running after {seconds:.0f} s:\n{self.log()[-3000:]}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def ready_up(tmp_path: Path, *args: str) -> Iterator[Up]:
    """`koordbus up` with `args`, yielded once ready; killed afterwards, its nats-server too."""
    up = Up(tmp_path / "data", free_port(), tmp_path / "up.log", *args)
    nats_pid = 0
    try:
        up.wait_ready()
        nats_pid = up.nats_pid()
        yield up
    finally:
        up.kill()
        if nats_pid:
            kill_quietly(nats_pid)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Up]:
    yield from ready_up(tmp_path)


@pytest.fixture
def simulating(tmp_path: Path) -> Iterator[Up]:
    """With a small simulated cluster, as the README's `make up ARGS="--simulate-nodes 50"`."""
    yield from ready_up(tmp_path, "--simulate-nodes", "3")


def test_up_stops_with_a_clear_message_when_its_nats_server_dies(started: Up) -> None:
    os.kill(started.nats_pid(), signal.SIGKILL)
    code = started.exit_code_within(EXIT_BOUND_SECONDS)
    assert code != 0
    assert "the embedded nats-server exited (code -9)" in started.log()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("first", ["up", "nats-server"])
def test_up_exits_in_time_when_the_signal_reaches_it_and_its_nats_server(
    started: Up, signum: signal.Signals, first: str
) -> None:
    nats_pid = started.nats_pid()
    order = [started.process.pid, nats_pid] if first == "up" else [nats_pid, started.process.pid]
    sent = time.monotonic()
    for pid in order:
        os.kill(pid, signum)
    started.exit_code_within(EXIT_BOUND_SECONDS)
    assert time.monotonic() - sent < EXIT_BOUND_SECONDS


def test_up_stops_cleanly_on_a_terminals_ctrl_c(simulating: Up) -> None:
    # The server took the terminal's SIGINT too and went first; the shutdown of the parts still using the bus was then
    # cut at the deadline (seen from about 30 s after the start).
    nats_pid = simulating.nats_pid()
    wait_for_log(simulating, "bindings: ")  # the simulated cluster is placing its pods through the extender
    os.killpg(simulating.process.pid, signal.SIGINT)
    assert simulating.exit_code_within(EXIT_BOUND_SECONDS) == 0, simulating.log()[-3000:]
    assert "did not finish" not in simulating.log()
    with pytest.raises(ProcessLookupError):  # stopped and reaped by `up`
        os.kill(nats_pid, 0)
    server_log = (simulating.data_dir / "nats-server.log").read_text()
    assert 'Trapped "terminated" signal' in server_log  # `up`'s SIGTERM once its services stopped …
    assert 'Trapped "interrupt" signal' not in server_log  # … not the terminal's SIGINT


def test_up_stops_cleanly_when_the_signal_reaches_it_and_its_server_with_trained_models(simulating: Up) -> None:
    # A supervisor signalling every process (systemd's default KillMode): the server gone first, `up`'s stop used to
    # wait on the prediction snapshots it saves at stop until the 8 s deadline cut it ('shutdown did not finish',
    # exit 1), and, once that wait was bounded, asyncio.run's cleanup waited forever for a reconnect loop whose
    # cancellation Python 3.11's wait_for had swallowed.
    wait_for_models(simulating, "sim-node-0001")
    sent = time.monotonic()
    os.kill(simulating.nats_pid(), signal.SIGTERM)
    os.kill(simulating.process.pid, signal.SIGTERM)
    assert simulating.exit_code_within(EXIT_BOUND_SECONDS) == 0, simulating.log()[-3000:]
    assert time.monotonic() - sent < EXIT_BOUND_SECONDS
    assert "did not finish" not in simulating.log()


def wait_for_models(up: Up, node: str) -> None:
    """Until the nodemetric service holds trained prediction models for `node` (what it snapshots at stop)."""
    token = (up.data_dir / "api-token").read_text().strip()
    request = urllib.request.Request(
        f"http://127.0.0.1:{up.port}/api/v1/nodes/{node}/prediction", headers={"Authorization": f"Bearer {token}"}
    )
    deadline = time.monotonic() + 120
    while True:
        assert up.process.poll() is None, f"koordbus up exited early:\n{up.log()[-3000:]}"
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as e:
            assert e.code == 404, e  # no models yet
        assert time.monotonic() < deadline, f"no prediction models for {node} within 120 s"
        time.sleep(0.5)


def wait_for_log(up: Up, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in up.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log within 60 s:\n{up.log()[-3000:]}"
        assert up.process.poll() is None, f"koordbus up exited early:\n{up.log()[-3000:]}"
        time.sleep(0.2)


def test_up_starts_again_on_the_same_port_right_after_a_sigkill(tmp_path: Path) -> None:
    port = free_port()
    first = Up(tmp_path / "first", port, tmp_path / "first.log")
    orphans: list[int] = []
    second: Up | None = None
    try:
        first.wait_ready()
        orphans.append(first.nats_pid())  # SIGKILL leaves the child running: killed at the end
        held = http.client.HTTPConnection("127.0.0.1", port, timeout=5)  # a keep-alive connection the kill closes
        held.request("GET", "/healthz")
        assert held.getresponse().read()
        first.kill()
        held.close()
        second = Up(tmp_path / "second", port, tmp_path / "second.log")
        second.wait_ready()
        orphans.append(second.nats_pid())
    finally:
        first.kill()
        if second is not None:
            second.kill()
        for pid in orphans:
            kill_quietly(pid)
