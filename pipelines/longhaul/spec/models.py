"""The `Experiment` custom resource: the single schema behind specs/, the CLI, the CRD and the launcher.

Every default lives here and nowhere else. Models are frozen and forbid unknown keys. Field descriptions
become the CRD's `kubectl explain` text and the README's field reference, so write them for users.

Size: over 400 lines because the single schema (CRD, JSON schema, docs); its cross-field validators need every model
in reach.
"""

from __future__ import annotations

import json
import posixpath
import re
from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from longhaul.constants import (
    ANNOTATION_GIT_COMMIT,
    ANNOTATION_ON_SPEC_CHANGE,
    ANNOTATION_SEED_GROUP,
    ANNOTATION_SEED_GROUP_SEEDS,
    API_GROUP,
    API_VERSION,
    ENV_GIT_COMMIT,
    KIND,
    SPEC_CHANGE_POLICIES,
    SPEC_CHANGE_REFUSE,
)
from longhaul.envs.trajectory import TAU2_MAX_ERRORS
from longhaul.spec.bounds import (
    DOMAIN_TASKS,
    MAX_BOOTSTRAP,
    MAX_CPUS_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_GROUP,
    MAX_KL_COEF,
    MAX_LORA_ALPHA,
    MAX_LORA_RANK,
    MAX_STARTUP_S,
    MAX_STEPS,
    MAX_TOOL_CHARS,
    Batch,
    Concurrency,
    EpisodeEvents,
    Epochs,
    NodeCount,
    RandomSeed,
    Samples,
    Seqs,
    Step,
    Steps,
    TensorParallel,
    Tokens,
    Turns,
)
from longhaul.spec.quantities import check_quantity, check_time_limit
from longhaul.spec.rules import RulesSpec

# ---------------------------------------------------------------------------------------------------------
# Shared string types. Untrusted strings end up in shell scripts and manifests: restrict them at the door.

#: DNS-1123 label, short enough that `<name>-<8 hex>` stays a valid 63-character label.
MAX_NAME_LEN = 54
#: Training seeds per Experiment and the largest seed: `-s<seed>` must fit the 63-character object names.
MAX_SEEDS = 16
DEFAULT_SEED = 42
MAX_SEED = 9999
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def parse_seed_list(text: str) -> list[int]:
    """The seeds of a `7,8` annotation value; [] when it is not such a list (distinct seeds 0 … MAX_SEED, at most
    MAX_SEEDS of them)."""
    if not re.fullmatch(r"[0-9]{1,4}(,[0-9]{1,4})*", text):
        return []
    seeds = [int(x) for x in text.split(",")]
    return seeds if len(seeds) <= MAX_SEEDS and len(set(seeds)) == len(seeds) else []


def is_dns1123_label(value: str) -> bool:
    """Whether `value` is a DNS-1123 label, matched whole (`re.match` with `$` would let a trailing newline by)."""
    return re.fullmatch(DNS1123_LABEL, value) is not None


