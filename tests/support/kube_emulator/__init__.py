"""The Kubernetes test API server (kmock + a compatibility layer).

Start it: `python tests/support/run_kube_emulator.py --port N`.
"""

from .server import ApiError, KubeEmulator, ResourceType

__all__ = ["ApiError", "KubeEmulator", "ResourceType"]
