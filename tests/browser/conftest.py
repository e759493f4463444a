"""Fixtures for the dashboard tests in a real browser: Debian's Chromium (/usr/bin/chromium) driven by Playwright
(never a downloaded browser), `koordbus up --simulate-nodes 50` as a real process (its load-aware extender on a
free port), and the artefact directory for screenshots (test-artifacts/browser/ at the repository root,
git-ignored).

Without /usr/bin/chromium every test here is skipped and the terminal summary says so in a banner, like the
PostgreSQL skips; `.ci/run` installs the package (`apt-get install -y chromium`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _pytest.terminal import TerminalReporter

from bus.cluster import free_port

CHROMIUM = Path(os.environ.get("KOORDBUS_TEST_CHROMIUM", "/usr/bin/chromium"))
NO_CHROMIUM = (
    f"SKIPPED LOUDLY: {CHROMIUM} is missing, so the dashboard was NOT tested in a browser; "
    "install it with `apt-get install -y chromium` (Debian) to run tests/browser"
)
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
SIMULATED_NODES = 50
SCREENSHOTS = Path(os.environ["KOORDBUS_SCREENSHOTS_DIR"]) if os.environ.get("KOORDBUS_SCREENSHOTS_DIR") else None
"""Where `make screenshots` wants a copy of each screenshot (docs/screenshots), besides the artefacts."""
TOKEN_KEY = "koordbus.token"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=NO_CHROMIUM)
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if NO_CHROMIUM in str(r.longrepr)]
    if not skipped:
        return
    terminalreporter.write_sep("!", f"browser (dashboard) tests SKIPPED: {len(skipped)}", red=True, bold=True)
    terminalreporter.write_line(NO_CHROMIUM, red=True, bold=True)


@dataclass
class Koordbus:
    """A running `koordbus up`: its URL and admin token."""

    base: str
    token: str
    process: subprocess.Popen[str]
    log: Path
    started: float = 0.0
    """When the process was started (time.monotonic)."""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")


@pytest.fixture(scope="module")
def koordbus_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Koordbus]:
    """`koordbus up --simulate-nodes 50` (no local agent: the page's node count is then exact), ready once every
    simulated node has a NodeMetric and its capacity in the dashboard's overview and is past its backfill (not
    stale)."""
    yield from run_up(tmp_path_factory, nodes=SIMULATED_NODES)


def run_up(tmp_path_factory: pytest.TempPathFactory, *, nodes: int) -> Iterator[Koordbus]:
    """`koordbus up --simulate-nodes <nodes>` until the generator is closed, yielded once every node is ready."""
    data = tmp_path_factory.mktemp("up")
    port = free_port()
    log = data / "koordbus-up.log"
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data / "data"), "--port", str(port),
        "--simulate-nodes", str(nodes), "--no-agent", "--extender-port", "0",
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
    up = Koordbus(base=f"http://127.0.0.1:{port}", token="", process=process, log=log, started=started)
    try:
        deadline = time.monotonic() + 120
        ready = 0
        while time.monotonic() < deadline and ready < nodes:
            assert process.poll() is None, f"koordbus up exited early:\n{log.read_text()[-3000:]}"
            try:
                up.token = up.token or (data / "data" / "api-token").read_text().strip()
                rows = up.call("GET", "/api/v1/overview/nodes")["items"]
                ready = sum(1 for row in rows if row["cpuUsed"] is not None and row["cpuCores"] and not row["stale"])
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        assert ready == nodes, f"only {ready} nodes ready:\n{log.read_text()[-3000:]}"
        yield up
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Page:
    """A browser tab with its console errors and uncaught exceptions collected."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if SCREENSHOTS is not None:  # `make screenshots`: the documentation's copy too
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, SCREENSHOTS / path.name)
        return path


def open_tab(browser: Any, *, token: str | None) -> Page:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    if token is not None:  # signed in already, as after the login form
        context.add_init_script(f"sessionStorage.setItem({TOKEN_KEY!r}, {json.dumps(token)})")
    tab = Page(page=context.new_page())
    tab.page.on("pageerror", lambda error: tab.errors.append(f"uncaught: {error}"))
    tab.page.on("console", lambda message: _console_error(tab, message))
    return tab


def _console_error(tab: Page, message: Any) -> None:
    # A 404 is an expected answer the pages handle (no batch/mid decisions, no event stream on this server).
    if message.type == "error" and "404" not in message.text:
        tab.errors.append(f"console: {message.text}")


@pytest.fixture
def tab(browser: Any, koordbus_up: Koordbus) -> Iterator[Page]:
    opened = open_tab(browser, token=koordbus_up.token)
    try:
        yield opened
    finally:
        opened.page.context.close()