SAFE_TOKEN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SAFE_PATH = r"^[A-Za-z0-9_./~+-][A-Za-z0-9_./+@=,-]*$"
BIND = r"^[A-Za-z0-9_./~+-][A-Za-z0-9_./+@=,-]*(:[A-Za-z0-9_./+@=,-]+){0,2}$"
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
IMAGE_REF = r"^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$"
#: A pyxis/enroot image: [USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST] (`srun --container-image`).
PYXIS_IMAGE = (
    r"^([A-Za-z0-9._-]+@)?([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?#)?[a-z0-9]([a-z0-9._/-]*[a-z0-9])?"
    r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
#: An image apptainer pulls itself: docker://, oras:// or library:// and a registry reference.
APPTAINER_URI = r"^(docker|oras|library)://" + IMAGE_REF[1:]
REVISION = r"^([0-9a-f]{40}|v?[0-9][A-Za-z0-9._-]*)$"
TIME_LIMIT = r"^(\d+-)?\d{1,3}:\d{2}:\d{2}$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"
URL = r"^(https?|file|sqlite|postgresql|mysql|databricks)(\+[a-z0-9]+)?:/{0,4}[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]*$"

#: Free text that travels through YAML and logs: no control characters, and none of the characters YAML reads as
#: line breaks (NEL, LS, PS), which would not come back unchanged from the resolved spec a job re-reads.
ONE_LINE_TEXT = r"^[^\x00-\x1f\x7f-\x9f" + "\u2028\u2029" + r"]*$"
#: Annotation values may span lines (Kubernetes allows any text); NUL and YAML's extra line breaks are refused.
ANNOTATION_TEXT = r"^[^\x00\x85" + "\u2028\u2029" + r"]*$"
#: A commit or revision as GitOps tools record it (a SHA, `main@sha1:<sha>`): it becomes a container variable.
GIT_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$"

#: Pseudo-filesystems: reading them yields the process environment, kernel state or devices, never run data.
PSEUDO_DIRS = ("/proc", "/sys", "/dev")
#: The system's own directories: nothing of a run is written or mounted there.
SYSTEM_DIRS = (*PSEUDO_DIRS, "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/run", "/var/run")
#: The trainer image's writable directories besides /tmp and /runs (Dockerfile: HOME, the caches under /scratch);
#: the trainer pod mounts an emptyDir on each, its root filesystem being read-only (longhaul.render.kubernetes).
TRAINER_HOME = "/home/longhaul"
TRAINER_SCRATCH = "/scratch"
#: Directories the trainer pod mounts itself: a checkpoint volume cannot go there.
POD_OWN_MOUNTS = ("/tmp", TRAINER_HOME, TRAINER_SCRATCH)


def _path_problem(value: str, *, write: bool) -> str | None:
    """Why a path from the spec is refused (None: fine). Paths reach argv, sbatch lines, mounts and the run
    directory: an option in disguise, an unexpanded `~`, a climb out with `..` or a system directory are refused."""
    if value.startswith("-"):
        return f"starts with '-', which a command would read as an option; write ./{value} for a relative path"
    if value.startswith("~"):
        return "'~' is not expanded (paths are passed quoted, never through a shell); write the full path"
    if any(len(part.encode()) > 255 for part in value.split("/")):
        return "has a path component longer than 255 bytes, which no filesystem stores"
    if ".." in value.split("/"):
        return (
            "'..' is not allowed: name the directory itself (a path in a spec must not climb out of the "
            "submit, working or run directory)"
        )
    if value.startswith("/"):
        norm = posixpath.normpath(re.sub("/+", "/", value))
        if write and norm == "/":
            return "is the root directory; name a directory of its own"
        for d in SYSTEM_DIRS if write else PSEUDO_DIRS:
            if norm == d or norm.startswith(d + "/"):
                why = (
                    "nothing of a run is written or mounted there"
                    if write
                    else "it holds the process environment, kernel state and devices, not data"
                )
                return f"is inside {d}, a system directory: {why}"
    return None


def write_path_problem(value: str) -> str | None:
    """Why `value` cannot be a directory a run writes into (None: it can) — the rules of the spec's `output_dir`
    fields, for paths given elsewhere (`--run-dir`): its characters, its length and `_path_problem`."""
    if len(value) > 1024:
        return "is longer than 1024 characters"
    if not re.fullmatch(SAFE_PATH, value):
        return (
            "contains characters or a form that is not allowed: letters, digits and _ . / ~ + - @ = , only (no "
            "spaces, quotes, '$' or control characters), not starting with '@', '=' or ','"
        )
    return _path_problem(value, write=True)


def _read_path(value: str) -> str:
    problem = _path_problem(value, write=False)
    if problem:
        raise ValueError(problem)
    return value


def _write_path(value: str) -> str:
    problem = _path_problem(value, write=True)
    if problem:
        raise ValueError(problem)
    return value


def _mount_path(value: str) -> str:
    _write_path(value)
    if not value.startswith("/"):
        raise ValueError("a mount path inside the pod must be absolute (start with /)")
    norm = posixpath.normpath(re.sub("/+", "/", value))
    for d in POD_OWN_MOUNTS:
        if norm == d or norm.startswith(d + "/") or d.startswith(norm + "/"):
            raise ValueError(f"collides with {d}, which the trainer pod mounts itself; use e.g. /checkpoints")
    return value


def _bind(value: str) -> str:
    """SRC[:DST[:OPTS]] of apptainer -B / pyxis --container-mounts."""
    if "," in value:
        raise ValueError(
            "',' separates mounts in apptainer -B and pyxis --container-mounts: give each mount its own entry"
        )
    src, *rest = value.split(":")
    for part, what in ((src, "source"), *([(rest[0], "destination")] if rest else [])):
        problem = (
            _path_problem(part, write=False)
            if what == "destination" or part != "/"
            else "is the host's root directory; bind the directories the job needs"
        )
        if what == "source" and problem and problem.startswith("is inside"):
            problem = None  # host devices and system files are bound on purpose (/dev/infiniband, /etc/slurm)
        if problem:
            raise ValueError(f"bind {what} {part!r} {problem}")
    if rest and (not rest[0].startswith("/") or posixpath.normpath(rest[0]) == "/"):
        raise ValueError(f"bind destination {rest[0]!r} must be an absolute directory inside the container, not /")
    return value


def _url(value: str) -> str:
    try:
        netloc = urlsplit(value).netloc
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if "@" in netloc:
        raise ValueError(
            "credentials in the URL would be written in plain text into rendered manifests, the "
            "resolved spec and logs; keep them in a Secret (spec.tracking.uri_secret, "
            "user_simulator.api_key_secret) or in MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD"
        )
    if "$(" in value:
        raise ValueError("'$(' would be expanded by Kubernetes in the container's environment; write '$' as %24")
    return value


SafeToken = Annotated[str, Field(pattern=SAFE_TOKEN, max_length=128)]
#: A path that is read (models, datasets, images, virtualenvs).
SafePath = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(_read_path)]
#: A directory that is written (run outputs).
WritePath = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(_write_path)]
#: One word of a command line (options allowed).
ArgvWord = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024)]
Url = Annotated[str, Field(pattern=URL, max_length=2048), AfterValidator(_url)]
ModelName = Annotated[str, Field(pattern=MODEL_NAME, max_length=256)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
#: Kubernetes qualified name (label keys, toleration keys): optional DNS prefix + '/' + name.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QualifiedName = Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=316)]
K8sLabelValue = Annotated[str, Field(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]


class FieldError(ValueError):
    """A cross-field error that names the offending field (relative dotted path) for precise reports."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", use_enum_values=False, validate_default=True, allow_inf_nan=False
    )


# ---------------------------------------------------------------------------------------------------------
# Enums (registries by name, never import paths)


class Stage(StrEnum):
    SFT = "sft"
    GRPO = "grpo"
    EVAL = "eval"


class DType(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class AttnImplementation(StrEnum):
    FLASH_ATTENTION_2 = "flash_attention_2"
    SDPA = "sdpa"
    EAGER = "eager"


class Quantization(StrEnum):
    NONE = "none"
    AWQ = "awq"
    AWQ_MARLIN = "awq_marlin"
    GPTQ = "gptq"
    FP8 = "fp8"


class Placement(StrEnum):
    COLOCATED = "colocated"
    EXTERNAL = "external"


class GpuShare(StrEnum):
    SHARED = "shared"
    DEDICATED = "dedicated"


class SplitPreset(StrEnum):
    SEED_40_10 = "seed_40_10"
    TAU2_OFFICIAL = "tau2_official"
    EXPLICIT = "explicit"


class ProcessReward(StrEnum):
    NONE = "none"
    PRM_LITE = "prm_lite"


class Credit(StrEnum):
    TRAJECTORY = "trajectory"
    TURN = "turn"


class Advantage(StrEnum):
    GRPO = "grpo"
    TURN_DISCOUNT = "turn_discount"
    LATA = "lata"
    LATA_TURN_DISCOUNT = "lata_turn_discount"


class DiscountUnit(StrEnum):
    TOKEN = "token"
    TURN = "turn"


class LossAggMode(StrEnum):
    TOKEN_MEAN = "token-mean"
    TOKEN_SUM = "token-sum"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


class KLType(StrEnum):
    KL = "kl"
    ABS = "abs"
    MSE = "mse"
    LOW_VAR_KL = "low_var_kl"
    FULL = "full"


class SubsetName(StrEnum):
    TRAIN = "train"
    TEST = "test"
    COVERED_SEEN = "covered_seen"
    UNCOVERED_SEEN = "uncovered_seen"
    UNSEEN = "unseen"


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


class ThinkingMode(StrEnum):
    DISABLED = "disabled"
    KEEP = "keep"
    STRIP = "strip"


#: Policy models whose chat template has a thinking mode (`<think>` blocks, `enable_thinking`): the Qwen3 hybrid
#: release (`Qwen/Qwen3-8B`, `…/tiny-qwen3-policy`), read from `policy.model.name`. The 2507 Instruct / Thinking
#: releases (one mode only) and later families (Qwen3.5) have other templates and are not matched.
THINKING_MODEL_NAME = re.compile(r"(?i)(^|[/-])qwen3-(?!.*2507)")


def model_thinks(model_name: str) -> bool:
    """Whether a policy model's chat template has Qwen3's hybrid thinking mode (by its name)."""
    return bool(THINKING_MODEL_NAME.search(model_name))


# ---------------------------------------------------------------------------------------------------------
# Metadata


class Metadata(_Model):
    """Kubernetes object metadata. Only `name` is used to derive the run name."""

    name: str = Field(
        description=f"Experiment name: a DNS-1123 label of at most {MAX_NAME_LEN} characters "
        "(the run name appends '-' and 8 hex characters)."
    )
    namespace: str | None = Field(default=None, pattern=DNS1123_LABEL, max_length=63, description="Namespace.")
    labels: dict[QualifiedName, K8sLabelValue] = Field(
        default_factory=dict, description="Labels (not part of the run hash)."
    )
    annotations: dict[QualifiedName, Annotated[str, Field(pattern=ANNOTATION_TEXT)]] = Field(
        default_factory=dict,
        description="Annotations (not part of the run hash); `longhaul.dev/git-commit` records the specs "
        "repository commit set by GitOps tooling; `longhaul.dev/on-spec-change` (Kubernetes operator: `refuse`, "
        "the default, or `new-run`) says what a spec edit of an active run does: refused while the run goes on, "
        "or the run is stopped and the edited spec starts as a new run.",
    )

    @field_validator("name")
    @classmethod
    def _dns1123(cls, v: str) -> str:
        if len(v) > MAX_NAME_LEN:
            raise ValueError(f"must be at most {MAX_NAME_LEN} characters (got {len(v)})")
        if not is_dns1123_label(v):
            raise ValueError(
                "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
                "letter or digit"
            )
        return v

    @field_validator("annotations")
    @classmethod
    def _git_commit(cls, v: dict[str, str]) -> dict[str, str]:
        commit = v.get(ANNOTATION_GIT_COMMIT)
        if commit is not None and not re.fullmatch(GIT_REVISION, commit):
            raise FieldError(
                ANNOTATION_GIT_COMMIT,
                f"annotation {ANNOTATION_GIT_COMMIT} must be a commit as GitOps "
                "tools record it (e.g. 0123abc or main@sha1:0123abc): it becomes the job's "
                f"{ENV_GIT_COMMIT} variable and an MLflow tag",
            )
        return v

    @field_validator("annotations")
    @classmethod
    def _on_spec_change(cls, v: dict[str, str]) -> dict[str, str]:
        policy = v.get(ANNOTATION_ON_SPEC_CHANGE)
        if policy is not None and policy not in SPEC_CHANGE_POLICIES:
            raise FieldError(
                ANNOTATION_ON_SPEC_CHANGE,
                f"annotation {ANNOTATION_ON_SPEC_CHANGE}: {policy!r} is not a "
                f"policy; use {' or '.join(SPEC_CHANGE_POLICIES)} (absent: {SPEC_CHANGE_REFUSE})",
            )
        return v


# ---------------------------------------------------------------------------------------------------------
# Models and serving


class ModelRef(_Model):
    """A model baked into the image (resolved offline by name through HF_HOME, or by `path`)."""

    name: ModelName = Field(description="Hugging Face repository id, e.g. Qwen/Qwen2.5-7B-Instruct.")
    revision: str | None = Field(
        default=None,
        pattern=REVISION,
        max_length=128,
        description="Pinned revision (40-hex commit or a version tag) baked into the image; null = as baked.",
    )
    path: SafePath | None = Field(
        default=None, description="Local directory of the model; null = resolve `name` in HF_HOME offline."
    )


class Sampling(_Model):
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_tokens: Tokens | None = Field(
        default=None, description="Per-call token cap; null = environment.max_tokens_per_turn."
    )


class RolloutSpec(_Model):
    """The policy's vLLM rollout engine inside the trainer (and the policy server used for evaluation)."""

    engine: Literal["vllm"] = Field(default="vllm", description="Rollout engine (veRL server mode).")
    tensor_parallel_size: TensorParallel = Field(default=1, description="Tensor-parallel size of the policy engine.")
    gpu_memory_utilization: Fraction = Field(default=0.45, description="vLLM memory fraction per GPU.")
    max_model_len: Tokens = Field(default=24576, description="Maximum context length of the policy engine.")
    max_num_seqs: Seqs = Field(default=12, description="Maximum concurrent sequences.")
    max_num_batched_tokens: Tokens = Field(default=24576, description="Maximum batched tokens per step.")
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs.")
    free_cache_engine: bool = Field(
        default=True,
        description="Put the engine to sleep while the trainer runs (veRL's rollout.free_cache_engine): its KV cache "
        "and weights leave the GPU. false keeps its whole gpu_memory_utilization share during training (faster "
        "switches, less room for the update; `longhaul plan` counts it).",
    )
    train: Sampling = Field(default_factory=Sampling, description="Sampling for training rollouts.")
    validation: Sampling = Field(
        default_factory=Sampling, description="Sampling for validation and evaluation rollouts (same everywhere)."
    )


class LoraSpec(_Model):
    rank: int = Field(default=16, ge=0, le=MAX_LORA_RANK, description="LoRA rank; 0 = full fine-tuning.")
    alpha: int = Field(default=32, ge=1, le=MAX_LORA_ALPHA, description="LoRA alpha.")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout (SFT stage).")
    target_modules: Literal["all-linear"] | list[SafeToken] = Field(
        default="all-linear", description="Modules that receive adapters."
    )


class PolicySpec(_Model):
    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-7B-Instruct"), description="Policy model."
    )
    dtype: DType = Field(default=DType.BFLOAT16, description="Training and serving dtype.")
    attn_implementation: AttnImplementation = Field(
        default=AttnImplementation.FLASH_ATTENTION_2, description="Attention implementation of the trainer."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters (rank 0 = full fine-tuning).")
    gradient_checkpointing: bool = Field(default=True, description="Activation checkpointing in the actor.")
    use_fused_kernels: bool = Field(default=True, description="veRL fused log-prob kernels (no full logits).")
    param_offload: bool = Field(default=True, description="FSDP parameter offload.")
    optimizer_offload: bool = Field(default=True, description="FSDP optimizer offload.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout engine settings.")
    thinking: ThinkingMode = Field(
        default=ThinkingMode.DISABLED,
        description="Reasoning (`<think>`) blocks of a Qwen3 hybrid-thinking policy, the same in training, "
        "evaluation and SFT. disabled: every generation prompt opens with an empty think block "
        "(`enable_thinking=false`) and every assistant turn is rendered with it, so the policy answers without "
        "thinking; the only value for models without a thinking mode (e.g. Qwen2.5), where it changes nothing. "
        "keep: the policy thinks, and every earlier turn's think block stays in its context verbatim (as "
        "token-in/token-out training keeps it; evaluation and SFT render it with longhaul's Qwen3 template), "
        "and SFT labels include the think blocks. strip: Qwen3's own multi-turn rendering, which drops earlier "
        "turns' think blocks; then a turn's context is not a prefix of the conversation that follows it, so "
        "training, evaluation and SFT masks cannot agree: evaluation-only specs (stages: [eval]). Default "
        "disabled: it is valid for every model, keeps the response budget for tool calls (the airline tools "
        "include `think` for explicit reasoning) and keeps runs comparable with non-thinking policies. A Qwen3 "
        "policy is recognised by its model name (`Qwen/Qwen3-8B`, `org/qwen3-8b-agent`; not the 2507 releases).",
    )

    @model_validator(mode="after")
    def _thinking(self) -> PolicySpec:
        if self.thinking != ThinkingMode.DISABLED and not model_thinks(self.model.name):
            raise FieldError(
                "thinking",
                f"'{self.thinking}' needs a Qwen3 hybrid-thinking policy (a model name like "
                f"Qwen/Qwen3-8B); '{self.model.name}' has no thinking mode: use thinking: disabled",
            )
        return self


class SecretRef(_Model):
    name: SafeToken = Field(description="Kubernetes Secret name.")
    key: SafeToken = Field(description="Key inside the Secret.")


class SimulatorSpec(_Model):
    """The LLM user simulator (an OpenAI-compatible server)."""

    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-72B-Instruct-AWQ"), description="Simulator model."
    )
    quantization: Quantization = Field(default=Quantization.AWQ_MARLIN, description="vLLM quantization.")
    tensor_parallel_size: TensorParallel = Field(default=2, description="Tensor-parallel size of the simulator.")
    gpu_memory_utilization: Fraction = Field(default=0.4, description="vLLM memory fraction per GPU.")
    max_model_len: Tokens = Field(default=16384, description="Simulator context length.")
    max_num_seqs: Seqs = Field(default=8, description="Simulator concurrent sequences.")
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs in the simulator.")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(temperature=0.7, top_p=0.9, max_tokens=1024),
        description="Simulator sampling.",
    )
    placement: Placement = Field(
        default=Placement.COLOCATED,
        description="colocated: started inside the job; external: an existing server at `url`.",
    )
    gpu_share: GpuShare = Field(
        default=GpuShare.SHARED,
        description="colocated only. shared: the simulator shares GPUs 0..tp-1 with the trainer; "
        "dedicated: it gets its own GPUs and the trainer the rest.",
    )
    url: Url | None = Field(default=None, description="Base URL (…/v1) of an external server.")
    api_key_secret: SecretRef | None = Field(default=None, description="Secret holding the external server's key.")
    port: int = Field(default=8001, ge=1024, le=65535, description="Port of the colocated server.")
    startup_timeout_s: int = Field(
        default=1800, ge=1, le=MAX_STARTUP_S, description="Health-check timeout at start (seconds)."
    )

    @model_validator(mode="after")
    def _placement(self) -> SimulatorSpec:
        if self.placement == Placement.EXTERNAL and not self.url:
            raise FieldError("url", "placement 'external' needs `url` (the server's base URL, e.g. http://sim:8001/v1)")
        if self.placement == Placement.COLOCATED and self.url:
            raise FieldError(
                "url", "`url` is only used with placement 'external'; remove it or set placement: external"
            )
        return self


