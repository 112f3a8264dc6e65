"""The end of the sbatch script (pure): run the launcher and speak its checkpoint protocol (`longhaul.protocol`).

Slurm sends SIGUSR1 to the batch shell `signal_lead_s` seconds before the time limit; the trap forwards it to the
launcher, which saves a checkpoint and exits with EXIT_REQUEUE (75); the script then requeues the job, unless the
requeue limit (`spec.backends.slurm.max_requeues`) is reached: then it exits EXIT_REQUEUE_LIMIT (79), as a job
restarted more often than the limit does at its start (`requeue_limit_block`). See `longhaul.render.slurm`.
"""

from __future__ import annotations

from longhaul import protocol
from longhaul.protocol import EXIT_REQUEUE
from longhaul.render.slurm_runtime import Word, shown, srun_on, word
from longhaul.spec.backends import ContainerRuntime
from longhaul.spec.models import Experiment

#: The job's exit code when the requeue limit (`spec.backends.slurm.max_requeues`) stops it (module docstring).
#: Outside sysexits' 64-78 and not used by the launcher, so it cannot be mistaken for anything else.
EXIT_REQUEUE_LIMIT = 79
#: `protocol.CHECKPOINT_SIGNAL` as bash and sbatch name it (USR1).
CHECKPOINT_SIGNAL = protocol.CHECKPOINT_SIGNAL.name.removeprefix("SIG")


def requeue_limit_block(limit: int, job_var: str) -> list[str]:
    """Stop a job that Slurm restarted more than `limit` times, before anything runs (`render.slurm`, item 6)."""
    return [
        f"# Requeue limit (spec.backends.slurm.max_requeues={limit}): a job restarted more often stops here with exit",
        f"# code {EXIT_REQUEUE_LIMIT}, whoever requeued it (this script, preemption, a node failure, scontrol requeue).",  # noqa: E501 - a string literal kept whole
        f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt {limit} ]; then',
        f'  echo "longhaul: requeue limit reached: job ${job_var} was requeued ${{SLURM_RESTART_COUNT}} times, more '
        f"than spec.backends.slurm.max_requeues={limit}; stopping with exit code {EXIT_REQUEUE_LIMIT} without running. "
        'The checkpoints are kept: submit the same spec again to resume, or raise the limit." >&2',
        f"  exit {EXIT_REQUEUE_LIMIT}",
        "fi",
        "",
    ]


def launch_block(
    exp: Experiment, launch: list[Word], *, requeue: bool, job_var: str, max_requeues: int | None = None
) -> list[str]:
    """Run the launcher and act on its exit code; `job_var` names this job (an array task: `<array id>_<index>`).

    `max_requeues`: no `scontrol requeue` once the job has been restarted that many times (exit 79 instead)."""
    if exp.spec.resources.nodes > 1:
        prefix = f"{srun_on('$LH_HEAD')} "
    elif exp.spec.backends.slurm.container.runtime == ContainerRuntime.PYXIS:
        prefix = 'srun --overlap --nodes=1 --ntasks=1 "${PYXIS[@]}" '
    else:
        prefix = '"${CONTAINER[@]}" '
    at_limit = (
        [
            f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {max_requeues} ]; then',
            f'    echo "longhaul: checkpoint saved; requeue limit reached: job ${job_var} was already requeued '
            f"${{SLURM_RESTART_COUNT:-0}} times (spec.backends.slurm.max_requeues={max_requeues}); not requeueing, "
            f"stopping with exit code {EXIT_REQUEUE_LIMIT}. Submit the same spec again to resume from the checkpoint, "
            'or raise the limit." >&2',
            f"    exit {EXIT_REQUEUE_LIMIT}",
            "  fi",
        ]
        if max_requeues is not None
        else []
    )
    after = (
        [
            f'if [ "$rc" -eq {EXIT_REQUEUE} ] && [ "$checkpoint_requested" = 1 ]; then',
            *at_limit,
            f'  echo "longhaul: checkpoint saved; requeueing job ${job_var} (restart ${{SLURM_RESTART_COUNT:-0}})" >&2',
            f'  scontrol requeue "${job_var}"',
            "  exit 0",
            "fi",
        ]
        if requeue
        else [
            f'if [ "$rc" -eq {EXIT_REQUEUE} ]; then',
            '  echo "longhaul: checkpoint saved; requeue is off: submit the same spec again to resume" >&2',
            "fi",
        ]
    )
    return [
        f"# The launcher runs in the background so that the {CHECKPOINT_SIGNAL} trap fires at once (bash defers traps",
        "# while a foreground child runs). Protocol: longhaul.launcher.protocol.",
        "checkpoint_requested=0",
        "launcher_pid=",
        "on_checkpoint_signal() {",
        "  checkpoint_requested=1",
        f'  echo "longhaul: SIG{CHECKPOINT_SIGNAL} before the time limit: asking the launcher to save a checkpoint" >&2',  # noqa: E501 - a string literal kept whole
        f'  if [ -n "$launcher_pid" ]; then kill -{CHECKPOINT_SIGNAL} "$launcher_pid" 2>/dev/null || true; fi',
        "}",
        f"trap on_checkpoint_signal {CHECKPOINT_SIGNAL}",
        # scancel/requeue/preemption send SIGTERM to every process of the job: the launcher stops itself;
        # the batch shell only waits for it so that its exit code is the job's.
        "trap 'echo \"longhaul: SIGTERM: waiting for the launcher to stop\" >&2' TERM",
        f'echo "longhaul: job ${{{job_var}:-?}} restart ${{SLURM_RESTART_COUNT:-0}} on $(hostname -s): '
        f'{" ".join(shown(w) for w in launch)}" >&2',
        f"{prefix}{' '.join(word(w) for w in launch)} &",
        "launcher_pid=$!",
        "while :; do",
        '  rc=0; wait "$launcher_pid" || rc=$?',
        '  kill -0 "$launcher_pid" 2>/dev/null || break  # still running: wait returned for a trapped signal',
        "done",
        'if [ "$rc" -gt 128 ]; then last=0; wait "$launcher_pid" 2>/dev/null || last=$?; [ "$last" -eq 127 ] || rc=$last; fi',  # noqa: E501 - a string literal kept whole
        *after,
        'echo "longhaul: launcher exited with $rc" >&2',
        'exit "$rc"',
    ]
