"""Names shared by every backend: API group, labels, environment variables, paths. One place, no logic."""

from __future__ import annotations

API_GROUP = "longhaul.dev"
API_VERSION = "v1alpha1"
KIND = "Experiment"
PLURAL = "experiments"
SINGULAR = "experiment"
SHORT_NAMES = ("exp", "lhx")
CATEGORIES = ("longhaul", "all-experiments")

LABEL_RUN_NAME = f"{API_GROUP}/run-name"
LABEL_SPEC_HASH = f"{API_GROUP}/spec-hash"
LABEL_EXPERIMENT = f"{API_GROUP}/experiment"
LABEL_STAGE = f"{API_GROUP}/stage"
#: On the children of a seed run: the group's run name (selects every seed run's objects of one Experiment).
LABEL_SEED_GROUP = f"{API_GROUP}/seed-group"
ANNOTATION_GIT_COMMIT = f"{API_GROUP}/git-commit"
#: At most this many runs in an Experiment's `status.history` (the oldest are dropped; the CRD's maxItems): the status
#: stays far below etcd's object size limit however often a spec is changed from git.
STATUS_HISTORY_LIMIT = 50
#: On a seed run: the run name of the multi-seed Experiment it was expanded from (`longhaul.spec.seed_runs`).
ANNOTATION_SEED_GROUP = f"{API_GROUP}/seed-group"
#: On a seed run, beside ANNOTATION_SEED_GROUP: the group's training seeds in order (`7,8`). With them the group's
#: spec, and so its run name, is rebuilt from the seed run's own spec (`longhaul.spec.naming.seed_group`): the run
#: name always derives from the spec hash, never from an annotation a hand could write.
ANNOTATION_SEED_GROUP_SEEDS = f"{API_GROUP}/seed-group-seeds"
ANNOTATION_MLFLOW_RUN_ID = f"{API_GROUP}/mlflow-run-id"
ANNOTATION_MLFLOW_URL = f"{API_GROUP}/mlflow-url"
ANNOTATION_CHECKPOINT_STEP = f"{API_GROUP}/checkpoint-step"
#: On an Experiment: what the operator does with a spec edit while its run is active (`longhaul.k8s.reconcile.
#: spec_change_policy`): SPEC_CHANGE_REFUSE (the default: the run goes on, the edit is reported) or
#: SPEC_CHANGE_NEW_RUN (the run is stopped and the edited spec starts as a new run).
ANNOTATION_ON_SPEC_CHANGE = f"{API_GROUP}/on-spec-change"
SPEC_CHANGE_REFUSE = "refuse"
SPEC_CHANGE_NEW_RUN = "new-run"
SPEC_CHANGE_POLICIES = (SPEC_CHANGE_REFUSE, SPEC_CHANGE_NEW_RUN)
#: How the operator deletes the stage workloads of a run it stops: the workload stays (terminating) until its pods
#: have exited, each pod after SIGTERM and its termination grace period.
STOP_PROPAGATION_POLICY = "Foreground"
APP_NAME = "longhaul"
MANAGED_BY = "longhaul-operator"

#: Kueue (kueue.x-k8s.io, labels as of v0.19): the LocalQueue a workload (Job, RayJob, JobSet) is submitted to,
#: and the WorkloadPriorityClass that orders it in its ClusterQueue. Both go on the workload object itself.
KUEUE_GROUP = "kueue.x-k8s.io"
LABEL_KUEUE_QUEUE = f"{KUEUE_GROUP}/queue-name"
LABEL_KUEUE_PRIORITY_CLASS = f"{KUEUE_GROUP}/priority-class"
#: On the Workload objects Kueue creates for a job: the uid of that job (how the operator finds them).
LABEL_KUEUE_JOB_UID = f"{KUEUE_GROUP}/job-uid"
KUEUE_WORKLOAD_API = f"{KUEUE_GROUP}/v1beta2"

