"""Bearer tokens Kubernetes vouches for: the API asks a TokenReview (through the fake API server and
kubernetes-asyncio) about tokens not in its token file, maps the user or its groups to a role, and remembers the
answer for a minute."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from sqlalchemy.ext.asyncio import AsyncEngine

from services.common import auth
from services.k8s.token_review import KubeTokenReviewer
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_api_auth import READ, client_for, make_app
from tests.support import api_auth


def test_role_mappings() -> None:
    mapping = auth.parse_role_mapping("group:koordbus-viewers=viewer, user:alice=admin,group:quota-team=quota-admin")
    assert auth.role_for("bob", ["koordbus-viewers", "quota-team"], mapping) == auth.QUOTA_ADMIN  # the highest
    assert auth.role_for("alice", [], mapping) == auth.ADMIN
    assert auth.role_for("eve", ["system:authenticated"], mapping) is None
    for bad in ("alice=admin", "user:alice=root", "group:x"):
        with pytest.raises(ValueError, match="role mapping entry"):
            auth.parse_role_mapping(bad)


async def test_tokens_kubernetes_vouches_for_get_their_mapped_role(
    migrated_engine: AsyncEngine, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    kube_api.tokens = {
        "sa-viewer": ("system:serviceaccount:ops:dashboard", ["system:serviceaccounts", "koordbus-viewers"]),
        "sa-nobody": ("system:serviceaccount:ops:other", ["system:serviceaccounts"]),
    }
    app: Any = make_app(migrated_engine, api_auth.token_store())
    mapping = auth.parse_role_mapping("group:koordbus-viewers=viewer")
    app.state.context = app.state.context.__class__(
        **{
            **app.state.context.__dict__,
            "reviewed_tokens": auth.ReviewedTokens(KubeTokenReviewer(kube_client), mapping),
        }
    )
    async with client_for(app) as client:
        for _ in range(3):
            ok = await client.get(READ, headers={"Authorization": "Bearer sa-viewer"})
            assert ok.status_code == 200, ok.text
        refused = await client.post("/test/quota", headers={"Authorization": "Bearer sa-viewer"})
        assert refused.status_code == 403 and "system:serviceaccount:ops:dashboard has role viewer" in refused.text
        unmapped = await client.get(READ, headers={"Authorization": "Bearer sa-nobody"})
        assert unmapped.status_code == 401
        stranger = await client.get(READ, headers={"Authorization": "Bearer who-knows"})
        assert stranger.status_code == 401
        static = await client.get(READ, headers=api_auth.headers(auth.VIEWER))  # the token file still works
        assert static.status_code == 200
    reviews = [r for r in kube_api.requests if r.path.endswith("/tokenreviews")]
    assert len(reviews) == 3  # sa-viewer once (then remembered), sa-nobody, who-knows; the file token never
