"""Inputs of veRL's GRPO stage: the task parquet files and the agent-loop / tool YAML the overrides point at.

veRL reads one dataset row per task; our agent loop builds the real prompt itself (policy text, tool schemas,
the user simulator's first message) through the shared episode runner, so a row only has to carry the task
id. `build_verl_rows` is pure; `write_verl_inputs` writes the files the rendered overrides reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longhaul.agentloop.config import AGENT_LOOP_NAME, render_agent_loop_yaml, render_tool_config_yaml
from longhaul.envs.airline.splits import build_split
from longhaul.files import PLAIN, atomic_output, atomic_write_text
from longhaul.layout import AGENT_LOOP_FILE, TOOL_CONFIG_FILE, Paths
from longhaul.spec.models import Experiment

DATA_SOURCE = "tau2_airline"


def _row(task_id: str, index: int, split: str, labels: list[str], seed: int, validate: bool) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        # veRL's dataset needs a chat prompt; the agent loop replaces it with the runner's own prompt.
        "prompt": [{"role": "user", "content": f"tau2 airline task {task_id}"}],
        "agent_name": AGENT_LOOP_NAME,
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {
            "task_id": task_id,
            "index": index,
            "split": split,
            "subsets": labels,
            "seed": seed,
            # veRL does not tell an agent loop whether it runs a validation rollout; the row does
            # (validation traces and user-simulator seeds differ from training ones).
            "validate": validate,
        },
    }


def build_verl_rows(exp: Experiment) -> dict[str, list[dict[str, Any]]]:
    """Rows of `train.parquet` (training tasks) and `val.parquet` (every task, labelled by subset)."""
    split = build_split(exp.spec.environment.split)
    seed = exp.spec.algorithm.seed
    train = [_row(t, i, "train", split.labels(t), seed, False) for i, t in enumerate(split.train)]
    everything = [*split.train, *split.test]
    val = [
        _row(t, i, "train" if t in split.train else "test", split.labels(t), seed, True)
        for i, t in enumerate(everything)
    ]
    return {"train": train, "val": val}


def write_verl_inputs(exp: Experiment, paths: Paths) -> list[Path]:
    """Write the parquet files and the agent-loop/tool YAML under the run directory; returns what was written."""
    # deferred: pyarrow (~0.2 s)
    import pyarrow as pa
    import pyarrow.parquet as pq

    written: list[Path] = []
    for name, rows in build_verl_rows(exp).items():
        target = Path(paths.data_file(name))
        with atomic_output(target, mode=PLAIN) as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        written.append(target)
    for name, text in (
        (AGENT_LOOP_FILE, render_agent_loop_yaml(exp)),
        (TOOL_CONFIG_FILE, render_tool_config_yaml(exp)),
    ):
        target = atomic_write_text(Path(paths.config_dir) / name, text, mode=PLAIN)
        written.append(target)
    return written
