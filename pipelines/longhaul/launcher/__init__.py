"""The in-container launcher shared by every backend (local, Slurm, Kubernetes): `longhaul launch`.

What it does, in order:

1. Re-validates the mounted spec (`--spec FILE`) and checks that its run name matches `LONGHAUL_RUN_NAME`
   when the job environment sets it (a job must never run a spec other than the one it was submitted with).
2. Renders the launch plan (`longhaul.render.plan.render_plan`, pure) and executes it: starts the colocated
   OpenAI-compatible servers (the user simulator; on the local backend also the policy) as child processes in
   their own process groups, with every log line prefixed `[simulator]` / `[policy]` on stdout and copied to
   `<run_dir>/logs/<role>.log`; waits for each `/health` within the spec's start-up timeout.
3. Runs the stages in order (sft, grpo, eval), each as `longhaul.launcher.stages.STAGES` names it: sft and grpo
   as a child process with the plan's argv and environment, eval inside the launcher.
   A stage that finished is recorded in `<run_dir>/.longhaul/stages/<name>.done` and skipped when the job is
   started again (requeue, restart), so a requeued job continues where it stopped.
4. Stops every server by PID (SIGTERM to its process group, SIGKILL after a grace period) on exit, error or
   signal.

Signal and exit-code protocol (agreed with the Slurm backend; Kubernetes uses the same codes):

=============  ==================================================================================
SIGUSR1        "save and requeue": Slurm's pre-limit signal (`#SBATCH --signal=B:USR1@<lead>` trapped by
               the batch script and forwarded to the launcher's PID) or a preemption notice. veRL's trainer
               has no "save now" hook: the launcher stops it (SIGTERM to its process group) and the newest
               periodic checkpoint (`save_freq`; `global_step_N/` + `latest_checkpointed_iteration.txt`) is
               the resume point (`trainer.resume_mode=auto`). Servers are stopped; the MLflow run stays open
               (status SCHEDULED, tag `longhaul.phase=requeued`) so the requeued job resumes into it.
EXIT_REQUEUE   75 (EX_TEMPFAIL): "checkpoint saved, requeue me". The batch script runs
               `scontrol requeue $SLURM_JOB_ID` (or simply exits non-zero with `--requeue`); nothing else
               exits 75.
SIGTERM/INT    clean stop (scancel, pod deletion, Ctrl-C): the stage child gets SIGTERM, servers are stopped,
               the MLflow run is marked KILLED; exit `EXIT_KILLED` (143; 130 for Ctrl-C). Every file is written
               atomically (temporary file + rename), so a stop never leaves a half-written checkpoint marker.
EXIT_FAILED    1: a stage or a server failed (the message names which, with the tail of its log).
EXIT_USAGE     2: the spec is invalid or does not match the job.
=============  ==================================================================================
"""

from longhaul.protocol import (
    CHECKPOINT_SIGNAL,
    EXIT_FAILED,
    EXIT_KILLED,
    EXIT_OK,
    EXIT_REQUEUE,
    EXIT_SIGINT,
    EXIT_USAGE,
)

__all__ = [
    "CHECKPOINT_SIGNAL",
    "EXIT_FAILED",
    "EXIT_KILLED",
    "EXIT_OK",
    "EXIT_REQUEUE",
    "EXIT_SIGINT",
    "EXIT_USAGE",
]
