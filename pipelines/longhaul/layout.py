"""Run layout: every file of a run directory, and where run directories go (pure: names and strings, no I/O).

One run writes everything into one directory, on every backend; the renderers, the launcher, the stages and the
submit adapters all take their paths from here:

    <run_dir>/experiment.yaml              the resolved spec (`constants.SPEC_FILENAME`)
              submit.json                  the submit record: backend, job id (`RECORD_FILE`)
              checkpoints/                 veRL's checkpoint tree; its tracker file is `TRACKER_FILE`
              merged/global_step_<N>/      a checkpoint merged into a servable model (evaluation)
              data/  config/  eval/  logs/  rollouts/
              sft/                         the SFT stage (`SFTPaths`); its exported model is the GRPO start
              .longhaul/stages/<stage>.done   stages the launcher finished (skipped on a restart)
              .longhaul/plan.json, launcher.lock, exit.json

A run directory is `<root>/<run name>` (`default_run_dir`): the root comes from the spec's backend section and
the name from the spec, so this module sits just above the spec; it imports nothing of longhaul but the spec and
the constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from longhaul import constants as C
from longhaul.spec.models import LocalSpec
from longhaul.spec.naming import run_name

if TYPE_CHECKING:
    from longhaul.spec.models import Experiment

#: The spec's default `output_dir` (local and Slurm), and where `longhaul submit --backend kubernetes` records
#: its runs: the directory `longhaul status NAME` looks in. Read from the spec model (one default, one place).
DEFAULT_RUNS_DIR: str = LocalSpec.model_fields["output_dir"].default
#: Written by the submit step into the run directory; `longhaul status/logs` find the backend in it.
RECORD_FILE = "submit.json"
#: The launcher's own state, hidden in the run directory.
STATE_DIR = ".longhaul"
#: `<stage>.done` markers of the stages the launcher finished (a requeued job skips them).
STAGES_DIR = f"{STATE_DIR}/stages"
DONE_SUFFIX = ".done"
#: The launch plan as the launcher executed it, its lock (one launcher per run) and the local backend's exit record.
PLAN_FILE = f"{STATE_DIR}/plan.json"
LAUNCHER_LOCK_FILE = f"{STATE_DIR}/launcher.lock"
EXIT_RECORD_FILE = f"{STATE_DIR}/exit.json"
#: Sub-directories of the run directory.
CHECKPOINTS_SUBDIR = "checkpoints"
DATA_SUBDIR = "data"
CONFIG_SUBDIR = "config"
EVAL_SUBDIR = "eval"
LOGS_SUBDIR = "logs"
ROLLOUTS_SUBDIR = "rollouts"
SFT_SUBDIR = "sft"
#: Merged (servable) models of checkpoints: `<run_dir>/merged/global_step_<N>/` (`longhaul.checkpoints`).
MERGED_SUBDIR = "merged"
#: One evaluated checkpoint's files in `<eval_dir>/step_<N>/` (`Paths.eval_step_dir`): its trial records and summary.
EVAL_RESULTS_FILE = "results.jsonl"
EVAL_SUMMARY_FILE = "summary.json"
#: The local backend's launcher output (every attempt appended).
LAUNCHER_LOG = f"{LOGS_SUBDIR}/launcher.log"
#: veRL's tracker file in the checkpoint directory, naming the newest saved step
#: (`verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename`; `longhaul.checkpoints` reads it).
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: What the rendered veRL overrides point at, under the config directory (written by the launcher).
AGENT_LOOP_FILE = "agent_loops.yaml"
TOOL_CONFIG_FILE = "tools.yaml"
#: The SFT stage's exported Hugging Face model, relative to the run directory: the GRPO stage's initial policy.
SFT_MODEL_SUBDIR = f"{SFT_SUBDIR}/model"


def _clean(run_dir: str) -> str:
    return run_dir.rstrip("/") or "/"


@dataclass(frozen=True)
class Paths:
    """Where a run keeps its files (all under the run directory). The fields are the launch plan's `paths`."""

    run_dir: str
    spec_file: str
    checkpoint_dir: str
    data_dir: str
    config_dir: str
    eval_dir: str
    logs_dir: str
    rollouts_dir: str

    @classmethod
    def under(cls, run_dir: str) -> Paths:
        """The layout of the run directory `run_dir`."""
        run_dir = _clean(run_dir)
        return cls(
            run_dir=run_dir,
            spec_file=f"{run_dir}/{C.SPEC_FILENAME}",
            checkpoint_dir=f"{run_dir}/{CHECKPOINTS_SUBDIR}",
            data_dir=f"{run_dir}/{DATA_SUBDIR}",
            config_dir=f"{run_dir}/{CONFIG_SUBDIR}",
            eval_dir=f"{run_dir}/{EVAL_SUBDIR}",
            logs_dir=f"{run_dir}/{LOGS_SUBDIR}",
            rollouts_dir=f"{run_dir}/{ROLLOUTS_SUBDIR}",
        )

    # Derived paths are properties, not fields: the fields are what the launch plan (and its golden files) shows.
    def data_file(self, split: str) -> str:
        """The veRL dataset of `split` (`train`, `val`): one row per task, written by the launcher."""
        return f"{self.data_dir}/{split}.parquet"

    def eval_step_dir(self, step: int) -> str:
        """The evaluation of checkpoint `step` (0 = the initial policy): `EVAL_RESULTS_FILE`, `EVAL_SUMMARY_FILE`."""
        return f"{self.eval_dir}/step_{step}"

    @property
    def agent_loop_file(self) -> str:
        return f"{self.config_dir}/{AGENT_LOOP_FILE}"

    @property
    def tool_config_file(self) -> str:
        return f"{self.config_dir}/{TOOL_CONFIG_FILE}"

    @property
    def tracker_file(self) -> str:
        return f"{self.checkpoint_dir}/{TRACKER_FILE}"

    @property
    def sft(self) -> SFTPaths:
        return SFTPaths.under(self)


