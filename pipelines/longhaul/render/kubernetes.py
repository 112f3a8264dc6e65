"""Render an Experiment to the Kubernetes objects the operator creates (pure: no cluster, no clock, no I/O).

`render_kubernetes(exp)` returns, for each run of the Experiment (one, or one per training seed when
`spec.algorithm.seeds` is set: `longhaul.spec.seed_runs`), in creation order:

1. a ConfigMap `<run>-spec` holding the run's resolved spec (`experiment.yaml`), mounted read-only at /etc/longhaul;
2. one workload per stage, in stage order (`<run>-sft`, `<run>-grpo`, `<run>-eval`): a `batch/v1` Job for
   single-node specs, a KubeRay `RayJob` or a `JobSet` (spec.backends.kubernetes.multinode_engine) when
   `resources.nodes > 1`. The operator creates them one after the other; each runs the in-container launcher
   with `--stage <stage>`.

The runs of a multi-seed Experiment are independent stage chains (`<group>-s<seed>-spec`, `<group>-s<seed>-grpo`,
…) whose children also carry the label `longhaul.dev/seed-group=<group run name>`. Every other function here
renders one run. Names derive from `run_name(exp)` only (not from the owner), so a re-render after an operator
restart yields the same objects and creation stays idempotent.

The objects' names are in `longhaul.render.k8s_names`, the pod template's spec in `longhaul.render.k8s_pod`;
their public names are importable from here too (`__all__`).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from longhaul import constants as C
from longhaul.render.k8s_names import MAX_NAME, child_name, configmap_name, stage_job_name
from longhaul.render.k8s_pod import (
    CONTAINER_NAME,
    CONTAINER_SPEC_PATH,
    HOME_VOLUME,
    NON_ROOT_UID,
    RUNS_VOLUME,
    SCRATCH_VOLUME,
    SHM_VOLUME,
    SPEC_VOLUME,
    TMP_VOLUME,
    launcher_argv,
    render_pod_spec,
    run_dir,
)
from longhaul.spec.backends import MultiNodeEngine
from longhaul.spec.models import Experiment, Stage, resolved_yaml
from longhaul.spec.naming import run_name, seed_group, seed_runs, spec_hash

__all__ = [
    "CONTAINER_NAME",
    "CONTAINER_SPEC_PATH",
    "HOME_VOLUME",
    "JOBSET_API",
    "MAX_NAME",
    "NON_ROOT_UID",
    "RAYJOB_API",
    "RUNS_VOLUME",
    "SCRATCH_VOLUME",
    "SHM_VOLUME",
    "SPEC_VOLUME",
    "TMP_VOLUME",
    "child_name",
    "configmap_name",
    "kueue_labels",
    "labels",
    "launcher_argv",
    "render_configmap",
    "render_experiment",
    "render_job",
    "render_jobset",
    "render_kubernetes",
    "render_pod_spec",
    "render_rayjob",
    "render_run",
    "render_stage",
    "run_dir",
    "selector_labels",
    "stage_job_name",
    "target_namespace",
    "time_limit_seconds",
]

RAYJOB_API = "ray.io/v1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"


def time_limit_seconds(limit: str) -> int:
    """`[D-]HH:MM:SS` (validated by the spec) → seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d{1,3}):(\d{2}):(\d{2})", limit)
    if m is None:  # the spec's pattern makes this unreachable; keep the message useful anyway
        raise ValueError(f"resources.time_limit: {limit!r} is not [D-]HH:MM:SS")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def labels(exp: Experiment, stage: Stage | str | None = None) -> dict[str, str]:
    """The `longhaul.dev/*` + `app.kubernetes.io/*` label set of every child object."""
    run = run_name(exp)
    out = {
        C.LABEL_EXPERIMENT: exp.metadata.name,
        C.LABEL_RUN_NAME: run,
        C.LABEL_SPEC_HASH: spec_hash(exp)[:8],
        "app.kubernetes.io/name": C.APP_NAME,
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/component": "trainer" if stage is not None else "spec",
        "app.kubernetes.io/part-of": C.APP_NAME,
        "app.kubernetes.io/managed-by": C.MANAGED_BY,
    }
    if stage is not None:
        out[C.LABEL_STAGE] = str(stage)
    group = seed_group(exp)
    if group is not None:
        out[C.LABEL_SEED_GROUP] = group
    return out


