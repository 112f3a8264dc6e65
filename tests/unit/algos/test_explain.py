"""`longhaul explain` through the real CLI on trajectory records written by the episode runner's dataclasses."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from longhaul.cli import app
from longhaul.envs.trajectory import Grade, ToolCall, Trajectory, Turn

SPEC = """
apiVersion: longhaul.dev/v1alpha1
kind: Experiment
metadata: {name: explain-test}
spec:
  reward: {process: prm_lite, weight: 0.3, credit: turn}
  algorithm: {advantage: lata_turn_discount, alpha: 1.05, discount_unit: turn}
"""


def trajectory(success: bool, trial: int) -> Trajectory:
    turns = [
        Turn(0, "Let me pull up your profile so I can find the booking.", [
            ToolCall("get_user_details", {"user_id": "mia_li_3668"}, '{"user_id": "mia_li_3668"}', "c0",
                     result='{"reservations": ["ABC123"]}')], completion_tokens=20),
        Turn(1, "ok", [ToolCall("cancel_reservation", {"reservation_id": "ABC123" if success else "unknown"},
                                '{"reservation_id": "ABC123"}', "c1", result="{}")], completion_tokens=12),
        Turn(2, "Your reservation is cancelled.", [], to_user=True, completion_tokens=8),
    ]
    return Trajectory("5", trial, 0, [], turns, "user_stop", Grade(success, float(success), success, True), 2, 0)


def test_explain_json_group(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    a, b = tmp_path / "a.json", tmp_path / "b.jsonl"
    a.write_text(json.dumps(trajectory(True, 0).to_dict()))
    b.write_text(json.dumps({"trajectory": trajectory(False, 1).to_dict()}) + "\n")
    res = CliRunner().invoke(app, ["explain", str(a), str(b), "--spec", str(spec), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["estimator"] == "longhaul_lata_turn_discount" and rep["group_size"] == 2
    good, bad = rep["trajectories"]
    rules_bad = {h["rule"] for t in bad["turns"] for s in t["steps"] for h in s["hits"]}
    assert {"placeholder", "cheap_reasoning", "first_read"} <= rules_bad
    assert "data_chain" in {h["rule"] for t in good["turns"] for s in t["steps"] for h in s["hits"]}
    assert good["reward"] == good["outcome"] + 0.3 * good["process"]
    assert sum(t["process_share"] for t in bad["turns"]) == __import__("pytest").approx(bad["process"])
    for name in ("grpo", "turn_discount", "lata", "lata_turn_discount"):
        assert all(x["first"] > 0 for x in good["advantages"][name])
        assert all(x["first"] < 0 for x in bad["advantages"][name])


def test_explain_table_and_errors(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(trajectory(True, 0).to_dict()))
    res = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["explain", str(a)])
    assert res.exit_code == 0, res.output
    assert "first_read" in res.output and "estimator grpo" in res.output and "[process not in reward]" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    res = CliRunner().invoke(app, ["explain", str(bad)])
    assert res.exit_code == 2 and "not a trajectory record" in res.output