# ---------------------------------------------------------------------------------------------------------
# Environment

#: A task id of the (only) domain, airline: 0 … 49.
TaskId = Annotated[int, Field(ge=0, le=DOMAIN_TASKS["airline"] - 1)]


class SplitSpec(_Model):
    preset: SplitPreset = Field(
        default=SplitPreset.SEED_40_10,
        description="seed_40_10 (train 40 / test 10, covered_seen from the original teacher), "
        "tau2_official (τ²'s split file), or explicit (lists below).",
    )
    train: list[TaskId] | None = Field(default=None, description="explicit: train task ids.")
    test: list[TaskId] | None = Field(default=None, description="explicit: test task ids.")
    covered_seen: list[TaskId] | None = Field(
        default=None, description="explicit: train tasks covered by SFT data (optional)."
    )

    @model_validator(mode="after")
    def _explicit(self) -> SplitSpec:
        lists = {"train": self.train, "test": self.test, "covered_seen": self.covered_seen}
        if self.preset != SplitPreset.EXPLICIT:
            given = [k for k, v in lists.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply to preset 'explicit' (preset is '{self.preset}')")
            return self
        if not self.train or not self.test:
            raise FieldError(
                "train" if not self.train else "test", "preset 'explicit' needs non-empty `train` and `test` lists"
            )
        overlap = sorted(set(self.train) & set(self.test))
        if overlap:
            raise FieldError("test", f"train and test overlap on task ids {overlap}")
        for name, ids in lists.items():
            if ids is not None and len(set(ids)) != len(ids):
                raise FieldError(name, f"`{name}` has duplicate task ids")
        if self.covered_seen and not set(self.covered_seen) <= set(self.train):
            raise FieldError("covered_seen", "covered_seen must be a subset of train")
        return self


class EnvironmentSpec(_Model):
    """One horizon for training, validation and evaluation."""

    domain: Literal["airline"] = Field(default="airline", description="τ²-bench domain.")
    split: SplitSpec = Field(default_factory=SplitSpec, description="Task split.")
    max_turns: Turns = Field(default=30, description="Maximum assistant turns per episode.")
    max_tokens_per_turn: Tokens = Field(default=4096, description="Maximum generated tokens per assistant turn.")
    max_response_tokens: Tokens = Field(
        default=12288,
        description="Maximum tokens of the whole multi-turn response (assistant, tool and user tokens).",
    )
    max_prompt_tokens: Tokens = Field(
        default=8192, description="Maximum prompt tokens (system policy text, tool schemas, first user message)."
    )
    tool_output_limit: Annotated[int, Field(ge=1, le=MAX_TOOL_CHARS)] | None = Field(
        default=None, description="Maximum characters of a tool result shown to the policy; null = unlimited."
    )
    abort_repeated_calls: EpisodeEvents | None = Field(
        default=None,
        description="End the episode (reason 'loop') when the same call repeats this many times; null = never.",
    )
    transfer_ends_episode: bool = Field(
        default=False,
        description="τ-bench 1 semantics: a successful transfer_to_human_agents ends the episode (reason "
        "'transfer'). Default false = τ²: the transfer is an ordinary tool, the user simulator or the agent ends "
        "the episode, and later writes and messages count.",
    )
    max_tool_errors: EpisodeEvents | None = Field(
        default=TAU2_MAX_ERRORS,
        description="End the episode (reason 'too_many_errors', scored 0) once this many tool calls have returned "
        "an error, counted over the whole episode and checked after each assistant turn's calls; null = no limit. "
        "The default is τ²'s: tau2-bench a2c0247, tau2.config.DEFAULT_MAX_ERRORS, checked by "
        "Orchestrator._check_termination.",
    )
    date_line: str = Field(
        default="The current date is 2024-05-15 (Wednesday).",
        max_length=200,
        pattern=ONE_LINE_TEXT,
        description="Date grounding appended to the policy text in the system prompt.",
    )


# ---------------------------------------------------------------------------------------------------------
# Reward


class RewardSpec(_Model):
    outcome: Literal["binary"] = Field(default="binary", description="Outcome reward: 1 if graded success.")
    process: ProcessReward = Field(default=ProcessReward.NONE, description="Process reward added to the outcome.")
    weight: float = Field(default=0.3, ge=0.0, le=10.0, description="reward = outcome + weight × process.")
    credit: Credit = Field(
        default=Credit.TRAJECTORY,
        description="trajectory: one scalar per episode (the original); turn: each assistant turn's own "
        "process score reaches that turn's tokens.",
    )
    rules: RulesSpec = Field(
        default_factory=RulesSpec,
        description="Per-rule overrides of PRM-Lite weights/thresholds by rule name, e.g. "
        "{placeholder: {write_weight: -0.1}, length_penalty: {enabled: false}}.",
    )


# ---------------------------------------------------------------------------------------------------------
# Algorithm


class KLSpec(_Model):
    use_kl_loss: bool = Field(default=True, description="KL to the reference policy as a loss term.")
    coef: float = Field(default=0.01, ge=0.0, le=MAX_KL_COEF, description="KL loss coefficient.")
    type: KLType = Field(default=KLType.LOW_VAR_KL, description="KL estimator.")


class AlgorithmSpec(_Model):
    advantage: Advantage = Field(default=Advantage.GRPO, description="Advantage estimator.")
    alpha: float = Field(default=1.05, gt=0.0, le=2.0, description="Discount base of turn_discount / LATA.")
    discount_unit: DiscountUnit = Field(
        default=DiscountUnit.TURN,
        description="turn: α per assistant turn; token: α per absolute response position (the original).",
    )
    length_exponent: float = Field(default=0.5, ge=0.0, le=1.0, description="LATA: per-token advantage A / L^p.")
    loss_agg_mode: LossAggMode = Field(
        default=LossAggMode.SEQ_MEAN_TOKEN_MEAN,
        description="veRL loss aggregation; seq-mean-token-mean is GRPO's 1/L and LATA's exact A/√L.",
    )
    norm_adv_by_std: bool = Field(default=True, description="Divide group-centred rewards by the group std.")
    group_size: Annotated[int, Field(ge=2, le=MAX_GROUP)] = Field(default=8, description="Rollouts per task (GRPO n).")
    learning_rate: float = Field(default=5e-6, gt=0.0, lt=1.0, description="Actor learning rate.")
    kl: KLSpec = Field(default_factory=KLSpec, description="KL regularisation.")
    train_batch_size: Batch = Field(default=4, description="Tasks per training step.")
    ppo_mini_batch_size: Batch = Field(default=4, description="Tasks per optimizer step.")
    ppo_micro_batch_size_per_gpu: Batch = Field(default=2, description="Sequences per micro batch per GPU.")
    ppo_epochs: Epochs = Field(default=1, description="PPO epochs per batch.")
    clip_ratio: float = Field(default=0.2, gt=0.0, lt=1.0, description="PPO clip ratio.")
    total_steps: Steps = Field(default=300, description="Training steps.")
    save_freq: Steps = Field(default=50, description="Checkpoint every N steps.")
    test_freq: int = Field(default=50, ge=-1, le=MAX_STEPS, description="Validation every N steps (-1 = never).")
    seed: RandomSeed = Field(default=DEFAULT_SEED, description="Global seed of a run (data order, rollouts).")
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SEEDS,
        description="Training seeds as an axis: the Experiment becomes one run per seed, named `<run>-s<seed>`, "
        "each with `seed` set to it (Kubernetes: one stage chain per seed; Slurm: a job array; local: one after "
        "another; MLflow: one parent run with a child per seed). Omitted: one run with `seed`.",
    )
    seed_compat: bool = Field(
        default=False,
        description="Reproduce the original implementation exactly (token-position discount, A/√L with "
        "token-mean, PRM-Lite quirks). For reproduction only.",
    )

    @model_validator(mode="after")
    def _consistency(self) -> AlgorithmSpec:
        if self.seeds is not None:
            # `seed` at its default next to `seeds` is what a resolved spec (and the API server's CRD defaulting)
            # holds; any other value would be silently unused.
            if self.seed != DEFAULT_SEED:
                raise FieldError("seeds", "set seed (one run) or seeds (one run per seed), not both")
            if len(set(self.seeds)) != len(self.seeds):
                raise FieldError("seeds", f"seeds must be distinct (got {self.seeds})")
        if self.ppo_mini_batch_size > self.train_batch_size:
            raise FieldError(
                "ppo_mini_batch_size",
                f"ppo_mini_batch_size ({self.ppo_mini_batch_size}) must be ≤ train_batch_size "
                f"({self.train_batch_size})",
            )
        lata = self.advantage in (Advantage.LATA, Advantage.LATA_TURN_DISCOUNT)
        if self.seed_compat:
            if lata and self.loss_agg_mode != LossAggMode.TOKEN_MEAN:
                raise FieldError(
                    "loss_agg_mode",
                    "seed_compat LATA reproduces the original A/√L with token-mean: set loss_agg_mode: token-mean",
                )
            if self.advantage != Advantage.GRPO and self.discount_unit != DiscountUnit.TOKEN:
                raise FieldError(
                    "discount_unit", "seed_compat reproduces the original per-token discount: set discount_unit: token"
                )
        elif lata and self.loss_agg_mode != LossAggMode.SEQ_MEAN_TOKEN_MEAN:
            raise FieldError(
                "loss_agg_mode",
                f"advantage '{self.advantage}' returns A·√L and needs loss_agg_mode: seq-mean-token-mean to give "
                f"exactly A/√L per token (got '{self.loss_agg_mode}'); use seed_compat: true to reproduce "
                "the original token-mean variant",
            )
        return self


