"""`longhaul explain` through the real CLI on trajectory records written by the episode runner's dataclasses."""

from __future__ import annotations

import json

import pytest
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
        Turn(
            0,
            "Let me pull up your profile so I can find the booking.",
            [
                ToolCall(
                    "get_user_details",
                    {"user_id": "mia_li_3668"},
                    '{"user_id": "mia_li_3668"}',
                    "c0",
                    result='{"reservations": ["ABC123"]}',
                )
            ],
            completion_tokens=20,
        ),
        Turn(
            1,
            "ok",
            [
                ToolCall(
                    "cancel_reservation",
                    {"reservation_id": "ABC123" if success else "unknown"},
                    '{"reservation_id": "ABC123"}',
                    "c1",
                    result="{}",
                )
            ],
            completion_tokens=12,
        ),
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
    assert sum(t["process_share"] for t in bad["turns"]) == pytest.approx(bad["process"])
    for name in ("grpo", "turn_discount", "lata", "lata_turn_discount"):
        assert all(x["first"] > 0 for x in good["advantages"][name])
        assert all(x["first"] < 0 for x in bad["advantages"][name])
    # credit: turn — per-turn baseline over the group's turn k and the turn's advantage a_i + d_{i,k}
    assert good["credit"]["trajectory_reward"] == pytest.approx(1.0) and bad["credit"][
        "trajectory_reward"
    ] == pytest.approx(0.0)
    assert good["credit"]["trajectory_advantage"] > 0 > bad["credit"]["trajectory_advantage"]
    for k, (tg, tb) in enumerate(zip(good["turns"], bad["turns"], strict=True)):
        cg, cb = tg["credit"], tb["credit"]
        assert cg["share"] == pytest.approx(0.3 * tg["process_share"], abs=1e-6)
        assert cg["baseline"] == cb["baseline"] == pytest.approx((cg["share"] + cb["share"]) / 2, abs=1e-6)
        assert cg["siblings"] == 2
        assert cg["advantage"] == pytest.approx(
            good["credit"]["trajectory_advantage"] + cg["share"] - cg["baseline"], abs=1e-6
        )
        assert good["advantages"]["grpo"][k]["first"] == pytest.approx(cg["advantage"], abs=1e-5)


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


def trace(traj, uid, step):
    """A rollout trace line as `longhaul.agentloop.traces` writes it."""
    return (
        json.dumps(
            {
                "step": step,
                "validate": False,
                "uid": uid,
                "index": 0,
                "session": "s",
                "seed": 0,
                "reward": {},
                "trajectory": None if traj is None else traj.to_dict(),
            }
        )
        + "\n"
    )


def test_explain_directory_of_jsonl_and_turn_credit_table(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    roll = tmp_path / "run" / "rollouts"
    for d in ("step_2", "step_10", "step_10/failures"):
        (roll / d).mkdir(parents=True)
    (roll / "step_2" / "7.jsonl").write_text(trace(trajectory(True, 0), "u1", 2) + trace(trajectory(False, 1), "u1", 2))
    (roll / "step_10" / "7.jsonl").write_text(
        trace(trajectory(False, 2), "u2", 10) + trace(trajectory(True, 3), "u2", 10)
    )
    (roll / "step_10" / "failures" / "7.jsonl").write_text(trace(None, "u3", 10))
    (roll / "notes.txt").write_text("not a trace")
    res = CliRunner().invoke(app, ["explain", str(roll), "--spec", str(spec), "--json"])
    assert res.exit_code == 0, res.output
    assert "skipped 1 trace record" in res.stderr
    rep = json.loads(res.stdout)
    assert rep["group_size"] == 4 and rep["num_groups"] == 2
    trs = rep["trajectories"]
    assert [t["trial"] for t in trs] == [0, 1, 2, 3]  # step_2 before step_10
    assert [t["group"] for t in trs] == ["uid:u1", "uid:u1", "uid:u2", "uid:u2"]
    # Each uid is its own GRPO group: the same pair in either order gets the same advantages.
    assert trs[0]["credit"] == trs[3]["credit"] and trs[1]["credit"] == trs[2]["credit"]
    res = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["explain", str(roll), "--spec", str(spec)])
    assert res.exit_code == 0, res.output
    assert "baseline (n)" in res.output and "A turn" in res.output and "w·share" in res.output
    assert "4 trajectories in 2 groups" in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["explain", str(empty)])
    assert res.exit_code == 2 and "no *.jsonl files" in res.output


def test_explain_refuses_oversized_files(tmp_path, monkeypatch):
    """explain reads through the shared bounded reader (`longhaul.bounded.TRAJECTORIES`)."""
    import dataclasses

    from longhaul import bounded

    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps(trajectory(True, 0).to_dict()) + "\n")
    monkeypatch.setattr(bounded, "TRAJECTORIES", dataclasses.replace(bounded.TRAJECTORIES, max_bytes=100))
    res = CliRunner().invoke(app, ["explain", str(tmp_path)])
    assert res.exit_code == 2 and "big.jsonl:1" in res.output and "larger than" in res.output
