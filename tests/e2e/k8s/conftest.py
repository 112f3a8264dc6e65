"""Fixtures of the Kubernetes end-to-end tests (defined in k8s_harness.py, which the tests also import)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from k8s_harness import cluster, namespace, operator  # noqa: E402, F401  (pytest fixtures)
