"""The `Experiment` custom resource: the single schema behind specs/, the CLI, the CRD and the launcher.

This module composes the sections (`longhaul.spec.policy`, `.simulator`, `.environment`, `.reward`, `.algorithm`,
`.sft`, `.evaluation`, `.tracking`, `.resources`, `.backends`, `.metadata`), each of which owns its defaults and
validators, and checks what spans sections. Every default lives in the module of its section (the stages' here)
and nowhere else. Models are frozen and forbid unknown keys. Field descriptions become the CRD's `kubectl explain`
text and the README's field reference, so write them for users.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from longhaul import bounded
from longhaul.constants import ANNOTATION_SEED_GROUP, ANNOTATION_SEED_GROUP_SEEDS, API_GROUP, API_VERSION, KIND
from longhaul.spec.algorithm import AlgorithmSpec
from longhaul.spec.backends import BackendsSpec
from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.environment import EnvironmentSpec
from longhaul.spec.evaluation import EvaluationSpec
from longhaul.spec.metadata import MAX_NAME_LEN, Metadata
from longhaul.spec.policy import PolicySpec, ThinkingMode
from longhaul.spec.resources import ResourcesSpec
from longhaul.spec.reward import Credit, RewardSpec
from longhaul.spec.seeds import parse_seed_list
from longhaul.spec.sft import SFTSpec
from longhaul.spec.simulator import GpuShare, Placement, SimulatorSpec
from longhaul.spec.tracking import TrackingSpec
from longhaul.spec.trainer_mode import check_trainer_devices, check_trainer_lora


class Stage(StrEnum):
    SFT = "sft"
    GRPO = "grpo"
    EVAL = "eval"


class ExperimentSpec(SpecModel):
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
        check_trainer_lora(self.algorithm.trainer, self.policy.lora.rank)
        if gpus == 0:
            check_trainer_devices(self.algorithm.trainer, gpus, gpus, roll.tensor_parallel_size)
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
        check_trainer_devices(self.algorithm.trainer, gpus, trainer_gpus, roll.tensor_parallel_size)
        trainer_gpus -= self.algorithm.trainer.rollout_gpus_per_node
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


class Experiment(SpecModel):
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


# ---------------------------------------------------------------------------------------------------------
# The resolved form: what defines a run (the spec hash's input, `longhaul.spec.naming`) and what jobs re-read.


def canonical_document(exp: Experiment) -> dict[str, Any]:
    """The resolved resource that defines a run: apiVersion, kind, metadata.name and the spec with defaults.

    Labels, annotations and namespace are left out on purpose: GitOps tooling may change them without
    making a new run.
    """
    return {
        "apiVersion": exp.apiVersion,
        "kind": exp.kind,
        "metadata": {"name": exp.metadata.name},
        "spec": exp.spec.model_dump(mode="json"),
    }


def resolved_yaml(exp: Experiment) -> str:
    """The resolved spec (all defaults filled) as YAML: what jobs mount and re-validate."""
    doc = canonical_document(exp)
    meta = exp.metadata.model_dump(mode="json", exclude_defaults=True)
    doc["metadata"] = meta
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
