"""Fixtures of the image tests (defined in images_harness.py, which the tests also import)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The Kubernetes e2e harness: its test API server (`cluster`) and `namespace` fixtures, for the operator image.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))

from images_harness import base_image, operator_image, podman, specs_dir, trainer  # noqa: E402, F401  (fixtures)
from k8s_harness import cluster, namespace  # noqa: E402, F401  (fixtures)
