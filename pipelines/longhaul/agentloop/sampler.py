"""longhaul's veRL v1 replay buffers: every failed prompt group is dropped whole, refilled and counted, and a step
with too many of them stops the run.

A trajectory that fails (`longhaul.agentloop.loop.TrajectoryFailed`: user simulator down after its retries, first
prompt over budget) makes veRL's worker mark its prompt group `failure`. One class per kind of veRL trainer:

* `LonghaulReplayBuffer` (sync): veRL's own `ReplayBuffer` with `sync_refill_failed_groups` replaces only failed
  groups that produced no trajectory at all; a group that lost one of its n samples stays sampleable and GRPO
  computes its baseline from the survivors (a biased baseline). This subclass evicts every failed training group,
  however many of its samples finished, and refills each with a fresh prompt.
* `LonghaulReplayBufferAsync` (colocate_async, separate_async): veRL's `ReplayBufferAsync` already evicts every
  failed group whole and refills as many prompts (replay_buffer.py `_terminal_eviction_reasons`,
  `wait_for_sampleable`); this subclass only adds the accounting below.

Both report, in the metrics of each training `sample` (`FailedGroupAccounting`, one implementation):

* `rollout/dropped_groups`      failed groups evicted (and refilled) while the batch was gathered;
* `rollout/failed_trajectories` samples of those groups that failed (n minus the samples that finished).

veRL's own `training/rollout_failure/evicted_samples` (= dropped groups) is still logged beside them. separate_async
with `parameter_sync_step` k > 1 samples k mini-batches a step, and veRL's `MetricsAggregator` sums only its own
eviction counters across them: the step's value of these two is their sample-weighted mean per mini-batch.

Why subclasses: veRL's v1 trainer has no other hook that sees group status (a failed sample produces no output,
so nothing reaches the reward or metric paths). One is plugged in with
`trainer.v1.sampler.custom_sampler.path=pkg://longhaul.agentloop.sampler` and `.name=` the class for the trainer
mode (`longhaul.agentloop.config.sampler_overrides`). veRL passes a custom sampler only its generic arguments, so
the sync class sets `sync_refill_failed_groups` and `gen_batch_size=1` itself; both take their settings from
`trainer.v1.sampler.sampler_kwargs`:

* `rollout_n` (required): the group size (`actor_rollout_ref.rollout.n`), to count failed samples;
* `max_failed_fraction` (optional, 0 < f < 1): stop training with an error when more than this fraction of the
  groups a batch needed failed — a simulator that is down for good must stop the run, not consume the dataset one
  refill at a time.

Sync only: `trainer.v1.sampler.sync_refill_failed_groups=true` must be set as well: it is what makes veRL's
dataloader fetch one prompt at a time, which exact refills need. The async trainers' dataloader always does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from longhaul import constants as C
from longhaul.agentloop.config import sampler_name

DROPPED_GROUPS_METRIC = "rollout/dropped_groups"
FAILED_TRAJECTORIES_METRIC = "rollout/failed_trajectories"
_OPTIONS = ("max_failed_fraction", "rollout_n")


def _options(sampler_kwargs: Any) -> dict[str, Any]:
    if isinstance(sampler_kwargs, DictConfig):
        return dict(OmegaConf.to_container(sampler_kwargs, resolve=True))
    return dict(sampler_kwargs or {})


def _uid(key: str) -> str:
    return key.split("_")[0]  # trajectory keys are `{uid}_{session_id}_{index}` (veRL's format)


class FailedGroupAccounting:
    """What both longhaul replay buffers add to veRL's: the settings check, a count of the failed groups veRL's
    class evicts, the `max_failed_fraction` stop and the two metrics (module docstring). Listed before veRL's class
    in the bases: its `__init__` and `_evict_terminal_groups` wrap veRL's."""

    #: Whether the class serves veRL's sync trainer (else its async ones), and that in words for errors.
    for_sync: ClassVar[bool]
    serves: ClassVar[str]

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
        name = type(self).__name__
        if (trainer_mode == "sync") != self.for_sync:
            raise ValueError(
                f"{name} serves {self.serves}; trainer.v1.trainer_mode is {trainer_mode!r}: set "
                f"trainer.v1.sampler.custom_sampler.name={sampler_name(trainer_mode)}"
            )
        self.rollout_n, self.max_failed_fraction = _check_options(_options(sampler_kwargs))
        if refill_fn is None:
            raise ValueError(f"{name} needs veRL's refill_fn to replace dropped groups")
        super().__init__(  # veRL's ReplayBuffer / ReplayBufferAsync
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            **self._verl_kwargs(refill_fn),
            **kwargs,
        )
        self._dropped_groups = 0
        self._failed_trajectories = 0
        self._batch_size = 0

    def _verl_kwargs(self, refill_fn: Callable[[int], int]) -> dict[str, Any]:
        """The keyword arguments this class gives veRL's constructor beyond the generic ones veRL passes it."""
        return {"refill_fn": refill_fn}

    def _evict_terminal_groups(self, global_steps: int, partition_id: str, eviction_reasons):
        failed = eviction_reasons[2]
        if failed and partition_id != "val":
            finished = {(_uid(key), key.split("_")[1]) for key in self.partitions[partition_id] if _uid(key) in failed}
            self._dropped_groups += len(failed)
            self._failed_trajectories += len(failed) * self.rollout_n - len(finished)
            self._check_failed_fraction()
        return super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)

    def _gathering(self, partition_id: str, batch_size: int) -> None:
        """The failed fraction counts against a batch of `batch_size` groups from now on (none for validation)."""
        self._batch_size = batch_size if partition_id != "val" else 0

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

    def _report_failures(self, partition_id: str, metrics: dict) -> dict:
        """`metrics` of a training batch with the two counts added; counting restarts. Validation's are untouched."""
        if partition_id != "val":
            metrics[DROPPED_GROUPS_METRIC] = self._dropped_groups
            metrics[FAILED_TRAJECTORIES_METRIC] = self._failed_trajectories
            self._dropped_groups = self._failed_trajectories = 0
        return metrics


