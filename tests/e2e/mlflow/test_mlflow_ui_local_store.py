"""The `mlflow ui` hint a local run prints, run as printed from an unrelated directory, serves the run's artefacts
from its run directory, and its page opens on the runs table with MLflow's model-training navigation."""

from __future__ import annotations

import html
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from longhaul.spec import load_spec, resolved_yaml, run_name
from longhaul.tracking.config import UI_DEFAULT_URL, build_ui_hint, local_store_uri
from longhaul.tracking.runs import log_metrics, start_or_resume_run
from longhaul.tracking.traces import TraceLogger, build_episode_trace, prm_rule_hits
from support.chromium import run_chromium
from support.episodes import gold_episode
from support.mlflow_server import MlflowServer, free_loopback_port, stop_mlflow_server
from support.tracking_runs import REPO

pytestmark = [pytest.mark.mlflow, pytest.mark.browser]

#: Entries of MLflow 3.17's GenAI navigation, absent from its model-training one.
GENAI_NAV = ("Training runs", "Judges", "Prompts & versions")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_printed_ui_command_works_from_any_directory_and_opens_on_the_runs(tmp_path):
    exp = load_spec(REPO / "specs" / "smoke.yaml")
    run_dir = tmp_path / "runs" / run_name(exp)
    uri = local_store_uri(run_dir)  # what the launcher resolves for the local backend
    tracked = start_or_resume_run(exp, uri, run_dir, "local", environ={})
    log_metrics(uri, tracked.run_id, {"eval/pass_hat_k/1": 0.5}, 1)
    # One evaluated episode as the eval stage logs it: a trace with its turns, tool calls and grade.
    traj = gold_episode(0, bad_call=True)
    hits, process = prm_rule_hits(traj)
    logger = TraceLogger(uri, tracked.experiment_id, tracked.run_id)
    logger.submit(build_episode_trace(traj, run_name=run_name(exp), step=1, run_id=tracked.run_id, rule_hits=hits,
                                      process=process))
    assert logger.close(60).logged == 1
    import mlflow

    (trace,) = mlflow.search_traces(locations=[tracked.experiment_id], run_id=tracked.run_id, return_type="list")

    command, page = build_ui_hint(uri, tracked.experiment_id).split("   then open ")
    argv = shlex.split(command)
    assert argv[:2] == ["mlflow", "ui"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(DO_NOT_TRACK="1", MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log_path = tmp_path / "ui.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", *argv, "--port", str(port)], cwd=elsewhere, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ui = MlflowServer(f"http://127.0.0.1:{port}", port, tmp_path, proc, log_path)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if _get(f"{ui.uri}/health").strip() == "OK":
                    break
            except (urllib.error.URLError, OSError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, ui.log_tail()
            time.sleep(0.5)
        # The artefacts are found although the UI runs elsewhere: they sit beside the store, by absolute path.
        query = urllib.parse.urlencode({"path": "spec/experiment.yaml", "run_uuid": tracked.run_id})
        assert _get(f"{ui.uri}/get-artifact?{query}") == resolved_yaml(exp)

        dom = run_chromium(["--dump-dom", page.replace(UI_DEFAULT_URL, ui.uri)], tmp_path / "profile")
        assert dom.returncode == 0, dom.stderr[-2000:]
        text = html.unescape(dom.stdout)
        assert run_name(exp) in text, text[-2000:]  # the runs table
        assert "Model registry" in text and not any(f">{item}<" in text for item in GENAI_NAV)

        # The trace viewer shows the episode: its spans (turns, tool calls, the user's reply) and its grade.
        trace_page = f"{ui.uri}/#/experiments/{tracked.experiment_id}/traces?selectedEvaluationId={trace.info.trace_id}"
        dom = run_chromium(["--dump-dom", trace_page], tmp_path / "profile-trace")
        text = html.unescape(dom.stdout)
        for shown in ("task 5 · trial 0", "assistant turn 0", "get_user_details", "user simulator", "first_user_message",
                      "user_stop", "process_score", "longhaul.outcome"):
            assert shown in text, (shown, text[-2000:])
        shot = Path(os.environ.get("LONGHAUL_BROWSER_SHOTS", tmp_path)) / "mlflow-trace.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        cap = run_chromium(["--window-size=1600,1200", f"--screenshot={shot}", trace_page], tmp_path / "profile-shot")
        assert cap.returncode == 0 and shot.stat().st_size > 20_000, cap.stderr[-2000:]
    finally:
        stop_mlflow_server(ui)