#: Environment variables read by longhaul itself.
ENV_SPEC = "LONGHAUL_SPEC"
ENV_RUN_NAME = "LONGHAUL_RUN_NAME"
ENV_RUN_DIR = "LONGHAUL_RUN_DIR"
ENV_BACKEND = "LONGHAUL_BACKEND"
ENV_JOB_ID = "LONGHAUL_JOB_ID"
ENV_IMAGE = "LONGHAUL_IMAGE"
ENV_GIT_COMMIT = "LONGHAUL_GIT_COMMIT"
ENV_STAGE = "LONGHAUL_STAGE"
#: Where the agent loop writes one trace record per trajectory (`longhaul explain` reads them).
ENV_ROLLOUT_DIR = "LONGHAUL_ROLLOUT_DIR"
#: Where stages find the servers: set by the launcher for every stage; `longhaul eval` and `longhaul sft` read them.
ENV_SIMULATOR_BASE_URL = "LONGHAUL_SIMULATOR_BASE_URL"
ENV_SIMULATOR_MODEL = "LONGHAUL_SIMULATOR_MODEL"
ENV_POLICY_BASE_URL = "LONGHAUL_POLICY_BASE_URL"
ENV_POLICY_MODEL = "LONGHAUL_POLICY_MODEL"
#: API keys of the endpoints. The simulator's comes from `spec.user_simulator.api_key_secret` on Kubernetes; the
#: agent loop and `longhaul eval` read it.
ENV_USER_SIM_API_KEY = "LONGHAUL_USER_SIM_API_KEY"
ENV_POLICY_API_KEY = "LONGHAUL_POLICY_API_KEY"
#: The vLLM servers' interpreter when the spec gives no server command (default: the launcher's own python).
ENV_VLLM_PYTHON = "LONGHAUL_VLLM_PYTHON"
#: Slurm: the virtualenv to activate (runtime `none` without `spec.backends.slurm.venv`); the submit step sets it to
#: the submitting interpreter's `sys.prefix`, and sbatch exports it into the job.
ENV_VENV = "LONGHAUL_VENV"
#: The kubectl binary `longhaul submit --backend kubernetes` runs (else kubectl on PATH).
ENV_KUBECTL = "LONGHAUL_KUBECTL"
#: Set in the environment of every process the launcher starts (and so inherited by everything they start): the
#: absolute run directory. How the next launcher of the same run finds leftovers of one that was killed.
ENV_SUPERVISED_BY = "LONGHAUL_SUPERVISED_BY"
#: Set beside it: the name of the launcher's child a process descends from (`simulator`, `grpo`, …), so that
#: stopping one child also stops what it started in sessions of its own (Ray's agents, vLLM's resource tracker).
ENV_SUPERVISED_ROLE = "LONGHAUL_SUPERVISED_ROLE"
#: Seconds a trainer's process waits for the user simulator to serve before its first episode: the launcher
#: starts the trainer while the simulator is still loading and sets this to the simulator's start-up budget
#: (`longhaul.clients.ready`).
ENV_SERVER_WAIT_S = "LONGHAUL_SERVER_WAIT_S"
#: Multi-node Kubernetes (JobSet): node count, this pod's rank and the Ray head's address.
ENV_NODES = "LONGHAUL_NODES"
ENV_NODE_RANK = "LONGHAUL_NODE_RANK"
ENV_HEAD_ADDRESS = "LONGHAUL_HEAD_ADDRESS"
#: The operator's status re-sync period and per-request timeout, in seconds.
ENV_OPERATOR_RESYNC_S = "LONGHAUL_OPERATOR_RESYNC_S"
ENV_OPERATOR_REQUEST_TIMEOUT_S = "LONGHAUL_OPERATOR_REQUEST_TIMEOUT_S"

#: CUDA's device mask. Servers get GPUs by position inside the job's own mask (`longhaul.render.gpus`).
CUDA_MASK_VAR = "CUDA_VISIBLE_DEVICES"

#: Third-party variables that every job sets (the only place they are defined).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

#: Where the resolved spec is mounted / written inside a job.
SPEC_FILENAME = "experiment.yaml"
CONTAINER_SPEC_DIR = "/etc/longhaul"
CONTAINER_RUN_ROOT = "/runs"
#: The default run-outputs directory of the local and Slurm backends (`backends.<local|slurm>.output_dir`), and
#: where `longhaul status NAME` looks for a run (`longhaul.layout.DEFAULT_RUNS_DIR`).
DEFAULT_RUNS_DIR = "runs"
LAUNCHER_CMD = ("longhaul", "launch")
