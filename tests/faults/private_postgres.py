"""A private PostgreSQL cluster for fault tests: initdb in a temp dir, trust auth, a free port, stop and start at will.

The fault tests stop PostgreSQL under a running service; they must never touch the machine's shared server on
127.0.0.1:5432 that every other test uses. The binaries come from /usr/lib/postgresql/<version>/bin (the newest
found, or KOORDBUS_TEST_PG_BIN). PostgreSQL refuses to run as root, so under root the cluster's directory belongs
to the `postgres` user and every command runs through `runuser -u postgres`. `missing_reason()` says why the cluster
cannot be run here (the test skips with that reason).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import asyncpg

from bus.cluster import free_port

PG_BIN_ENV = "KOORDBUS_TEST_PG_BIN"
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
SERVER_USER = "postgres"
"""Under root the server runs as this OS user; it is also the database superuser `initdb -U` creates."""
COMMAND_TIMEOUT_SECONDS = 60


def _bin_dir() -> Path | None:
    if configured := os.environ.get(PG_BIN_ENV):
        return Path(configured)
    found = sorted(Path("/").glob(PG_BIN_GLOB.lstrip("/")), key=lambda p: _major(p.parent.name))
    return found[-1] if found else None


def _major(version: str) -> int:
    return int(version) if version.isdigit() else -1


def _as_server_user() -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--"] if os.geteuid() == 0 else []


def missing_reason() -> str | None:
    """None when a private cluster can be run here, else why not."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        return f"no PostgreSQL server binaries under {PG_BIN_GLOB} (install postgresql, or set {PG_BIN_ENV})"
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not (bin_dir / tool).is_file():
            return f"{bin_dir / tool} is missing"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root, and runuser (needed to start PostgreSQL as a non-root user) is missing"
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, and there is no {SERVER_USER!r} user to run PostgreSQL as"
    return None


class PrivatePostgres:
    """One throwaway cluster: `create()`, `start()`, `stop()` (fast: sessions are cut), `start()` again, `destroy()`.

    Its directory is made with tempfile (not pytest's tmp_path, which the `postgres` user cannot enter)."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            raise RuntimeError(missing_reason() or "no PostgreSQL binaries")
        self._bin = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="koordbus-pg-"))
        self._data = self.root / "data"
        self._log = self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create(self) -> None:
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._run("initdb", "-D", str(self._data), "-A", "trust", "-U", SERVER_USER, "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self._log), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self._data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs (a failed test may leave it so) and remove its directory."""
        if (self._data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def server_log(self) -> str:
        try:
            return self._log.read_text(errors="replace")
        except OSError:
            return ""

    async def create_database(self, name: str) -> str:
        """A new empty database on the cluster; returns its URL."""
        connection = await asyncpg.connect(self.url(), timeout=10)
        try:
            await connection.execute(f'CREATE DATABASE "{name}"')
        finally:
            await connection.close()
        return self.url(name)

    def _run(self, tool: str, *args: str) -> None:
        command = [*_as_server_user(), str(self._bin / tool), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}\n{self.server_log()}"
            )
