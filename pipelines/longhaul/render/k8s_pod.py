"""The pod of a stage workload (pure): one trainer container running the in-container launcher, non-root on a
read-only root filesystem, with the spec ConfigMap, shared memory, scratch space and the run directory mounted."""

from __future__ import annotations

from typing import Any

from longhaul import constants as C
from longhaul.layout import default_run_dir
from longhaul.render.jobenv import job_env
from longhaul.render.k8s_names import configmap_name
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.naming import run_name
from longhaul.spec.paths import TRAINER_HOME, TRAINER_SCRATCH
from longhaul.spec.simulator import Placement

NON_ROOT_UID = 1000
CONTAINER_NAME = "trainer"
SPEC_VOLUME = "spec"
SHM_VOLUME = "dshm"
RUNS_VOLUME = "runs"
TMP_VOLUME = "tmp"
HOME_VOLUME = "home"
SCRATCH_VOLUME = "scratch"
#: Where the ConfigMap key lands inside the container (constants say the directory and the file name).
CONTAINER_SPEC_PATH = f"{C.CONTAINER_SPEC_DIR}/{C.SPEC_FILENAME}"
#: The container lists longhaul's job variables first, then the offline flags: the order every rendered Job has
#: had (golden files pin it); no variable refers to another (`$(VAR)`), so the order means nothing else.
_ENV_FIRST = (
    C.ENV_SPEC,
    C.ENV_RUN_NAME,
    C.ENV_RUN_DIR,
    C.ENV_BACKEND,
    C.ENV_JOB_ID,
    C.ENV_IMAGE,
    C.ENV_STAGE,
    C.ENV_GIT_COMMIT,
)


def run_dir(exp: Experiment) -> str:
    """The run directory inside the pod: on the checkpoint PVC when one is set, else under /runs."""
    return default_run_dir(exp, "kubernetes")


def launcher_argv(exp: Experiment, stage: Stage | str) -> list[str]:
    """The in-container launcher invocation for one stage (an argv list: nothing goes through a shell)."""
    return [
        *C.LAUNCHER_CMD,
        "--spec",
        CONTAINER_SPEC_PATH,
        "--backend",
        "kubernetes",
        "--run-dir",
        run_dir(exp),
        "--stage",
        str(stage),
    ]


def _env(exp: Experiment, stage: Stage | str, job_name: str) -> list[dict[str, Any]]:
    # The spec is the ConfigMap mounted read-only; the launcher copies it into the run directory, and the launch
    # plan's environment points every stage at that copy.
    job = job_env("kubernetes", run_name(exp), run_dir(exp), CONTAINER_SPEC_PATH, stage=str(stage), job_id=job_name)
    # Provenance the launcher records with the run (`longhaul.tracking.provenance`): only a pod knows its image.
    job[C.ENV_IMAGE] = exp.spec.backends.kubernetes.image
    commit = exp.metadata.annotations.get(C.ANNOTATION_GIT_COMMIT)
    if commit:
        job[C.ENV_GIT_COMMIT] = commit
    names = [n for n in _ENV_FIRST if n in job] + [n for n in job if n not in _ENV_FIRST]
    env: list[dict[str, Any]] = [{"name": n, "value": job[n]} for n in names]
    tracking = exp.spec.tracking
    if tracking.uri:
        env.append({"name": "MLFLOW_TRACKING_URI", "value": tracking.uri})
    elif tracking.uri_secret:
        ref = {"name": tracking.uri_secret.name, "key": tracking.uri_secret.key}
        env.append({"name": "MLFLOW_TRACKING_URI", "valueFrom": {"secretKeyRef": ref}})
    sim = exp.spec.user_simulator
    if sim.placement == Placement.EXTERNAL and sim.api_key_secret:
        # Secrets only by reference: the key reaches the pod from its Secret, never through a rendered file.
        ref = {"name": sim.api_key_secret.name, "key": sim.api_key_secret.key}
        env.append({"name": C.ENV_USER_SIM_API_KEY, "valueFrom": {"secretKeyRef": ref}})
    return env


def _resources(exp: Experiment) -> dict[str, Any]:
    res = exp.spec.resources
    amounts: dict[str, Any] = {"cpu": str(res.cpus_per_node), "memory": res.memory}
    if res.gpus_per_node:
        amounts["nvidia.com/gpu"] = str(res.gpus_per_node)
    # Requests equal limits: Guaranteed QoS, so a training pod is the last to be evicted.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        # Writable: only the mounted volumes (/tmp, /dev/shm, the run directory, HOME and the caches in /scratch).
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _volumes(exp: Experiment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    res, k8s = exp.spec.resources, exp.spec.backends.kubernetes
    volumes: list[dict[str, Any]] = [
        {"name": SPEC_VOLUME, "configMap": {"name": configmap_name(exp)}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}},
        {"name": TMP_VOLUME, "emptyDir": {}},
        {"name": HOME_VOLUME, "emptyDir": {}},
        {"name": SCRATCH_VOLUME, "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": SPEC_VOLUME, "mountPath": C.CONTAINER_SPEC_DIR, "readOnly": True},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": HOME_VOLUME, "mountPath": TRAINER_HOME},
        {"name": SCRATCH_VOLUME, "mountPath": TRAINER_SCRATCH},
    ]
    vol = k8s.checkpoint_volume
    if vol:
        volumes.append({"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": vol.claim_name}})
        mounts.append({"name": RUNS_VOLUME, "mountPath": vol.mount_path})
    else:
        volumes.append({"name": RUNS_VOLUME, "emptyDir": {}})
        mounts.append({"name": RUNS_VOLUME, "mountPath": C.CONTAINER_RUN_ROOT})
    return volumes, mounts


def render_pod_spec(
    exp: Experiment, stage: Stage | str, job_name: str, *, argv: list[str] | None = None
) -> dict[str, Any]:
    """The pod template spec of one stage: one trainer container with the launcher as its command."""
    k8s = exp.spec.backends.kubernetes
    volumes, mounts = _volumes(exp)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": k8s.image,
        "imagePullPolicy": k8s.image_pull_policy,
        "command": argv if argv is not None else launcher_argv(exp, stage),
        "env": _env(exp, stage, job_name),
        "resources": _resources(exp),
        "volumeMounts": mounts,
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # The trainer never talks to the API server: no token in the pod.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NON_ROOT_UID,
            "runAsGroup": NON_ROOT_UID,
            "fsGroup": NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        pod["tolerations"] = [t.model_dump(mode="json", exclude_none=True) for t in k8s.tolerations]
    if k8s.priority_class and not k8s.queue:
        # With a queue the name is a Kueue WorkloadPriorityClass (a label on the workload, see kueue_labels).
        pod["priorityClassName"] = k8s.priority_class
    return pod
