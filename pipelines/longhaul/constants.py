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
#: On a seed run: the run name of the multi-seed Experiment it was expanded from (`longhaul.spec.seed_runs`).
ANNOTATION_SEED_GROUP = f"{API_GROUP}/seed-group"
ANNOTATION_MLFLOW_RUN_ID = f"{API_GROUP}/mlflow-run-id"
ANNOTATION_MLFLOW_URL = f"{API_GROUP}/mlflow-url"
ANNOTATION_CHECKPOINT_STEP = f"{API_GROUP}/checkpoint-step"
APP_NAME = "longhaul"
MANAGED_BY = "longhaul-operator"

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
LAUNCHER_CMD = ("longhaul", "launch")