# ---------------------------------------------------------------------------------------------------------
# Stages: SFT and evaluation


class TeacherSpec(_Model):
    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-72B-Instruct-AWQ"), description="Teacher policy."
    )
    url: Url | None = Field(default=None, description="Teacher endpoint; null = the simulator server.")
    samples_per_task: Samples = Field(default=16, description="Best-of-N attempts per training task.")
    temperatures: list[Annotated[float, Field(ge=0.0, le=2.0)]] = Field(
        default_factory=lambda: [0.0] * 4 + [0.5] * 4 + [0.8] * 4 + [1.0] * 4,
        description="Temperature schedule, one per attempt (length = samples_per_task).",
    )
    max_tokens: Tokens = Field(default=768, description="Teacher tokens per turn.")

    @model_validator(mode="after")
    def _schedule(self) -> TeacherSpec:
        if len(self.temperatures) != self.samples_per_task:
            raise FieldError(
                "temperatures",
                f"temperatures has {len(self.temperatures)} entries but samples_per_task is {self.samples_per_task}",
            )
        return self


class SFTSpec(_Model):
    teacher: TeacherSpec = Field(default_factory=TeacherSpec, description="Trajectory collection.")
    dataset: SafePath | None = Field(default=None, description="Use an existing trajectories JSONL; skip collection.")
    learning_rate: float = Field(default=1e-4, gt=0.0, lt=1.0, description="SFT learning rate.")
    epochs: Epochs = Field(default=5, description="SFT epochs.")
    max_length: Tokens = Field(default=10240, description="Samples longer than this are dropped (never cut).")
    batch_size: Batch = Field(default=8, description="Global batch size.")
    micro_batch_size_per_gpu: Batch = Field(default=2, description="Micro batch per GPU.")
    min_label_tokens: Tokens = Field(default=5, description="Drop samples with fewer label tokens.")


