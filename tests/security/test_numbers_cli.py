"""Issue #19, numbers on the command line: a port or count out of range is a usage error naming the flag (exit 2,
one line on stderr), never a traceback from deep inside a subcommand (`koordbus up --port 1832767` was an
OverflowError from the port check's socket call)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from koordbus.cli import build_parser


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["up", "--port", "1832767"], "--port"),
        (["up", "--port", "-1"], "--port"),
        (["up", "--port", "8o80"], "--port"),
        (["up", "--extender-port", "65536"], "--extender-port"),
        (["up", "--simulate-nodes", "-3"], "--simulate-nodes"),
        (["up", "--simulate-pods", "0"], "--simulate-pods"),
        (["up", "--simulate-backfill", "nan"], "--simulate-backfill"),
        (["up", "--simulate-backfill", "1e400"], "--simulate-backfill"),
        (["up", "--nats-cluster", "1000"], "--nats-cluster"),
        (["api", "--port", "99999"], "--port"),
        (["service", "nodemetric", "--port", "70000"], "--port"),
    ],
)
def test_a_number_out_of_range_is_a_usage_error_naming_its_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_the_agent_port_is_checked_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(command="agent").parse_args(["agent", "--port", "1832767"])
    assert "argument --port: 1832767 is out of range (0 to 65535)" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "port"), [(["up", "--port", "0"], 0), (["up", "--port", "65535"], 65535)])
def test_the_bounds_themselves_are_accepted(argv: list[str], port: int) -> None:
    assert build_parser().parse_args(argv).port == port


def test_up_with_a_port_out_of_range_exits_2_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "koordbus.cli", "up", "--port", "1832767"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "argument --port: 1832767 is out of range" in done.stderr
