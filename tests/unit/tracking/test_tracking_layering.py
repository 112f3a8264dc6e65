"""The light tracking modules (URI rules, watchdog, table, metric keys) must not pull in MLflow."""

from __future__ import annotations

import subprocess
import sys


def test_light_modules_do_not_import_mlflow():
    code = (
        "import sys, longhaul.tracking, longhaul.tracking.config, longhaul.tracking.watchdog, "
        "longhaul.tracking.ablation, longhaul.tracking.evalmetrics, longhaul.tracking.provenance, "
        "longhaul.tracking.selection; "
        "print(sorted(m for m in sys.modules if m == 'mlflow' or m.startswith('mlflow.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