class EvaluationSpec(_Model):
    checkpoints: list[Step] | Literal["all", "last"] = Field(
        default="all", description="Training steps to evaluate (0 = initial policy), 'all' saved, or 'last'."
    )
    samples_per_task: Samples = Field(default=8, description="Trials per task (n ≥ max k).")
    k: list[Samples] = Field(default_factory=lambda: [1, 2, 4], description="k values for pass^k and pass@k.")
    seeds: list[RandomSeed] = Field(
        default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS, description="Evaluation seeds."
    )
    select_on: SubsetName = Field(
        default=SubsetName.TRAIN, description="Subset that selects the best checkpoint (never 'test')."
    )
    bootstrap_samples: int = Field(default=1000, ge=1, le=MAX_BOOTSTRAP, description="Bootstrap resamples for CIs.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="CI level.")
    concurrency: Concurrency = Field(default=32, description="Episodes in flight.")

    @model_validator(mode="after")
    def _k(self) -> EvaluationSpec:
        if max(self.k, default=1) > self.samples_per_task:
            raise FieldError(
                "samples_per_task", f"samples_per_task ({self.samples_per_task}) must be ≥ max k ({max(self.k)})"
            )
        if self.select_on in (SubsetName.TEST, SubsetName.UNSEEN):
            raise FieldError(
                "select_on",
                f"select_on must not be '{self.select_on}': it holds the test tasks (unseen is the "
                "test split in every preset), and selecting on the reported subset biases it; use train, "
                "covered_seen or uncovered_seen",
            )
        return self


# ---------------------------------------------------------------------------------------------------------
# Tracking and resources


class TrackingSpec(_Model):
    uri: Url | None = Field(
        default=None,
        description="MLflow tracking URI; null = local sqlite store under the run directory (local backend).",
    )
    uri_secret: SecretRef | None = Field(default=None, description="Secret holding the tracking URI (Kubernetes).")
    experiment: SafeToken | None = Field(
        default=None, description="MLflow experiment; null = 'longhaul/<metadata.name>' (the spec family)."
    )
    tags: dict[SafeToken, Annotated[str, Field(max_length=500, pattern=ONE_LINE_TEXT)]] = Field(
        default_factory=dict, description="Extra MLflow tags."
    )
    early_stop_on_collapse: bool = Field(default=False, description="Stop training when the collapse watchdog fires.")
    training_traces_per_step: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Training episodes per step logged as MLflow traces when the grpo stage ends (the first in "
        "(group, sample) order; every evaluated episode is traced). 0 = none.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> TrackingSpec:
        if self.uri and self.uri_secret:
            raise FieldError("uri_secret", "set either `uri` or `uri_secret`, not both")
        return self


class ResourcesSpec(_Model):
    nodes: NodeCount = Field(default=1, description="Nodes (> 1 uses Ray across nodes).")
    gpus_per_node: int = Field(
        default=2, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs per node (0 = CPU-only smoke run)."
    )
    gpu_type: SafeToken | None = Field(default=None, description="GPU type for scheduling (e.g. a800, h100).")
    cpus_per_node: int = Field(default=16, ge=1, le=MAX_CPUS_PER_NODE, description="CPUs per node.")
    memory: Annotated[str, AfterValidator(check_quantity(minimum="1Gi"))] = Field(
        default="256Gi",
        pattern=QUANTITY,
        max_length=32,
        description="Memory per node (Kubernetes quantity), at least 1Gi (torch, Ray and vLLM must start).",
    )
    time_limit: Annotated[str, AfterValidator(check_time_limit)] = Field(
        default="3-00:00:00",
        pattern=TIME_LIMIT,
        max_length=32,
        description="Wall-clock limit, [D-]HH:MM:SS (both backends).",
    )
    shm_size: Annotated[str, AfterValidator(check_quantity(minimum="1Mi"))] = Field(
        default="32Gi", pattern=QUANTITY, max_length=32, description="/dev/shm size (NCCL, Ray), at least 1Mi."
    )


# ---------------------------------------------------------------------------------------------------------
# Backends


class Toleration(_Model):
    key: QualifiedName | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: K8sLabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class CheckpointVolume(_Model):
    claim_name: SafeToken = Field(description="PersistentVolumeClaim for checkpoints and run outputs.")
    mount_path: Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(_mount_path)] = Field(
        default="/checkpoints", description="Mount path in the pod (absolute)."
    )


class KubernetesSpec(_Model):
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
        return _read_path(value)
    if re.fullmatch(PYXIS_IMAGE, value) or re.fullmatch(APPTAINER_URI, value):
        return value
    raise ValueError(
        "not an image: give a path (/images/longhaul.sif), a pyxis reference ([USER@][REGISTRY#]IMAGE[:TAG], "
        "e.g. nvcr.io#nvidia/pytorch:24.01-py3) or an apptainer URI (docker://REGISTRY/IMAGE[:TAG])"
    )


class ContainerSpec(_Model):
    runtime: ContainerRuntime = Field(default=ContainerRuntime.APPTAINER, description="Container runtime.")
    image: Annotated[str, Field(max_length=1024), AfterValidator(_container_image)] | None = Field(
        default=None,
        description="apptainer: path of the .sif or docker://…; pyxis: [USER@][REGISTRY#]IMAGE[:TAG] or a squashfs; "
        "none: unused.",
    )
    binds: list[Annotated[str, Field(pattern=BIND, max_length=2048), AfterValidator(_bind)]] = Field(
        default_factory=list, description="Extra bind mounts (SRC[:DST[:OPTS]])."
    )


SetupLine = Annotated[str, Field(max_length=1000)]


class SlurmSpec(_Model):
    partition: SafeToken | None = Field(default=None, description="Partition (-p).")
    account: SafeToken | None = Field(default=None, description="Account (-A).")
    qos: SafeToken | None = Field(default=None, description="QOS (--qos).")
    container: ContainerSpec = Field(default_factory=ContainerSpec, description="How the job runs the image.")
    venv: SafePath | None = Field(default=None, description="runtime 'none': virtualenv to activate.")
    setup: list[SetupLine] = Field(
        default_factory=list,
        description="Shell lines run before the launcher (e.g. 'module load cuda/12.4'); one command per line.",
    )
    output_dir: WritePath = Field(default="runs", description="Run outputs (relative to the submit directory).")
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


class LocalSpec(_Model):
    output_dir: WritePath = Field(default="runs", description="Run outputs (relative to the working directory).")
    policy_server_cmd: list[ArgvWord] | None = Field(
        default=None, description="argv prefix that starts an OpenAI-compatible server (CPU vLLM)."
    )
    policy_port: int = Field(default=8000, ge=1024, le=65535, description="Port of the local policy server.")


class BackendsSpec(_Model):
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec, description="Kubernetes Job settings.")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="Slurm batch settings.")
    local: LocalSpec = Field(default_factory=LocalSpec, description="Local run settings.")


