"""The actor update in a memory plan (pure): its rows, notes and hints, shared by the CPU and the GPU plan."""

from __future__ import annotations

from longhaul.memory.estimate import TrainerEstimate
from longhaul.memory.plan_values import Row, gib
from longhaul.memory.shapes import format_count
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name


def trainer_rows(t: TrainerEstimate, columns: int, on: list[bool], exp: Experiment) -> list[Row]:
    """The actor-update rows, for the columns where `on` is true."""
    pol = exp.spec.policy

    def row(label: str, value: int, counted: bool = True) -> Row:
        return Row(label, tuple(value if on[i] else 0 for i in range(columns)), counted)

    master = f"fp{8 * t.master_size}"
    gc = "checkpointing on" if pol.gradient_checkpointing else "checkpointing off"
    rows = [
        row(f"actor parameters ({master}, {format_count(t.total_params)} / {t.world})", t.params),
        row(f"actor gradients ({master}, {format_count(t.trainable)} trainable / {t.world})", t.grads),
        row(f"actor AdamW states (2 × {master} / {t.world})", t.optimizer),
    ]
    if t.gathered:
        rows.append(row("FSDP all-gather (root unit + 2 blocks)", t.gathered))
    rows.append(row(f"activations ({t.seqs} × {t.seq_len:,} tokens, {gc})", t.activations))
    if t.attention_scores:
        rows.append(row("attention scores (eager attention)", t.attention_scores))
    rows.append(
        row("logits (fused kernels: chunked)" if pol.use_fused_kernels else "logits (full, fp32 log-softmax)", t.logits)
    )
    if t.separate_reference:
        rows.append(row("reference log-prob step (before the update; not summed)", t.reference_step, counted=False))
    elif exp.spec.algorithm.kl.use_kl_loss:
        rows.append(row("reference: the actor with adapters off", 0))
    return rows


def gc_note(exp: Experiment, t: TrainerEstimate, where: str) -> str:
    """What the activations would be with gradient checkpointing flipped."""
    other = "without" if exp.spec.policy.gradient_checkpointing else "with"
    return f"{other} gradient checkpointing the activations would be {gib(t.activations_other)} GiB {where}"


def plan_title(exp: Experiment) -> str:
    """The plan's first line: the experiment, its run name and the unit."""
    return f"memory plan for {exp.metadata.name} (run {run_name(exp)}); estimates in GiB (2^30 bytes)"


def training_hint(exp: Experiment, t: TrainerEstimate) -> str:
    """The fields that shrink the actor update, most effective first."""
    pol = exp.spec.policy
    hints = []
    if not pol.gradient_checkpointing:
        hints.append(
            f"turn on policy.gradient_checkpointing (activations {gib(t.activations)} → {gib(t.activations_other)} GiB)"
        )
    if not pol.use_fused_kernels and t.logits:
        hints.append(f"turn on policy.use_fused_kernels (logits {gib(t.logits)} GiB)")
    hints.append("lower algorithm.ppo_micro_batch_size_per_gpu or environment.max_prompt_tokens/max_response_tokens")
    if pol.lora.rank == 0:
        hints.append("train LoRA adapters (policy.lora.rank)")
    return "; ".join(hints)
