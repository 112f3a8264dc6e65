"""The SFT data path end to end through the real CLI: `longhaul sft collect` against a local OpenAI-compatible
scripted server (teacher + user simulator), `longhaul sft build-dataset`, `longhaul sft inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from longhaul.cli import app
from support.airline_scripts import airline_scripts, flaky_target
from support.openai_stub import StubServer

ROOT = Path(__file__).resolve().parents[3]
TRAIN, TEST = [1, 2, 4], [3, 10]


def _write_spec(tmp_path: Path, url: str) -> Path:
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    s = doc["spec"]
    s["stages"] = ["sft", "grpo", "eval"]
    s["environment"]["split"] = {"preset": "explicit", "train": TRAIN, "test": TEST}
    s["environment"]["max_turns"] = 8
    s["environment"]["max_response_tokens"] = 100_000
    s["environment"]["max_prompt_tokens"] = 100_000
    s["user_simulator"].update({"placement": "external", "url": url, "model": {"name": "user"}})
    s["sft"] = {
        "teacher": {
            "model": {"name": "flaky"},
            "url": url,
            "samples_per_task": 4,
            "temperatures": [0.0, 0.5, 0.8, 1.0],
            "max_tokens": 256,
        },
        "max_length": 20000,
        "min_label_tokens": 5,
    }
    path = tmp_path / "sft-spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_collect_build_inspect(tmp_path, tokenizer):
    runner = CliRunner()
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    with StubServer(airline_scripts("airline-flaky")) as srv:
        spec = _write_spec(tmp_path, srv.base_url)
        res = runner.invoke(
            app, ["sft", "collect", "--spec", str(spec), "--run-dir", str(tmp_path / "run"), "--concurrency", "4"]
        )
        assert res.exit_code == 0, res.output
        requests = list(srv.requests)
    traj = tmp_path / "run" / "sft" / "trajectories.jsonl"
    records = [json.loads(line) for line in traj.read_text().splitlines()]
    # Only graded successes are kept: the flaky teacher succeeds on task_id % 5 of its 4 attempts.
    by_task = {t: sum(1 for r in records if r["task_id"] == str(t)) for t in TRAIN}
    assert by_task == {t: flaky_target(str(t)) for t in TRAIN}
    # Test tasks are never run, let alone kept.
    assert not {r["task_id"] for r in records} & {str(t) for t in TEST}
    opened = {json.loads(json.dumps(b["messages"]))[1]["content"] for b in requests if b["model"] == "flaky"}
    assert all("[task:3 " not in m and "[task:10 " not in m for m in opened)
    coverage = json.loads((traj.parent / "coverage.json").read_text())
    assert coverage["covered_seen"] == ["1", "2", "4"] and coverage["attempts"] == 12
    rec = records[0]
    assert rec["reward"] == 1.0 and len(rec["tools"]) == 14
    assert rec["messages"][0]["role"] == "system" and "<policy>" in rec["messages"][0]["content"]
    assert rec["provenance"]["teacher"]["model"] == "flaky" and rec["provenance"]["simulator"]["model"] == "user"
    assert {r["temperature"] for r in records} <= {0.0, 0.5, 0.8, 1.0} and all("seed" in r for r in records)

    dataset = tmp_path / "run" / "sft" / "dataset.parquet"
    res = runner.invoke(
        app,
        ["sft", "build-dataset", str(traj), "--spec", str(spec), "--tokenizer", str(tok_dir), "--out", str(dataset)],
    )
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout.strip().splitlines()[-1])
    assert stats["kept"] == len(records) and stats["dropped"] == {}

    res = runner.invoke(app, ["sft", "inspect", str(dataset), "--plain", "--max-chars", "0"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "samples" in out and str(len(records)) in out
    assert "⟦<tool_call>" in out and "</tool_call><|im_end|>\n⟧" in out
    # The tool results and user turns are shown but not inside a trained span.
    trained = "".join(part.split("⟧")[0] for part in out.split("⟦")[1:])
    assert "<tool_response>" in out and "<tool_response>" not in trained
    assert "<policy>" in out and "<policy>" not in trained


def test_build_dataset_refuses_test_tasks(tmp_path, tokenizer, conversation, airline_tools):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    spec = _write_spec(tmp_path, "http://127.0.0.1:9/v1")
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"task_id": "3", "attempt": 0, "messages": conversation, "tools": airline_tools}) + "\n")
    res = CliRunner().invoke(
        app,
        [
            "sft",
            "build-dataset",
            str(traj),
            "--spec",
            str(spec),
            "--tokenizer",
            str(tok_dir),
            "--out",
            str(tmp_path / "d.parquet"),
        ],
    )
    assert res.exit_code == 1 and "test task" in res.output
    assert not (tmp_path / "d.parquet").exists()