# ---------------------------------------------------------------------------------------------------------
# The spec


class ExperimentSpec(_Model):
    """What to train, how, on what, and where."""

    stages: list[Stage] = Field(
        default_factory=lambda: [Stage.GRPO, Stage.EVAL], description="Stages, run in order: sft, grpo, eval."
    )
    policy: PolicySpec = Field(default_factory=PolicySpec, description="The trained policy.")
    user_simulator: SimulatorSpec = Field(default_factory=SimulatorSpec, description="The LLM user simulator.")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec, description="Tasks and horizon.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="Outcome and process reward.")
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="GRPO and its variants.")
    sft: SFTSpec | None = Field(default=None, description="SFT warm start (needed when stages include sft).")
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec, description="pass^k evaluation.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="MLflow.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Compute per job.")
    backends: BackendsSpec = Field(default_factory=BackendsSpec, description="Backend-specific settings.")

    @model_validator(mode="after")
    def _cross_field(self) -> ExperimentSpec:
        order = [Stage.SFT, Stage.GRPO, Stage.EVAL]
        if not self.stages:
            raise FieldError("stages", "stages: at least one of sft, grpo, eval")
        if len(set(self.stages)) != len(self.stages) or self.stages != sorted(self.stages, key=order.index):
            raise FieldError(
                "stages",
                f"stages must be distinct and in the order sft, grpo, eval (got {[str(s) for s in self.stages]})",
            )
        if Stage.SFT in self.stages and self.sft is None:
            raise FieldError("sft", "stages include 'sft' but the `sft` section is missing")
        trains = [str(s) for s in self.stages if s in (Stage.SFT, Stage.GRPO)]
        if self.policy.thinking == ThinkingMode.STRIP and trains:
            raise FieldError(
                "policy.thinking",
                f"'strip' cannot train (stages include {', '.join(trains)}): it re-renders earlier "
                "turns without their <think> blocks, so the context a turn was generated from is not a prefix of "
                "the training sequence (token-in/token-out rollouts and Render-Twice-Diff SFT masks need that) and "
                "evaluation would see other contexts than training; use keep or disabled (strip is for "
                "evaluation-only specs, stages: [eval])",
            )
        if self.algorithm.seed_compat and self.reward.credit == Credit.TURN:
            raise FieldError(
                "reward.credit",
                "seed_compat reproduces the original, which had no per-turn credit (its PRM-Lite score "
                "was one scalar per trajectory): set credit: trajectory, or seed_compat: false",
            )
        self._check_gpus()
        return self

    def _check_cpu_platform(self) -> None:
        """gpus_per_node: 0 runs veRL on its CPU platform (longhaul.verlcpu): one trainer rank per node (gloo
        across nodes when nodes > 1), veRL's vLLM rollout on vLLM's CPU build (no tensor parallelism, no
        chunked prefill; LoRA adapters are synced to it as on a GPU)."""
        if self.policy.rollout.tensor_parallel_size != 1:
            raise FieldError(
                "policy.rollout.tensor_parallel_size",
                "a CPU run (resources.gpus_per_node: 0) needs "
                f"policy.rollout.tensor_parallel_size: 1 (got {self.policy.rollout.tensor_parallel_size})",
            )
        roll = self.policy.rollout
        if roll.max_num_batched_tokens < roll.max_model_len:
            raise FieldError(
                "policy.rollout.max_num_batched_tokens",
                "a CPU run (resources.gpus_per_node: 0) prefills without chunking (vLLM-CPU), so one batch must "
                f"hold the longest context: set policy.rollout.max_num_batched_tokens >= max_model_len "
                f"({roll.max_model_len}; got {roll.max_num_batched_tokens})",
            )

    def _check_gpus(self) -> None:
        res, sim, roll = self.resources, self.user_simulator, self.policy.rollout
        gpus = res.gpus_per_node
        if gpus == 0:
            self._check_cpu_platform()
            self._check_rollouts_divide(res.nodes, "CPU trainer rank(s), one per node")
            self._check_micro_batches(world=res.nodes)
            return
        trainer_gpus = gpus
        if sim.placement == Placement.COLOCATED:
            if sim.tensor_parallel_size > gpus:
                raise FieldError(
                    "user_simulator.tensor_parallel_size",
                    f"user_simulator.tensor_parallel_size ({sim.tensor_parallel_size}) exceeds "
                    f"resources.gpus_per_node ({gpus})",
                )
            if sim.gpu_share == GpuShare.DEDICATED:
                trainer_gpus = gpus - sim.tensor_parallel_size
                if trainer_gpus < 1:
                    raise FieldError(
                        "user_simulator.gpu_share",
                        f"a dedicated simulator with tensor_parallel_size {sim.tensor_parallel_size} leaves "
                        f"{trainer_gpus} of {gpus} GPUs for the trainer; use gpu_share: shared or more GPUs",
                    )
            else:
                total = sim.gpu_memory_utilization + roll.gpu_memory_utilization
                # The actor's FSDP shards, activations and the reference model need the rest of the GPU.
                if total > 0.9:
                    raise FieldError(
                        "user_simulator.gpu_memory_utilization",
                        f"GPUs 0..{sim.tensor_parallel_size - 1} are shared: simulator "
                        f"{sim.gpu_memory_utilization} + policy rollout {roll.gpu_memory_utilization} = "
                        f"{total:.2f} of each GPU's memory, above 0.90 (the trainer needs the rest); lower "
                        "one of them or use gpu_share: dedicated",
                    )
        if roll.tensor_parallel_size > trainer_gpus:
            raise FieldError(
                "policy.rollout.tensor_parallel_size",
                f"policy.rollout.tensor_parallel_size ({roll.tensor_parallel_size}) exceeds the "
                f"{trainer_gpus} GPU(s) available to the trainer",
            )
        world = trainer_gpus * res.nodes
        self._check_rollouts_divide(world, "GPU(s)")
        self._check_micro_batches(world)

    def _check_rollouts_divide(self, world: int, ranks: str) -> None:
        """veRL splits each step's rollouts evenly over the trainer's ranks."""
        rollouts = self.algorithm.train_batch_size * self.algorithm.group_size
        if rollouts % world:
            raise FieldError(
                "algorithm.train_batch_size",
                f"train_batch_size × group_size = {rollouts} rollouts must be divisible by the trainer's "
                f"{world} {ranks}",
            )

    def _check_micro_batches(self, world: int) -> None:
        """veRL splits each rank's share of a mini-batch (ppo_mini_batch_size × group_size / ranks sequences) into
        micro-batches of ppo_micro_batch_size_per_gpu and fails at the first update, after a whole rollout, when
        that does not divide evenly: refuse it here instead."""
        alg = self.algorithm
        per_rank, rest = divmod(alg.ppo_mini_batch_size * alg.group_size, world)
        if rest or per_rank % alg.ppo_micro_batch_size_per_gpu:
            raise FieldError(
                "algorithm.ppo_micro_batch_size_per_gpu",
                f"each of the trainer's {world} rank(s) gets ppo_mini_batch_size × group_size / {world} = "
                f"{alg.ppo_mini_batch_size * alg.group_size / world:g} sequences per mini-batch, which veRL cannot split "  # noqa: E501 - a string literal kept whole
                f"into micro-batches of {alg.ppo_micro_batch_size_per_gpu}; use a ppo_micro_batch_size_per_gpu that divides it",  # noqa: E501 - a string literal kept whole
            )


