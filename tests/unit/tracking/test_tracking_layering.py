"""The light tracking modules (URI rules, what the adapter asks before it writes) and the pure analysis they call
(watchdog, table, statistics, metric keys, selection) must not pull in MLflow."""

from __future__ import annotations

import subprocess
import sys


def test_light_modules_do_not_import_mlflow():
    code = (
        "import sys, longhaul.tracking, longhaul.tracking.config, longhaul.tracking.provenance, "
        "longhaul.tracking.relayed, longhaul.analysis.watchdog, longhaul.analysis.ablation, "
        "longhaul.analysis.evalmetrics, longhaul.analysis.selection, longhaul.analysis.report; "
        "print(sorted(m for m in sys.modules if m == 'mlflow' or m.startswith('mlflow.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
