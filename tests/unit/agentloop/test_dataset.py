"""veRL stage inputs: parquet rows carry the task ids the agent loop needs; files land where the overrides point."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import yaml

from longhaul.agentloop.dataset import build_verl_rows, write_verl_inputs
from longhaul.agentloop.loop import task_id_from_row
from longhaul.layout import Paths
from longhaul.render.verl import AGENT_LOOP_NAME, render_verl_overrides
from longhaul.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]


def test_rows_follow_the_split() -> None:
    exp = load_spec(ROOT / "specs" / "prm_lite_lata.yaml")
    rows = build_verl_rows(exp)
    train_ids = [task_id_from_row(r) for r in rows["train"]]
    assert len(train_ids) == 40 and "3" not in train_ids and "0" in train_ids
    assert len(rows["val"]) == 50
    test_rows = [r for r in rows["val"] if r["extra_info"]["split"] == "test"]
    assert sorted(int(task_id_from_row(r)) for r in test_rows) == [3, 10, 16, 20, 23, 26, 30, 36, 43, 46]
    assert all(r["agent_name"] == AGENT_LOOP_NAME for r in rows["train"])
    # veRL does not tell the agent loop that a rollout is a validation one; the row does
    assert {r["extra_info"]["validate"] for r in rows["train"]} == {False}
    assert {r["extra_info"]["validate"] for r in rows["val"]} == {True}


def test_written_files_are_the_ones_the_overrides_reference(tmp_path: Path) -> None:
    exp = load_spec(ROOT / "specs" / "prm_lite_lata.yaml")
    paths = Paths.under(str(tmp_path / "run"))
    written = {str(p) for p in write_verl_inputs(exp, paths)}
    referenced = {
        o.split("=", 1)[1].strip("'")
        for o in render_verl_overrides(exp, paths)
        if o.split("=", 1)[0]
        in (
            "data.train_files",
            "data.val_files",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path",
            "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        )
    }
    assert referenced == written
    table = pq.read_table(paths.data_dir + "/train.parquet").to_pylist()
    assert [task_id_from_row(r) for r in table] == [task_id_from_row(r) for r in build_verl_rows(exp)["train"]]
    loops = yaml.safe_load(Path(paths.config_dir, "agent_loops.yaml").read_text())
    assert any(entry["name"] == AGENT_LOOP_NAME for entry in loops)
    tools = yaml.safe_load(Path(paths.config_dir, "tools.yaml").read_text())
    assert len(tools["tools"]) == 14
