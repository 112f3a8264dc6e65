"""Run layout: every file of a run directory, and where run directories go (pure: names and strings, no I/O).

One run writes everything into one directory, on every backend; the renderers, the launcher, the stages and the
submit adapters all take their paths from here:

    <run_dir>/experiment.yaml              the resolved spec (`constants.SPEC_FILENAME`)
              submit.json                  the submit record: backend, job id (`RECORD_FILE`)
              checkpoints/                 veRL's checkpoint tree; its tracker file is `TRACKER_FILE`
              merged/global_step_<N>/      a checkpoint merged into a servable model (evaluation)
              data/  config/  eval/  logs/  rollouts/
              sft/                         the SFT stage (`SFTPaths`); its exported model is the GRPO start
              mlflow.db  mlartifacts/      the local backend's MLflow store and its artefacts
              mlflow_run.json  mlflow_run_id   the run's MLflow run (`longhaul.tracking.runs`)
              .longhaul/stages/<stage>.done   stages the launcher finished (skipped on a restart)
              .longhaul/plan.json, launcher.lock, exit.json
              .longhaul/mlflow-relay/      the MLflow relay's buffer store, outbox and state (`RelayPaths`)

A run directory is `<root>/<run name>` (`default_run_dir`): the root comes from the spec's backend section and
the name from the spec, so this module sits just above the spec; it imports nothing of longhaul but the spec and
the constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from longhaul import constants as C

if TYPE_CHECKING:
    from longhaul.spec.models import Experiment

#: The spec's default `output_dir` (local and Slurm), and where `longhaul submit --backend kubernetes` records
#: its runs: the directory `longhaul status NAME` looks in. One default, one place: `longhaul.constants`, which
#: the spec's backend models take theirs from (so the CLI's start-up builds no model to read it).
DEFAULT_RUNS_DIR: str = C.DEFAULT_RUNS_DIR
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
#: A `longhaul eval` output directory holds the same two files as `Paths.eval_step_dir`, and the trajectories.
EVAL_TRAJECTORIES_FILE = "trajectories.jsonl"
#: The rollout traces of training step N: `<rollouts_dir>/step_<N>/<pid>.jsonl`, validation ones under
#: `val_step_<N>` (written by `longhaul.agentloop.traces`, read back by `longhaul.tracking.traces`).
ROLLOUT_STEP_PREFIX = "step_"
ROLLOUT_VALIDATION_PREFIX = "val_"
#: The embedded MLflow store (`sqlite:///<dir>/mlflow.db`) of a local run (of a seed group: in the group's
#: directory), and beside it the artefacts of the experiments longhaul creates in it (`longhaul.tracking.config`).
MLFLOW_STORE_FILE = "mlflow.db"
MLFLOW_ARTIFACTS_SUBDIR = "mlartifacts"
#: The run's MLflow run as JSON (`longhaul.tracking.runs.TrackedRun`), and its bare id (written too; the only
#: record of runs from before the JSON one).
MLFLOW_RUN_FILE = "mlflow_run.json"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
#: The MLflow relay of a run whose tracking URI is a server (`longhaul.tracking.relay`): its buffer store, its
#: outbox of longhaul's own operations, its forwarding state and the artefacts of its mirror runs.
RELAY_DIR = f"{STATE_DIR}/mlflow-relay"
RELAY_BUFFER_DB = "buffer.db"
RELAY_STATE_FILE = "state.json"
RELAY_OUTBOX_SUBDIR = "outbox"
RELAY_ARTIFACTS_SUBDIR = "artifacts"


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

    @property
    def mlflow_run_file(self) -> str:
        """The run's MLflow run (`TrackedRun` as JSON): a restarted job resumes into it."""
        return f"{self.run_dir}/{MLFLOW_RUN_FILE}"

    @property
    def mlflow_run_id_file(self) -> str:
        """The bare MLflow run id (read when `mlflow_run_file` is missing: runs from before it existed)."""
        return f"{self.run_dir}/{MLFLOW_RUN_ID_FILE}"

    @property
    def relay(self) -> RelayPaths:
        """The files of the run's MLflow relay."""
        return RelayPaths.under(self)


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


@dataclass(frozen=True)
class RelayPaths:
    """Files of a run's MLflow relay, all under `<run_dir>/.longhaul/mlflow-relay`."""

    relay_dir: str
    buffer_db: str
    state_file: str
    outbox_dir: str
    artifacts_dir: str

    @classmethod
    def under(cls, paths: Paths) -> RelayPaths:
        """From the run's `Paths`."""
        d = f"{_clean(paths.run_dir)}/{RELAY_DIR}"
        return cls(
            relay_dir=d,
            buffer_db=f"{d}/{RELAY_BUFFER_DB}",
            state_file=f"{d}/{RELAY_STATE_FILE}",
            outbox_dir=f"{d}/{RELAY_OUTBOX_SUBDIR}",
            artifacts_dir=f"{d}/{RELAY_ARTIFACTS_SUBDIR}",
        )


def rollout_step_name(step: int | str, *, validation: bool = False) -> str:
    """The directory of one step's rollout traces under the rollouts directory: `step_<N>` (`val_step_<N>`)."""
    return f"{ROLLOUT_VALIDATION_PREFIX if validation else ''}{ROLLOUT_STEP_PREFIX}{step}"


def rollout_step_of(name: str) -> int | None:
    """The training step of a rollout-trace directory named `step_<N>`; None for any other name (validation)."""
    digits = name[len(ROLLOUT_STEP_PREFIX) :] if name.startswith(ROLLOUT_STEP_PREFIX) else ""
    return int(digits) if digits.isdigit() else None


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
    # deferred: spec.naming builds the whole schema (~0.1 s); `longhaul --help` imports layout, callers hold `exp`
    from longhaul.spec.naming import run_name

    return run_dir_under(runs_root(exp, backend), run_name(exp))
