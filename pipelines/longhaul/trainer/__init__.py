"""The single-process CPU trainer (`algorithm.trainer: single_process`).

veRL's distributed trainer needs GPUs (see the README). On CPU the GRPO update runs in ONE process with veRL's
own loss functions — `verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`, `agg_loss` and `kl_penalty`,
configured through veRL's `ActorConfig` — on the tiny policy. It exists to prove the math and the plumbing end to
end (rollouts → rewards → advantages → update → checkpoint → served weights), not to compete with veRL.

Checkpoints follow veRL's layout: `<checkpoint_dir>/global_step_N/` + `latest_checkpointed_iteration.txt`.
"""
