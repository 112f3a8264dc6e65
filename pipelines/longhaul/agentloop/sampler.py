"""`LonghaulReplayBuffer`: veRL's sync v1 replay buffer, dropping every failed group whole and refilling it.

A trajectory that fails (`longhaul.agentloop.loop.TrajectoryFailed`: user simulator down after its retries, first
prompt over budget) makes veRL's worker mark its prompt group `failure`. veRL's own `ReplayBuffer` with
`sync_refill_failed_groups` replaces only failed groups that produced no trajectory at all; a group that lost one
of its n samples stays sampleable and GRPO computes its baseline from the survivors (a biased baseline). This
subclass evicts every failed training group, however many of its samples finished, refills each with a fresh
prompt, and reports per step:

* `rollout/dropped_groups`      failed groups evicted (and refilled) while the step's batch was gathered;
* `rollout/failed_trajectories` samples of those groups that failed (n minus the samples that finished).

veRL's own `training/rollout_failure/evicted_samples` (= dropped groups) is still logged beside them.

Why a subclass: veRL's v1 trainer has no other hook that sees group status (a failed sample produces no output,
so nothing reaches the reward or metric paths). It is plugged in with
`trainer.v1.sampler.custom_sampler.path=pkg://longhaul.agentloop.sampler` and `.name=LonghaulReplayBuffer`. veRL
passes a custom sampler only its generic arguments, so this class sets `sync_refill_failed_groups` and
`gen_batch_size=1` itself and takes its settings from `trainer.v1.sampler.sampler_kwargs`:

* `rollout_n` (required): the group size (`actor_rollout_ref.rollout.n`), to count failed samples;
* `max_failed_fraction` (optional, 0 < f < 1): stop training with an error when more than this fraction of the
  groups a step has finished failed — a simulator that is down for good must stop the run, not consume the
  dataset one refill at a time.

`trainer.v1.sampler.sync_refill_failed_groups=true` must be set as well: it is what makes veRL's dataloader fetch
one prompt at a time, which exact refills need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from longhaul import constants as C

DROPPED_GROUPS_METRIC = "rollout/dropped_groups"
FAILED_TRAJECTORIES_METRIC = "rollout/failed_trajectories"


def _options(sampler_kwargs: Any) -> dict[str, Any]:
    if isinstance(sampler_kwargs, DictConfig):
        return dict(OmegaConf.to_container(sampler_kwargs, resolve=True))
    return dict(sampler_kwargs or {})


def _uid(key: str) -> str:
    return key.split("_")[0]  # trajectory keys are `{uid}_{session_id}_{index}` (veRL's format)


class LonghaulReplayBuffer(ReplayBuffer):
    """veRL's sync `ReplayBuffer` that evicts failed groups whole, refills them and counts them (module docstring)."""

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: DictConfig,
        max_off_policy_threshold: int | None,
        max_off_policy_strategy: str,
        sampler_kwargs: Mapping[str, Any] | DictConfig,
        refill_fn: Callable[[int], int] | None = None,
        **kwargs: Any,
    ) -> None:
        if trainer_mode != "sync":
            raise ValueError(
                f"LonghaulReplayBuffer serves veRL's sync v1 trainer; trainer.v1.trainer_mode is {trainer_mode!r} "
                "(the async trainers' own replay buffer already evicts and refills failed groups)"
            )
        opts = _options(sampler_kwargs)
        unknown = sorted(set(opts) - {"rollout_n", "max_failed_fraction"})
        if unknown:
            raise ValueError(
                f"trainer.v1.sampler.sampler_kwargs: unknown keys {unknown}; valid: max_failed_fraction, rollout_n"
            )
        rollout_n = opts.get("rollout_n")
        if not isinstance(rollout_n, int) or isinstance(rollout_n, bool) or rollout_n < 1:
            raise ValueError(
                f"trainer.v1.sampler.sampler_kwargs.rollout_n: {rollout_n!r}; set it to actor_rollout_ref.rollout.n "
                "(the group size, a positive integer)"
            )
        fraction = opts.get("max_failed_fraction")
        if fraction is not None and not (isinstance(fraction, int | float) and 0 < float(fraction) < 1):
            raise ValueError(
                f"trainer.v1.sampler.sampler_kwargs.max_failed_fraction: {fraction!r}; expected a number between 0 "
                "and 1 (exclusive), or leave it unset for no limit"
            )
        if refill_fn is None:
            raise ValueError("LonghaulReplayBuffer needs veRL's refill_fn to replace dropped groups")
        self.rollout_n = rollout_n
        self.max_failed_fraction = None if fraction is None else float(fraction)
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            refill_fn=self._refill(refill_fn),
            gen_batch_size=1,
            sync_refill_failed_groups=True,
            **kwargs,
        )
        self._dropped_groups = 0
        self._failed_trajectories = 0
        self._batch_size = 0

    @staticmethod
    def _refill(refill_fn: Callable[[int], int]) -> Callable[[int], int]:
        def refill(num_prompts: int) -> int:
            try:
                return refill_fn(num_prompts)
            except ValueError as exc:
                if "gen_batch_size" not in str(exc):
                    raise
                raise ValueError(
                    f"{exc} — refilling dropped groups one by one needs trainer.v1.sampler.sync_refill_failed_groups=true "  # noqa: E501 - a string literal kept whole
                    "(it makes veRL's dataloader fetch one prompt at a time)"
                ) from exc

        return refill

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str):
        stale, dapo, failed, dapo_counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        if partition_id != "val":
            failed = set(self.failure_keys[partition_id])  # all failed groups, not only the empty ones
        return stale, dapo, failed, dapo_counts

    def _evict_terminal_groups(self, global_steps: int, partition_id: str, eviction_reasons):
        failed = eviction_reasons[2]
        if failed and partition_id != "val":
            finished = {(_uid(key), key.split("_")[1]) for key in self.partitions[partition_id] if _uid(key) in failed}
            self._dropped_groups += len(failed)
            self._failed_trajectories += len(failed) * self.rollout_n - len(finished)
            self._check_failed_fraction()
        return super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)

    def _check_failed_fraction(self) -> None:
        limit = self.max_failed_fraction
        if limit is None or self._batch_size <= 0:
            return
        done = self._dropped_groups + self._batch_size
        if self._dropped_groups / done > limit:
            raise RuntimeError(
                f"{self._dropped_groups} prompt groups failed while gathering a batch of {self._batch_size} "
                f"(more than max_failed_fraction={limit:g} of {done}); {self._failed_trajectories} trajectories "
                "failed. Check the user simulator's health and the rollout traces under "
                f"${C.ENV_ROLLOUT_DIR}/step_<N>/failures/."
            )

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        self._dropped_groups = self._failed_trajectories = 0
        self._batch_size = batch_size if partition_id != "val" else 0
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id != "val":
            metrics[DROPPED_GROUPS_METRIC] = self._dropped_groups
            metrics[FAILED_TRAJECTORIES_METRIC] = self._failed_trajectories
        return batch, metrics
