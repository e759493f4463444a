"""Who a bearer token belongs to, asked of Kubernetes: a TokenReview (authentication.k8s.io/v1) for the API's
`--token-review` mode (services.common.auth.ReviewedTokens maps the answer to a role) and for the NATS auth callout
(services.natsauth, which reads the node name from the user's extra).

`KubeTokenReviewer.review(token)` → (username, groups) when the cluster authenticates the token, None when it does
not (`review_user`: the whole `status.user`); an API server that cannot answer raises WriteFailedError (the request
then fails rather than letting anyone in). Needs RBAC `create` on `tokenreviews`.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient, AuthenticationV1Api

from services.k8s import sinks


class KubeTokenReviewer:
    def __init__(self, api_client: ApiClient, *, audiences: list[str] | None = None, timeout: float = 10.0) -> None:
        self._api = AuthenticationV1Api(api_client)
        self._audiences = audiences
        self._timeout = timeout

    async def review(self, token: str) -> tuple[str, list[str]] | None:
        user = await self.review_user(token)
        if user is None:
            return None
        return str(user.get("username", "")), [str(g) for g in user.get("groups") or []]

    async def review_user(self, token: str) -> dict[str, Any] | None:
        """The TokenReview's `status.user` (username, uid, groups, extra) when the cluster authenticates the token
        (for the audiences given, if any), else None."""
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status, text = await sinks.raw_request(
            self._api.create_token_review(body, _preload_content=False, _request_timeout=self._timeout)
        )
        answer = sinks.parsed(status, text, "create TokenReview").get("status") or {}
        if not answer.get("authenticated"):
            return None
        user = answer.get("user")
        return dict(user) if isinstance(user, dict) else {}
