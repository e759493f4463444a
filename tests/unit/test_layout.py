"""Every service has the same shape (issue #21): the same file for the same role, so a reader finds a service's
decisions, folds, shell, settings, projections, routes and wiring where they find every other service's.

Roles: `core.py` (pure decisions), `model.py` / `state.py` (pure folds), `service.py` (the I/O shell), `settings.py`
(its documented settings), `store.py` (its projections, their alembic revisions in `migrations/`), `routes.py` (its
REST routes), `component.py` (what the composition root builds: routers, what they read, readiness, metrics). A
service has the ones it needs; what it has is named so. The pure roles are held pure by pyproject.toml's
import-linter contract (by file name), and services.api imports no service (another contract).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from services.common import db

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(
    p for p in (ROOT / "services").iterdir() if (p / "__init__.py").exists() and p.name not in ("api", "common")
)
EXTENDER_APP = ROOT / "services" / "loadaware" / "http.py"
"""The load-aware extender's own HTTP app (kube-scheduler's verbs on the extender's port), not API routes."""


def classes(path: Path) -> list[str]:
    return [node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)]


def makes_router(path: Path) -> bool:
    return "APIRouter(" in path.read_text()


@pytest.mark.parametrize("service", SERVICES, ids=lambda p: p.name)
def test_routes_live_in_routes_py_and_come_with_a_component(service: Path) -> None:
    with_routers = sorted(p.name for p in service.glob("*.py") if makes_router(p) and p != EXTENDER_APP)
    assert with_routers in ([], ["routes.py"]), f"{service.name}: REST routes belong in routes.py, found {with_routers}"
    if with_routers:
        assert (service / "component.py").exists(), f"{service.name}: routes.py without a component.py to mount it"


@pytest.mark.parametrize("service", SERVICES, ids=lambda p: p.name)
def test_settings_classes_live_in_settings_py(service: Path) -> None:
    misplaced = [
        f"{p.name}: {name}"
        for p in sorted(service.glob("*.py"))
        if p.name != "settings.py"
        for name in classes(p)
        if name.endswith("Settings")
    ]
    assert not misplaced, f"{service.name}: settings classes outside settings.py: {misplaced}"


@pytest.mark.parametrize("service", SERVICES, ids=lambda p: p.name)
def test_a_service_with_a_shell_has_its_pure_core(service: Path) -> None:
    if (service / "service.py").exists():
        pure = {"core.py", "model.py", "state.py"} & {p.name for p in service.glob("*.py")}
        assert pure, f"{service.name}: service.py without a pure core.py (or model.py/state.py) beside it"


def test_only_the_api_app_and_the_components_mount_routes() -> None:
    api = ROOT / "services" / "api"
    in_api = sorted(p.name for p in api.glob("*.py") if makes_router(p))
    assert in_api == ["dashboard.py", "events.py", "watermarks.py"], "the API's own routes: its views and event stream"


def test_each_stores_revisions_live_with_it_in_one_linear_history() -> None:
    """A store's alembic revisions are in its service's migrations/ directory (the base, with the shared offsets table,
    in migrations/versions), and they make one history: one base, one head, each revision after the one before."""
    script = ScriptDirectory.from_config(db.alembic_config("sqlite:///unused.db"))
    assert len(script.get_bases()) == 1 and len(script.get_heads()) == 1
    revisions = list(script.walk_revisions())
    assert [r.down_revision for r in revisions[:-1]] == [r.revision for r in revisions[1:]]
    for revision in revisions:
        path = Path(revision.path)
        tables = re.findall(r'create_table\(\s*"([a-z_]+)"', path.read_text())
        if path.parent.name == "migrations" and path.parent.parent.parent.name == "services":
            store = (path.parent.parent / "store.py").read_text()
            assert all(f'"{table}"' in store for table in tables), f"{path}: tables of another store: {tables}"
        else:
            assert path.parent == ROOT / "migrations" / "versions" and revision.down_revision is None, path