def _check_options(opts: dict[str, Any]) -> tuple[int, float | None]:
    """`(rollout_n, max_failed_fraction)` from `trainer.v1.sampler.sampler_kwargs`, or a one-line error."""
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"trainer.v1.sampler.sampler_kwargs: unknown keys {unknown}; valid: {', '.join(_OPTIONS)}")
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
    return rollout_n, None if fraction is None else float(fraction)


class LonghaulReplayBuffer(FailedGroupAccounting, ReplayBuffer):
    """veRL's sync `ReplayBuffer` that evicts failed groups whole, refills them and counts them (module docstring)."""

    for_sync = True
    serves = "veRL's sync v1 trainer"

    def _verl_kwargs(self, refill_fn: Callable[[int], int]) -> dict[str, Any]:
        return {"refill_fn": self._refill(refill_fn), "gen_batch_size": 1, "sync_refill_failed_groups": True}

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

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        self._gathering(partition_id, batch_size)
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        return batch, self._report_failures(partition_id, metrics)


class LonghaulReplayBufferAsync(FailedGroupAccounting, ReplayBufferAsync):
    """veRL's async `ReplayBufferAsync` (which evicts and refills failed groups itself) with longhaul's count of
    them and the `max_failed_fraction` stop (module docstring)."""

    for_sync = False
    serves = "veRL's async v1 trainers (colocate_async, separate_async)"

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int):
        # Counted from here, not from `sample`: separate_async's hybrid switch also waits (and evicts) through this
        # method before a step samples (trainer_separate_async.py `_wait_for_sampleable_and_switch`); what it
        # evicts is reported with the next training sample.
        self._gathering(partition_id, target_count)
        return super().wait_for_sampleable(global_steps, partition_id, target_count)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = super().sample(global_steps, partition_id, batch_size)  # waits via `wait_for_sampleable`
        return batch, self._report_failures(partition_id, metrics)
