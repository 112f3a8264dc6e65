"""`spec.backends`: what each backend needs beyond the common spec (Kubernetes pods, Slurm batch jobs, local runs)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from longhaul.constants import DEFAULT_RUNS_DIR
from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.paths import SAFE_PATH, ArgvWord, BindMount, MountPath, SafePath, WritePath, check_read_path
from longhaul.spec.strings import DNS1123_LABEL, K8sLabelValue, QualifiedName, SafeToken

IMAGE_REF = r"^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$"
#: A pyxis/enroot image: [USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST] (`srun --container-image`).
PYXIS_IMAGE = (
    r"^([A-Za-z0-9._-]+@)?([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?#)?[a-z0-9]([a-z0-9._/-]*[a-z0-9])?"
    r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
#: An image apptainer pulls itself: docker://, oras:// or library:// and a registry reference.
APPTAINER_URI = r"^(docker|oras|library)://" + IMAGE_REF[1:]


class ContainerRuntime(StrEnum):
    APPTAINER = "apptainer"
    PYXIS = "pyxis"
    NONE = "none"


class MultiNodeEngine(StrEnum):
    RAYJOB = "rayjob"
    JOBSET = "jobset"


class Backend(StrEnum):
    KUBERNETES = "kubernetes"
    SLURM = "slurm"
    LOCAL = "local"


class Toleration(SpecModel):
    key: QualifiedName | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: K8sLabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class CheckpointVolume(SpecModel):
    claim_name: SafeToken = Field(description="PersistentVolumeClaim for checkpoints and run outputs.")
    mount_path: MountPath = Field(default="/checkpoints", description="Mount path in the pod (absolute).")


class KubernetesSpec(SpecModel):
    namespace: str | None = Field(
        default=None, pattern=DNS1123_LABEL, max_length=63, description="Namespace; null = the Experiment's."
    )
    image: str = Field(
        default="ghcr.io/longhaul-dev/trainer:0.1.0",
        pattern=IMAGE_REF,
        max_length=512,
        description="Trainer image (models baked in).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(default="IfNotPresent")
    service_account: str | None = Field(
        default=None, pattern=DNS1123_LABEL, max_length=63, description="Pod service account."
    )
    node_selector: dict[QualifiedName, K8sLabelValue] = Field(default_factory=dict, description="Pod node selector.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations.")
    queue: str | None = Field(
        default=None,
        pattern=DNS1123_LABEL,
        max_length=63,
        description=(
            "Kueue LocalQueue (in the Experiment's namespace). Set: every stage workload (Job, RayJob, JobSet) is "
            "created suspended with the label kueue.x-k8s.io/queue-name and starts when Kueue admits it (phase "
            "Queued until then); a multi-node stage is one workload, admitted as a whole. null = no Kueue."
        ),
    )
    priority_class: str | None = Field(
        default=None,
        pattern=DNS1123_LABEL,
        max_length=63,
        description=(
            "Without queue: the pods' PriorityClass. With queue: a Kueue WorkloadPriorityClass (label "
            "kueue.x-k8s.io/priority-class), which orders admission and preemption in the ClusterQueue; the pods "
            "then get no PriorityClass, so only Kueue preempts them."
        ),
    )
    checkpoint_volume: CheckpointVolume | None = Field(
        default=None, description="PVC for checkpoints; null = emptyDir (lost with the pod)."
    )
    backoff_limit: int = Field(default=0, ge=0, le=10, description="Job retries.")
    multinode_engine: MultiNodeEngine = Field(
        default=MultiNodeEngine.RAYJOB, description="Engine for nodes > 1 (KubeRay RayJob or JobSet)."
    )


def _container_image(value: str) -> str:
    """A local image file (a .sif, an enroot squashfs: a path), a pyxis reference or an apptainer URI."""
    if re.fullmatch(SAFE_PATH, value):
        return check_read_path(value)
    if re.fullmatch(PYXIS_IMAGE, value) or re.fullmatch(APPTAINER_URI, value):
        return value
    raise ValueError(
        "not an image: give a path (/images/longhaul.sif), a pyxis reference ([USER@][REGISTRY#]IMAGE[:TAG], "
        "e.g. nvcr.io#nvidia/pytorch:24.01-py3) or an apptainer URI (docker://REGISTRY/IMAGE[:TAG])"
    )


class ContainerSpec(SpecModel):
    runtime: ContainerRuntime = Field(default=ContainerRuntime.APPTAINER, description="Container runtime.")
    image: Annotated[str, Field(max_length=1024), AfterValidator(_container_image)] | None = Field(
        default=None,
        description="apptainer: path of the .sif or docker://…; pyxis: [USER@][REGISTRY#]IMAGE[:TAG] or a squashfs; "
        "none: unused.",
    )
    binds: list[BindMount] = Field(default_factory=list, description="Extra bind mounts (SRC[:DST[:OPTS]]).")


SetupLine = Annotated[str, Field(max_length=1000)]


class SlurmSpec(SpecModel):
    partition: SafeToken | None = Field(default=None, description="Partition (-p).")
    account: SafeToken | None = Field(default=None, description="Account (-A).")
    qos: SafeToken | None = Field(default=None, description="QOS (--qos).")
    container: ContainerSpec = Field(default_factory=ContainerSpec, description="How the job runs the image.")
    venv: SafePath | None = Field(default=None, description="runtime 'none': virtualenv to activate.")
    setup: list[SetupLine] = Field(
        default_factory=list,
        description="Shell lines run before the launcher (e.g. 'module load cuda/12.4'); one command per line.",
    )
    output_dir: WritePath = Field(
        default=DEFAULT_RUNS_DIR, description="Run outputs (relative to the submit directory)."
    )
    signal_lead_s: Annotated[int, Field(ge=30, le=3600)] = Field(
        default=300, description="Seconds before the time limit at which the job is told to checkpoint."
    )
    requeue: bool = Field(default=True, description="Requeue on preemption / after the pre-limit checkpoint.")
    max_requeues: Annotated[int, Field(ge=0, le=10000)] | None = Field(
        default=10,
        description=(
            "Requeues after which the job stops (state FAILED, exit code 79, `longhaul status` says why) instead "
            "of requeueing again: a run that never gets past its time limit or keeps being preempted would "
            "otherwise requeue forever. 10 x the time limit is weeks of training at the usual 1-3 day limits; "
            "raise it for short limits. The checkpoint is kept: submitting the same spec resumes. null = unlimited."
        ),
    )

    @field_validator("setup")
    @classmethod
    def _setup_lines(cls, lines: list[str]) -> list[str]:
        for i, line in enumerate(lines):
            if any(ord(c) < 32 and c != "\t" for c in line) or "\x7f" in line:
                raise FieldError(
                    str(i), "control characters (newline, CR, NUL…) are not allowed; one command per entry"
                )
            if line.lstrip().startswith("#SBATCH"):
                raise FieldError(str(i), "'#SBATCH' directives belong in the spec's fields, not in setup lines")
        return lines


class LocalSpec(SpecModel):
    output_dir: WritePath = Field(
        default=DEFAULT_RUNS_DIR, description="Run outputs (relative to the working directory)."
    )
    policy_server_cmd: list[ArgvWord] | None = Field(
        default=None, description="argv prefix that starts an OpenAI-compatible server (CPU vLLM)."
    )
    policy_port: int = Field(default=8000, ge=1024, le=65535, description="Port of the local policy server.")


class BackendsSpec(SpecModel):
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec, description="Kubernetes Job settings.")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="Slurm batch settings.")
    local: LocalSpec = Field(default_factory=LocalSpec, description="Local run settings.")
