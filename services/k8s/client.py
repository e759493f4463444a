"""Building the kubernetes-asyncio ApiClient the bridge talks through, from K8sSettings.

A kubeconfig file when one is configured, else the in-cluster service account. When neither is usable,
`KubeConfigError` says why in one sentence, so the composition root can fall back to record-only mode.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config.config_exception import ConfigException

from services.k8s.settings import K8sSettings


class KubeConfigError(Exception):
    """No usable Kubernetes connection settings: neither the kubeconfig nor the in-cluster account works."""


def _kubeconfig_path(kubeconfig: str) -> Path:
    path = Path(kubeconfig).expanduser()
    if not path.is_file():
        raise KubeConfigError(f"kubeconfig {str(path)!r} does not exist or is not a file")
    return path


async def api_configuration(settings: K8sSettings) -> Configuration:
    """The client configuration for the cluster named by `settings` (kubeconfig, else in-cluster)."""
    configuration = Configuration()
    if settings.kubeconfig:
        path = _kubeconfig_path(settings.kubeconfig)
        try:
            await config.load_kube_config(
                config_file=str(path),
                context=settings.kube_context or None,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, ValueError) as err:
            raise KubeConfigError(f"kubeconfig {str(path)!r} is not usable: {err}") from err
        return configuration
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as err:
        raise KubeConfigError(
            f"no kubeconfig configured (KOORDBUS_KUBECONFIG) and not running in a cluster: {err}"
        ) from err
    return configuration


async def api_client(settings: K8sSettings) -> ApiClient:
    """A new ApiClient for the cluster; the caller closes it (`async with` or `await client.close()`)."""
    return ApiClient(await api_configuration(settings))
