"""`spec.algorithm`: GRPO and its variants (advantage estimators, discounting, loss aggregation, KL), batch sizes,
steps and the training seeds."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import MAX_GROUP, MAX_KL_COEF, MAX_STEPS, Batch, Epochs, RandomSeed, Steps
from longhaul.spec.seeds import MAX_SEED, MAX_SEEDS
from longhaul.spec.trainer_mode import TrainerSpec, check_parameter_sync

#: The seed of a run that names none.
DEFAULT_SEED = 42


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


class KLSpec(SpecModel):
    use_kl_loss: bool = Field(default=True, description="KL to the reference policy as a loss term.")
    coef: float = Field(default=0.01, ge=0.0, le=MAX_KL_COEF, description="KL loss coefficient.")
    type: KLType = Field(default=KLType.LOW_VAR_KL, description="KL estimator.")


class AlgorithmSpec(SpecModel):
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
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec,
        # Left out of the resolved spec (and the spec hash) while at its defaults: specs that name no trainer mode
        # keep their run names.
        exclude_if=lambda t: t == TrainerSpec(),
        description="How rollout and training overlap: veRL's sync, colocate_async or separate_async trainer.",
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
        check_parameter_sync(self.trainer, self.train_batch_size, self.ppo_mini_batch_size)
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
