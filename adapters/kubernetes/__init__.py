"""Kubernetes + Kueue backend (registered as "kubernetes").

Construct with plain settings, e.g.::

    from adapters.kubernetes import KubernetesBackend, KubernetesSettings
    backend = KubernetesBackend(KubernetesSettings(kubeconfig="/path/kubeconfig"))
    backend = KubernetesBackend(KubernetesSettings.from_env(env_file=".stack/kube/env"))
"""

from .backend import KubernetesBackend
from .settings import KubernetesSettings

__all__ = ["KubernetesBackend", "KubernetesSettings"]