@dataclass(frozen=True)
class SFTPaths:
    """Files of the SFT stage, all under `<run_dir>/sft`."""

    run_dir: str
    spec_file: str
    sft_dir: str
    trajectories: str
    dataset: str
    checkpoints: str
    model: str

    @classmethod
    def under(cls, paths: Paths) -> SFTPaths:
        """From the run's `Paths` (its spec file may be one given on the command line)."""
        run_dir = _clean(paths.run_dir)
        sft = f"{run_dir}/{SFT_SUBDIR}"
        return cls(
            run_dir=run_dir,
            spec_file=paths.spec_file,
            sft_dir=sft,
            trajectories=f"{sft}/trajectories.jsonl",
            dataset=f"{sft}/dataset.parquet",
            checkpoints=f"{sft}/checkpoints",
            model=f"{run_dir}/{SFT_MODEL_SUBDIR}",
        )


def run_dir_under(root: str, name: str) -> str:
    """`<root>/<name>`: trailing and doubled slashes of `root` dropped (a root of `/` gives `/<name>`)."""
    return f"{_clean(root)}/{name}".replace("//", "/")


def runs_root(exp: Experiment, backend: str) -> str:
    """Where the run directories of `exp` go on `backend`: in the pod, the checkpoint volume when one is set, else
    /runs (kubernetes); else the backend's `output_dir` (relative paths resolve against the submit directory)."""
    backends = exp.spec.backends
    if backend == "kubernetes":
        vol = backends.kubernetes.checkpoint_volume
        return vol.mount_path if vol else C.CONTAINER_RUN_ROOT
    if backend == "slurm":
        return backends.slurm.output_dir
    return backends.local.output_dir


def default_run_dir(exp: Experiment, backend: str) -> str:
    """The run directory of `exp` on `backend`: `<runs_root>/<run name>`."""
    return run_dir_under(runs_root(exp, backend), run_name(exp))