def selector_labels(exp: Experiment) -> dict[str, str]:
    """Labels that select every child of one run (for `kubectl get -l` and the operator)."""
    return {C.LABEL_RUN_NAME: run_name(exp)}


def _annotations(exp: Experiment) -> dict[str, str]:
    out = {C.LABEL_SPEC_HASH: spec_hash(exp)}
    commit = exp.metadata.annotations.get(C.ANNOTATION_GIT_COMMIT)
    if commit:
        out[C.ANNOTATION_GIT_COMMIT] = commit
    return out


def _metadata(exp: Experiment, name: str, namespace: str | None, stage: Stage | str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = labels(exp, stage)
    meta["annotations"] = _annotations(exp)
    return meta


def kueue_labels(exp: Experiment) -> dict[str, str]:
    """Kueue's labels of a stage workload: its LocalQueue and WorkloadPriorityClass (empty without a queue).

    They go on the workload object (Job, RayJob, JobSet), never on its pods: Kueue creates one Workload per such
    object, with one pod set per pod template (RayJob: head and workers; JobSet: each replicated job), and
    admits all pod sets of a Workload at once. So a multi-node stage is admitted as one gang, and each stage
    separately: the stages run one after the other, and quota held for a later stage would sit idle.
    """
    k8s = exp.spec.backends.kubernetes
    if not k8s.queue:
        return {}
    out = {C.LABEL_KUEUE_QUEUE: k8s.queue}
    if k8s.priority_class:
        out[C.LABEL_KUEUE_PRIORITY_CLASS] = k8s.priority_class
    return out


def _workload_metadata(exp: Experiment, name: str, namespace: str | None, stage: Stage | str) -> dict[str, Any]:
    meta = _metadata(exp, name, target_namespace(exp, namespace), stage)
    meta["labels"].update(kueue_labels(exp))
    return meta


def _suspended(exp: Experiment) -> dict[str, Any]:
    """`suspend: true` with a queue: Kueue admits a workload by unsuspending it (and preempts it by suspending it
    again). Created suspended rather than left to Kueue's webhook, so no pod starts before Kueue has seen it."""
    return {"suspend": True} if exp.spec.backends.kubernetes.queue else {}


def target_namespace(exp: Experiment, namespace: str | None = None) -> str | None:
    """Explicit argument, else spec.backends.kubernetes.namespace, else the Experiment's own namespace."""
    return namespace or exp.spec.backends.kubernetes.namespace or exp.metadata.namespace


def render_configmap(exp: Experiment, *, namespace: str | None = None) -> dict[str, Any]:
    """The immutable ConfigMap with the resolved spec that the launcher re-validates at start."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(exp, configmap_name(exp), target_namespace(exp, namespace), None),
        "immutable": True,
        "data": {C.SPEC_FILENAME: resolved_yaml(exp)},
    }


def _pod_template(exp: Experiment, stage: Stage | str, name: str, *, argv: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": labels(exp, stage), "annotations": _annotations(exp)}
    if exp.spec.resources.gpu_type:
        meta["annotations"][f"{C.API_GROUP}/gpu-type"] = exp.spec.resources.gpu_type
    return {"metadata": meta, "spec": render_pod_spec(exp, stage, name, argv=argv)}


def render_job(exp: Experiment, stage: Stage | str, *, namespace: str | None = None) -> dict[str, Any]:
    """The single-node `batch/v1` Job of one stage."""
    name = stage_job_name(exp, stage)
    k8s = exp.spec.backends.kubernetes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _workload_metadata(exp, name, namespace, stage),
        "spec": {
            **_suspended(exp),
            "backoffLimit": k8s.backoff_limit,
            "activeDeadlineSeconds": time_limit_seconds(exp.spec.resources.time_limit),
            "completions": 1,
            "parallelism": 1,
            "template": _pod_template(exp, stage, name),
        },
    }


def render_rayjob(exp: Experiment, stage: Stage | str, *, namespace: str | None = None) -> dict[str, Any]:
    """KubeRay RayJob for `nodes > 1`: one head pod + `nodes - 1` workers, the launcher as the entrypoint."""
    name = stage_job_name(exp, stage)
    res = exp.spec.resources
    # KubeRay writes the `ray start` command from rayStartParams and manages restarts: no command here.
    head, worker = _pod_template(exp, stage, name), _pod_template(exp, stage, name)
    for tpl in (head, worker):
        tpl["spec"].pop("restartPolicy")
        tpl["spec"]["containers"][0].pop("command")
    return {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": _workload_metadata(exp, name, namespace, stage),
        "spec": {
            **_suspended(exp),
            "entrypoint": shlex.join(launcher_argv(exp, stage)),
            "submissionMode": "K8sJobMode",
            # Also what Kueue requires of a RayJob it manages: the cluster's quota is released when the job ends.
            "shutdownAfterJobFinishes": True,
            "activeDeadlineSeconds": time_limit_seconds(res.time_limit),
            "backoffLimit": exp.spec.backends.kubernetes.backoff_limit,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": head},
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": res.nodes - 1,
                        "minReplicas": res.nodes - 1,
                        "maxReplicas": res.nodes - 1,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }


def render_jobset(exp: Experiment, stage: Stage | str, *, namespace: str | None = None) -> dict[str, Any]:
    """JobSet for `nodes > 1`: one indexed Job of `nodes` pods; index 0 is the Ray head (the launcher decides)."""
    name = stage_job_name(exp, stage)
    res, k8s = exp.spec.resources, exp.spec.backends.kubernetes
    tpl = _pod_template(exp, stage, name)
    env = tpl["spec"]["containers"][0]["env"]
    env += [
        {"name": C.ENV_NODES, "value": str(res.nodes)},
        {
            "name": C.ENV_NODE_RANK,
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        # JobSet gives pods stable DNS names: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<jobset>
        {"name": C.ENV_HEAD_ADDRESS, "value": f"{name}-node-0-0.{name}"},
    ]
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _workload_metadata(exp, name, namespace, stage),
        "spec": {
            **_suspended(exp),
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": k8s.backoff_limit},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "parallelism": res.nodes,
                            "completions": res.nodes,
                            "backoffLimit": 0,
                            "activeDeadlineSeconds": time_limit_seconds(res.time_limit),
                            "template": tpl,
                        }
                    },
                }
            ],
        },
    }


def render_stage(exp: Experiment, stage: Stage | str, *, namespace: str | None = None) -> dict[str, Any]:
    """The workload of one stage: Job (1 node), RayJob or JobSet (several nodes)."""
    if exp.spec.resources.nodes == 1:
        return render_job(exp, stage, namespace=namespace)
    if exp.spec.backends.kubernetes.multinode_engine == MultiNodeEngine.JOBSET:
        return render_jobset(exp, stage, namespace=namespace)
    return render_rayjob(exp, stage, namespace=namespace)


def render_run(exp: Experiment, *, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every object of one run (a single-seed Experiment or a seed run), in creation order: the spec ConfigMap,
    then one workload per stage."""
    objs = [render_configmap(exp, namespace=namespace)]
    objs += [render_stage(exp, stage, namespace=namespace) for stage in exp.spec.stages]
    return objs


def render_kubernetes(exp: Experiment, *, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every object of an Experiment: `render_run` of each of its runs (one per training seed), in seed order."""
    return [obj for run in seed_runs(exp) for obj in render_run(run, namespace=namespace)]


def render_experiment(exp: Experiment) -> str:
    """The Experiment resource `longhaul submit --backend kubernetes` applies (`kubectl apply -f -`): the resolved
    spec, all defaults filled (the same run hash in the cluster), the spec's namespace kept when it names one.

    On Kubernetes this one resource is what is submitted, not the objects of `render_kubernetes`: the operator
    renders those from it in the cluster and creates them one stage after the other while it keeps the Experiment's
    status (applying the stage Jobs directly would start every stage at once). What `longhaul render --backend
    kubernetes` prints, and the golden files pin, is what the operator renders from exactly this text."""
    return resolved_yaml(exp)
