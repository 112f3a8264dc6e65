"""MLflow tag keys, artifact paths and run-name patterns used by longhaul (one place).

The schema of a tracked run: the tracking adapter (`longhaul.tracking`) writes these keys and the pure analysis
(selection, the ablation table, the statistics) reads them, so they live in the lower of the two packages.
"""

from __future__ import annotations

PREFIX = "longhaul."

KIND = "longhaul.kind"
KIND_TRAIN = "train"
KIND_EVAL = "eval"
KIND_COMPARE = "compare"
#: The parent run of a multi-seed Experiment: one child training run per seed (`longhaul.spec.seed_runs`).
KIND_SEED_GROUP = "seed_group"

RUN_NAME = "longhaul.run_name"
SPEC_HASH = "longhaul.spec_hash"
SPEC_NAME = "longhaul.spec_name"
FAMILY = "longhaul.family"
GIT_COMMIT = "longhaul.git_commit"
IMAGE = "longhaul.image"
DATASET_SHA256 = "longhaul.dataset_sha256"
BACKEND = "longhaul.backend"
JOB_ID = "longhaul.job_id"
JOB_IDS = "longhaul.job_ids"
ATTEMPTS = "longhaul.attempts"
#: Set when a resume queued while the server was down is applied (`longhaul.tracking.runs`: applied once).
RESUME_TOKEN = "longhaul.resume_token"
#: On a mirror run in a relay's buffer store: the server's run it is relayed to (`longhaul.tracking.relay`).
RELAY_REMOTE_RUN_ID = "longhaul.relay.remote_run_id"
#: The training seed of a run, and (on seed runs) the run name of its multi-seed group.
SEED = "longhaul.seed"
SEED_GROUP = "longhaul.seed_group"
VERSION_PREFIX = "longhaul.version."

ADVANTAGE = "longhaul.advantage"
PROCESS_REWARD = "longhaul.process_reward"
CREDIT = "longhaul.credit"
POLICY_MODEL = "longhaul.policy_model"
STAGES = "longhaul.stages"
SELECT_ON = "longhaul.select_on"
#: Written by the eval stage on the training run (`longhaul.analysis.selection`).
SELECTED_STEP = "longhaul.selected_step"
SELECTED_PASS_HAT_1 = "longhaul.selected_pass_hat_1"
SELECTION_NOTE = "longhaul.selection_note"
#: Metric on the training run: pass^1 on select_on of the selected checkpoint, at its step.
SELECTED_PASS_HAT_1_METRIC = "selection/pass_hat_1"

CHECKPOINT_STEP = "longhaul.checkpoint_step"
CHECKPOINT_URI = "longhaul.checkpoint_uri"
CHECKPOINT_URI_PREFIX = "longhaul.checkpoint_uri."
LAST_CHECKPOINT_STEP = "longhaul.last_checkpoint_step"

ALERTS = "longhaul.alerts"
ALERT_PREFIX = "longhaul.alert."
EARLY_STOP = "longhaul.early_stop"

COMPARED_RUNS = "longhaul.compared_runs"

#: Set by MLflow's UI and client for nested runs.
PARENT_RUN_ID = "mlflow.parentRunId"
#: A run's description: MLflow's UI renders it as markdown on the run page (`mlflow.utils.mlflow_tags`).
NOTE = "mlflow.note.content"
#: Longest run tag value an MLflow store keeps (`mlflow.utils.validation.MAX_TAG_VAL_LENGTH`); longer values are
#: cut silently, so a note is fitted to it before it is written.
TAG_VALUE_MAX = 8000

#: MLflow's experiment-kind tag and its value for model training (as opposed to `genai_development`): what
#: MLflow's clients and assistant read to treat an experiment as runs-first.
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
#: MLflow 3.17's UI chooses between its GenAI and model-training navigation from this URL query (else the
#: browser's last choice, GenAI by default) and ignores EXPERIMENT_KIND, so links longhaul prints carry it.
UI_WORKFLOW_QUERY = "workflowType=machine_learning"

SPEC_ARTIFACT_DIR = "spec"
CHECKPOINT_ARTIFACT_DIR = "checkpoints"
EVAL_ARTIFACT_DIR = "eval"
WATCHDOG_ARTIFACT = "watchdog/alerts.json"

COMPARISON_EXPERIMENT = "longhaul/comparisons"


def eval_run_name(train_run_name: str, step: int) -> str:
    """Deterministic name of the evaluation run of one checkpoint: `<run name>-eval-step<N>`."""
    return f"{train_run_name}-eval-step{step}"
