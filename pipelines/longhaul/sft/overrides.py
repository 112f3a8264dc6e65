"""The SFT stage as data: veRL SFT-trainer overrides and the argv of each step (pure).

The stage runs four steps in one job (`longhaul sft run` executes them in order; renderers may also use
`render_sft_steps` directly):

1. collect        teacher trajectories over the training tasks (skipped when `spec.sft.dataset` is given)
2. build-dataset  Render-Twice-Diff rows → parquet (drops counted, never truncated)
3. train          `torchrun -m verl.trainer.sft_trainer` with `render_sft_overrides` (veRL 0.9.1,
                  config `sft_trainer_engine`, FSDP engine, LoRA from `spec.policy.lora`)
4. export         the last checkpoint → a plain Hugging Face model at `<run_dir>/sft/model` (LoRA merged), the
                  GRPO stage's initial policy (`longhaul.render.verl.policy_model_path`)

Its files are `longhaul.layout.SFTPaths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longhaul.layout import Paths
from longhaul.render.verl import fsdp_mixed_precision
from longhaul.render.verl import hydra_quote as _q
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name

#: veRL's SFT entry point and its Hydra config name (verl/trainer/config/sft_trainer_engine.yaml).
SFT_MODULE = "verl.trainer.sft_trainer"
SFT_CONFIG_NAME = "sft_trainer_engine"
#: The dataset class veRL loads through `data.custom_cls` (pre-tokenized ids + loss mask, no re-rendering).
DATASET_CLS_PATH = "pkg://longhaul.sft.verl_dataset"
DATASET_CLS_NAME = "RenderTwiceDiffDataset"


@dataclass(frozen=True)
class SFTStep:
    name: str
    argv: tuple[str, ...]


def base_model(exp: Experiment) -> str:
    """The model the SFT stage starts from (the spec's policy model)."""
    m = exp.spec.policy.model
    return m.path or m.name


def _sft(exp: Experiment) -> Any:
    if exp.spec.sft is None:
        raise ValueError("spec.sft is missing: stages include 'sft' but there is no `sft:` section")
    return exp.spec.sft


def _check_backend(exp: Experiment) -> None:
    res = exp.spec.resources
    if res.gpus_per_node == 0:
        raise ValueError(
            "the SFT stage runs veRL's FSDP SFT trainer, which needs GPUs; resources.gpus_per_node is 0 "
            "(remove 'sft' from spec.stages for a CPU run)"
        )
    if res.nodes != 1:
        raise ValueError(
            f"the SFT stage runs on one node (torchrun --standalone); resources.nodes is {res.nodes}: "
            "run SFT as its own single-node spec and point spec.policy.model.path at its output"
        )


def render_sft_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """Hydra overrides for veRL 0.9.1's `sft_trainer_engine` config (pure)."""
    sft = _sft(exp)
    sp = paths.sft
    pol, res, lora = exp.spec.policy, exp.spec.resources, exp.spec.policy.lora
    targets = lora.target_modules if isinstance(lora.target_modules, str) else "[" + ",".join(lora.target_modules) + "]"
    gpus = max(1, res.gpus_per_node)
    # veRL needs train_batch_size divisible by micro batch × data-parallel size.
    per_step = sft.micro_batch_size_per_gpu * gpus
    if sft.batch_size % per_step:
        raise ValueError(
            f"sft.batch_size ({sft.batch_size}) must be divisible by sft.micro_batch_size_per_gpu × "
            f"resources.gpus_per_node ({sft.micro_batch_size_per_gpu} × {gpus} = {per_step})"
        )
    return [
        f"data.train_files={_q(sp.dataset)}",
        "data.val_files=null",
        f"data.custom_cls.path={_q(DATASET_CLS_PATH)}",
        f"data.custom_cls.name={DATASET_CLS_NAME}",
        "data.pad_mode=no_padding",
        "data.truncation=error",
        f"data.max_length={sft.max_length}",
        f"data.max_token_len_per_gpu={sft.max_length * sft.micro_batch_size_per_gpu}",
        "data.use_dynamic_bsz=false",
        f"data.train_batch_size={sft.batch_size}",
        f"data.micro_batch_size_per_gpu={sft.micro_batch_size_per_gpu}",
        f"model.path={_q(base_model(exp))}",
        f"model.lora_rank={lora.rank}",
        f"model.lora_alpha={lora.alpha}",
        f"model.target_modules={targets}",
        f"model.enable_gradient_checkpointing={'true' if pol.gradient_checkpointing else 'false'}",
        f"engine.param_offload={'true' if pol.param_offload else 'false'}",
        f"engine.optimizer_offload={'true' if pol.optimizer_offload else 'false'}",
        f"+engine.mixed_precision={fsdp_mixed_precision(str(pol.dtype))}",
        f"engine.seed={exp.spec.algorithm.seed}",
        f"optim.lr={sft.learning_rate}",
        "optim.lr_scheduler_type=cosine",
        "optim.lr_warmup_steps_ratio=0.05",
        "optim.weight_decay=0.0",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        f"trainer.default_local_dir={_q(sp.checkpoints)}",
        f"trainer.project_name={_q('longhaul-' + exp.metadata.name)}",
        f"trainer.experiment_name={_q(run_name(exp) + '-sft')}",
        f"trainer.total_epochs={sft.epochs}",
        "trainer.logger=[console,mlflow]",
        f"trainer.seed={exp.spec.algorithm.seed}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.resume_mode=auto",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={gpus}",
        "trainer.device=cuda",
    ]


def render_sft_steps(exp: Experiment, paths: Paths) -> list[SFTStep]:
    """The argv of each SFT step, in order (pure). Server URLs come from the launcher's environment at run time
    (`LONGHAUL_SIMULATOR_BASE_URL`), so they are not part of the argv."""
    sft = _sft(exp)
    _check_backend(exp)
    sp = paths.sft
    common = ("--spec", sp.spec_file, "--run-dir", sp.run_dir)
    steps: list[SFTStep] = []
    trajectories = sft.dataset or sp.trajectories
    if sft.dataset is None:
        steps.append(SFTStep("collect", ("longhaul", "sft", "collect", *common, "--out", sp.trajectories)))
    steps.append(
        SFTStep(
            "build-dataset",
            (
                "longhaul",
                "sft",
                "build-dataset",
                trajectories,
                "--spec",
                sp.spec_file,
                "--tokenizer",
                base_model(exp),
                "--out",
                sp.dataset,
            ),
        )
    )
    steps.append(
        SFTStep(
            "train",
            (
                "torchrun",
                "--standalone",
                "--nnodes=1",
                f"--nproc_per_node={exp.spec.resources.gpus_per_node}",
                "-m",
                SFT_MODULE,
                *render_sft_overrides(exp, paths),
            ),
        )
    )
    steps.append(
        SFTStep(
            "export",
            (
                "longhaul",
                "sft",
                "export",
                "--checkpoints",
                sp.checkpoints,
                "--base-model",
                base_model(exp),
                "--out",
                sp.model,
            ),
        )
    )
    return steps
