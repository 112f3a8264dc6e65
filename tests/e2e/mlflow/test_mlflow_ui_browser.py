"""The MLflow UI's compare-runs page, rendered by headless Debian Chromium, shows our two runs and a metric."""

from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from pathlib import Path

import pytest

from longhaul.spec import run_name
from support.chromium import run_chromium as _run_chromium
from support.tracking_runs import PopulatedRun

pytestmark = [pytest.mark.mlflow, pytest.mark.browser]


def _compare_url(base: str, runs: list[PopulatedRun]) -> str:
    ids = json.dumps([r.tracked.run_id for r in runs])
    exps = json.dumps(sorted({r.tracked.experiment_id for r in runs}))
    return f"{base}/#/compare-runs?runs={urllib.parse.quote(ids)}&experiments={urllib.parse.quote(exps)}"


def test_compare_runs_page_shows_both_runs_and_a_metric(ablation_runs, mlflow_server, tmp_path):
    runs = [r for r in ablation_runs if r.spec_file in ("lata.yaml", "prm_lite_lata.yaml")]
    url = _compare_url(mlflow_server.uri, runs)
    dom = _run_chromium(["--dump-dom", url], tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = html.unescape(dom.stdout)
    assert "Comparing 2 Runs" in text, text[-2000:]
    for r in runs:
        assert run_name(r.exp) in text
        assert r.tracked.run_id in text
    # The metrics table: one "Plot chart" link per metric key, named by the key.
    shown = set(re.findall(r'title="Plot chart"[^>]*>([^<]+)<', text))
    logged = set().union(*(r.training for r in runs)) | {"eval/pass_hat_k/1", "eval/ci/pass_hat_k/1/hi"}
    logged = {k.replace("@", "_at_") for k in logged}
    assert shown, "no metric rows rendered"
    assert shown & logged, f"metrics shown {sorted(shown)[:10]} are none of the logged ones"
    # The parallel-coordinates chart plots a logged metric on one of its axes.
    axes = set(re.findall(r'class="axis-title"[^>]*data-unformatted="([^"]+)"', text))
    assert axes & logged, f"chart axes {sorted(axes)} show none of the logged metrics"
    shot = Path(os.environ.get("LONGHAUL_BROWSER_SHOTS", tmp_path)) / "mlflow-compare-runs.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    cap = _run_chromium(["--window-size=1600,1400", f"--screenshot={shot}", url], tmp_path / "profile2")
    assert cap.returncode == 0 and shot.stat().st_size > 20_000, cap.stderr[-2000:]