class Experiment(_Model):
    """An Experiment custom resource (`apiVersion: longhaul.dev/v1alpha1`, `kind: Experiment`)."""

    apiVersion: Literal["longhaul.dev/v1alpha1"] = Field(description=f"Always {API_GROUP}/{API_VERSION}.")
    kind: Literal["Experiment"] = Field(description=f"Always {KIND}.")
    metadata: Metadata = Field(description="Object metadata.")
    spec: ExperimentSpec = Field(default_factory=ExperimentSpec, description="The experiment.")

    @model_validator(mode="after")
    def _seed_names(self) -> Experiment:
        seeds = self.spec.algorithm.seeds
        group = self.metadata.annotations.get(ANNOTATION_SEED_GROUP)
        if group is not None:
            if seeds is not None:
                raise FieldError(
                    "spec.algorithm.seeds",
                    f"a seed run (annotation {ANNOTATION_SEED_GROUP}) has one seed: "
                    "remove spec.algorithm.seeds (the annotation is set by longhaul when it expands seeds)",
                )
            if not re.fullmatch(re.escape(self.metadata.name) + r"-[0-9a-f]{8}", group):
                raise FieldError(
                    "metadata.annotations",
                    f"annotation {ANNOTATION_SEED_GROUP}: {group!r} is not "
                    f"'{self.metadata.name}-<8 hex>'; it is set by longhaul when it expands seeds: remove it",
                )
        group_seeds = self.metadata.annotations.get(ANNOTATION_SEED_GROUP_SEEDS)
        if (group is None) != (group_seeds is None) or (
            group_seeds is not None and self.spec.algorithm.seed not in parse_seed_list(group_seeds)
        ):
            raise FieldError(
                "metadata.annotations",
                f"annotations {ANNOTATION_SEED_GROUP} and {ANNOTATION_SEED_GROUP_SEEDS} are set by longhaul, "
                "together, when it expands spec.algorithm.seeds (the seeds list this run's seed): remove them",
            )
        if seeds:
            longest = len(self.metadata.name) + 9 + len(f"-s{max(seeds)}")
            if longest > MAX_NAME_LEN + 9:
                raise FieldError(
                    "metadata.name",
                    f"with seeds up to {max(seeds)} the run names '<name>-<8 hex>-s<seed>' "
                    f"reach {longest} characters; shorten metadata.name to at most "
                    f"{MAX_NAME_LEN - len(f'-s{max(seeds)}')} characters",
                )
        return self

    @model_validator(mode="after")
    def _rereadable(self) -> Experiment:
        """Every job, the launcher and the operator re-read the resolved spec (defaults filled in) under the bounds
        of any spec file (`longhaul.bounded.SPEC`): refuse now what they would refuse then."""
        from longhaul import bounded

        doc = self.model_dump(mode="json")
        try:
            bounded.check_data(doc, "", bounded.SPEC)
        except bounded.InputError as exc:
            verb = "has" if exc.message.startswith("more than") else "is"
            raise FieldError(
                exc.path or "spec",
                f"with its defaults filled in (the form every job and the operator "
                f"re-read), the spec {verb} {exc.message.removeprefix('nested ')}; {exc.hint}",
            ) from None
        limit = bounded.SPEC.max_bytes
        # The JSON form bounds the YAML one well enough to skip dumping YAML for every spec of normal size.
        if len(json.dumps(doc, ensure_ascii=False).encode()) > limit // 2:
            from longhaul.spec.naming import resolved_yaml

            size = len(resolved_yaml(self).encode())
            if size > limit:
                path, longest = _longest_string(doc)
                raise FieldError(
                    path,
                    f"the resolved spec (defaults filled in), which every job and the operator "
                    f"re-read, would be {size:,} bytes, above the {limit // 1024} KiB limit of a spec; "
                    f"{path} alone is {longest:,} characters: shorten it",
                )
        return self


def _longest_string(doc: object, path: str = "") -> tuple[str, int]:
    """The dotted path and length of the longest string (key or value) in a JSON-like document."""
    best = (path, len(doc) if isinstance(doc, str) else 0)
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        sub = f"{path}.{k}" if path else str(k)
        cand = (sub, len(k)) if isinstance(k, str) else (sub, 0)
        for c in (cand, _longest_string(v, sub)):
            if c[1] > best[1]:
                best = c
    return best
