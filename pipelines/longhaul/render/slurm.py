"""Spec → one sbatch script (pure). `longhaul submit --backend slurm` ships exactly this text.

The script, top to bottom:

1. `#SBATCH` lines from `spec.resources` and `spec.backends.slurm` (job name = run name; output under the run
   directory, which the submit step creates because Slurm does not).
2. Site setup lines (`spec.backends.slurm.setup`, user shell by design, one command per line, each run on its own
   with `eval`, so that an unclosed quote, heredoc or block fails its line instead of swallowing the rest of the
   script), then the offline
   environment and longhaul's own variables (set after setup so that setup cannot unset them).
3. Multi-node (`resources.nodes > 1`): a Ray head on the first node and one Ray worker per other node, each
   started with `srun`, the driver attached through `RAY_ADDRESS` — the layout veRL documents for Slurm. The
   script waits until every node has joined; on veRL's CPU platform each node advertises one trainer rank
   (`render.verl.cpu_ray_start_resources`). Run for real on the CI cluster's two-node partition.
4. `longhaul launch --spec <run_dir>/experiment.yaml --backend slurm --run-dir <run_dir>` in the background,
   inside the container runtime (apptainer, pyxis) or the activated virtualenv (runtime `none`).
5. The checkpoint protocol with the launcher (`longhaul.protocol`): Slurm sends SIGUSR1 to the batch
   shell `signal_lead_s` seconds before the time limit (`--signal=B:USR1@lead`); the trap forwards it to the
   launcher, which saves a checkpoint and exits with EXIT_REQUEUE (75); the script then runs
   `scontrol requeue $SLURM_JOB_ID`. The requeued job runs the same command on the same run directory and the
   launcher resumes from the newest checkpoint; `--open-mode=append` keeps every run in one log file.
6. The requeue limit (`spec.backends.slurm.max_requeues`, null = none): a job restarted more often than the
   limit exits EXIT_REQUEUE_LIMIT (79) at its start, before anything runs (requeues by preemption, node failure
   or `scontrol requeue` come from Slurm, not from the script), and the script does not requeue a job that has
   already been restarted `max_requeues` times: it exits 79 after the launcher's checkpoint instead of running
   `scontrol requeue`. Either way the job ends FAILED with exit code 79:0, which `longhaul status` reports as
   "requeue limit reached"; the checkpoint is kept, so submitting the same spec again resumes the run.

Training seeds (`spec.algorithm.seeds`): one script for the whole group, a job array with one task per seed
run (`longhaul.spec.seed_runs`). The job is named after the group's run name; `#SBATCH --array=0-<n-1>`; logs
`<group run dir>/slurm-%A_%a.out`. Task i picks seed i from a bash array, and with it that seed run's name and run
directory (`slurm_run_dir` of the seed run, `<output_dir>/<group>-s<seed>`, where the submit step wrote its
resolved spec), then does exactly what the single-run script does for that run. A task's own id is
`<array job id>_<task index>` (`LONGHAUL_JOB_ID`): the requeue names it, because `scontrol requeue
$SLURM_JOB_ID` from the task whose raw id is the array's id would requeue every task of the array. The task
writes its raw job id to `<run dir>/slurm-task-job-id` (the only id a job-completion log, `sacct -c`, knows).

Every value that comes from the spec is shell-quoted (`shlex.quote`) or, on `#SBATCH` lines (parsed by sbatch,
not by a shell), checked against a strict pattern; setup lines are the one deliberate exception.

The blocks live in siblings, in the order the script runs them: the runtime and the quoting in
`longhaul.render.slurm_runtime`, the Ray cluster in `longhaul.render.slurm_ray`, the launcher and its checkpoint
protocol in `longhaul.render.slurm_launch`.
"""

from __future__ import annotations

import re
import shlex
from decimal import ROUND_CEILING, Decimal

from longhaul import constants as C
from longhaul.layout import default_run_dir
from longhaul.protocol import EXIT_REQUEUE
from longhaul.render.jobenv import job_env
from longhaul.render.slurm_launch import CHECKPOINT_SIGNAL, EXIT_REQUEUE_LIMIT, launch_block, requeue_limit_block
from longhaul.render.slurm_ray import ray_env_block, ray_start_block
from longhaul.render.slurm_runtime import Expand, Word, join_argv, runtime_block, word
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.naming import run_name, seed_runs

LOG_NAME = "slurm-%j.out"
#: Log of one array task (training seeds), in the group's directory: `%A` array job id, `%a` task index.
ARRAY_LOG_NAME = "slurm-%A_%a.out"
#: Written by each array task into its seed run directory: the task's raw job id (see the module docstring).
TASK_JOB_ID_FILE = "slurm-task-job-id"

_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_./~+@=,:%-]+$")
_DEP_ITEM = r"(singleton|(after|afterany|afterok|afternotok|aftercorr)(:[0-9]+(\+[0-9]+)?)+)"
_DEPENDENCY = re.compile(rf"^{_DEP_ITEM}(,{_DEP_ITEM})*$")
_UNITS = {
    "": Decimal(1),
    "K": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
}


def render_slurm(exp: Experiment, *, stage: str | None = None, dependency: str | None = None) -> str:
    """The sbatch script for `exp`: every stage (default) or one `stage`, optionally after `dependency`.

    An Experiment with training seeds gives one job-array script, one task per seed run (module docstring).
    `dependency` is an sbatch dependency expression such as `afterok:123`. Raises ValueError for an unknown
    stage, a stage the spec does not run, or a malformed dependency.
    """
    spec = exp.spec
    slurm = spec.backends.slurm
    res = spec.resources
    name = run_name(exp)
    runs = seed_runs(exp)
    array = bool(spec.algorithm.seeds)  # a job array even for one seed: the run is the seed run `<group>-s<seed>`
    run_dir = slurm_run_dir(exp)  # an array's group directory: its script and the tasks' logs
    if stage is not None:
        valid = [str(s) for s in spec.stages]
        if stage not in valid:
            raise ValueError(f"stage '{stage}' is not run by this spec; valid: {', '.join(valid)}")
    if dependency is not None and not _DEPENDENCY.fullmatch(dependency):
        raise ValueError(f"dependency '{dependency}' is not an sbatch dependency expression (e.g. afterok:123)")

    lines = _header(exp, runs, stage)
    lines += [_directive(k, v) for k, v in _directives(exp, runs, run_dir, stage, dependency)]
    lines += ["", "set -euo pipefail", ""]
    lines += _setup_block(slurm.setup)
    task_name: Word = name
    task_dir: Word = run_dir
    spec_path: Word = f"{run_dir}/{C.SPEC_FILENAME}"
    job_id = "${SLURM_JOB_ID:-}"
    if array:
        lines += _array_task_block(runs)
        task_name = Expand('"$LH_RUN_NAME"', "$LH_RUN_NAME")
        task_dir = Expand('"$LH_RUN_DIR"', "$LH_RUN_DIR")
        spec_path = Expand(f'"$LH_RUN_DIR"/{shlex.quote(C.SPEC_FILENAME)}', f"$LH_RUN_DIR/{C.SPEC_FILENAME}")
        job_id = "${SLURM_ARRAY_JOB_ID:-}_$LH_TASK"
    lines += _env_block(task_name, task_dir, spec_path, job_id, stage)
    job_var = C.ENV_JOB_ID if array else "SLURM_JOB_ID"
    limit = slurm.max_requeues if slurm.requeue else None
    if limit is not None:
        lines += requeue_limit_block(limit, job_var)
    if res.nodes > 1:
        lines += ray_env_block(exp)
    lines += runtime_block(exp, stage)
    launch: list[Word] = [*C.LAUNCHER_CMD, "--spec", spec_path, "--backend", "slurm", "--run-dir", task_dir]
    if stage:
        launch += ["--stage", stage]
    if res.nodes > 1:
        lines += ray_start_block(exp)
    lines += launch_block(exp, launch, requeue=slurm.requeue, job_var=job_var, max_requeues=limit)
    return "\n".join(lines) + "\n"


def _header(exp: Experiment, runs: list[Experiment], stage: str | None) -> list[str]:
    """The shebang and what the script runs."""
    what = f" (stage {stage})" if stage else ""
    if exp.spec.algorithm.seeds:
        what += f" (job array: one task per training seed, {', '.join(str(r.spec.algorithm.seed) for r in runs)})"
    return [
        "#!/bin/bash",
        f"# longhaul run {run_name(exp)}{what}: rendered from the Experiment spec by",
        "# longhaul.render.slurm. Do not edit; change the spec and submit again (`longhaul submit --backend slurm`).",
    ]


def _directives(
    exp: Experiment, runs: list[Experiment], run_dir: str, stage: str | None, dependency: str | None
) -> list[tuple[str, str | None]]:
    """The `#SBATCH` options from `spec.resources` and `spec.backends.slurm` (job name = run name; the log under
    the run directory, appended to by every requeued run; the checkpoint signal `signal_lead_s` before the end)."""
    spec = exp.spec
    slurm, res = spec.backends.slurm, spec.resources
    array = bool(spec.algorithm.seeds)
    log_name = LOG_NAME if stage is None else f"slurm-{stage}-%j.out"
    if array:
        log_name = ARRAY_LOG_NAME if stage is None else f"slurm-{stage}-%A_%a.out"
    directives: list[tuple[str, str | None]] = [("job-name", run_name(exp))]
    if array:
        directives.append(("array", f"0-{len(runs) - 1}"))
    directives += [
        ("nodes", str(res.nodes)),
        ("ntasks-per-node", "1"),
        ("cpus-per-task", str(res.cpus_per_node)),
        ("mem", f"{memory_mib(res.memory)}M"),
    ]
    if res.gpus_per_node > 0:
        gres = f"gpu:{res.gpu_type}:{res.gpus_per_node}" if res.gpu_type else f"gpu:{res.gpus_per_node}"
        directives.append(("gres", gres))
    directives.append(("time", res.time_limit))
    for key, value in (("partition", slurm.partition), ("account", slurm.account), ("qos", slurm.qos)):
        if value:
            directives.append((key, value))
    directives += [
        ("output", f"{run_dir}/{log_name}"),
        ("open-mode", "append"),
        ("requeue" if slurm.requeue else "no-requeue", None),
        ("signal", f"B:{CHECKPOINT_SIGNAL}@{slurm.signal_lead_s}"),
    ]
    if dependency:
        directives += [("dependency", dependency), ("kill-on-invalid-dep", "yes")]
    return directives


def slurm_run_dir(exp: Experiment) -> str:
    """`<spec.backends.slurm.output_dir>/<run name>` (relative paths resolve against the submit directory)."""
    return default_run_dir(exp, "slurm")


def memory_mib(quantity: str) -> int:
    """A Kubernetes quantity (`512Gi`, `8G`, `1048576`) in MiB, rounded up (sbatch `--mem=<n>M`)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?", quantity)
    if not m:
        raise ValueError(f"memory '{quantity}' is not a quantity like 512Gi or 64G")
    mib = Decimal(m.group(1)) * _UNITS[m.group(2) or ""] / _UNITS["Mi"]
    return max(1, int(mib.to_integral_value(rounding=ROUND_CEILING)))


def _directive(key: str, value: str | None) -> str:
    if value is None:
        return f"#SBATCH --{key}"
    # sbatch reads these lines itself (no shell): refuse anything beyond a plain token instead of quoting.
    if not _SBATCH_VALUE.fullmatch(value):
        raise ValueError(f"#SBATCH --{key}: value {value!r} has characters sbatch would misread")
    return f"#SBATCH --{key}={value}"


def _setup_block(setup: list[str]) -> list[str]:
    if not setup:
        return []
    out = [
        "# Site setup (spec.backends.slurm.setup). Module scripts often read unset variables: relax -u here.",
        "# Each line is run on its own (eval of the quoted line): an unclosed quote, heredoc or block in one line",
        "# fails that line instead of swallowing the rest of the script.",
    ]
    out.append("set +u")
    for i, line in enumerate(setup):
        if "\n" in line or "\r" in line or "\x00" in line:
            raise ValueError(f"spec.backends.slurm.setup.{i}: one command per line (no newline/CR/NUL)")
        out.append(f"eval {shlex.quote(line)}")
    out += ["set -u", ""]
    return out


def _array_task_block(runs: list[Experiment]) -> list[str]:
    """Job array (training seeds): task i runs seed run i, in that run's own directory (`slurm_run_dir`)."""
    seeds = [str(r.spec.algorithm.seed) for r in runs]
    return [
        "# Training seeds (spec.algorithm.seeds): array task i runs seed run i in its own run directory, with the",
        "# resolved spec the submit step wrote there (the seed set in it).",
        f"LH_SEEDS=({' '.join(seeds)})",
        f"LH_RUN_NAMES=({join_argv([run_name(r) for r in runs])})",
        f"LH_RUN_DIRS=({join_argv([slurm_run_dir(r) for r in runs])})",
        'LH_TASK="${SLURM_ARRAY_TASK_ID:?this script is a job array: submit it with sbatch (#SBATCH --array)}"',
        'LH_SEED="${LH_SEEDS[$LH_TASK]:?array task $LH_TASK has no training seed (valid: 0-' + f'{len(runs) - 1})}}"',
        'LH_RUN_NAME="${LH_RUN_NAMES[$LH_TASK]}"',
        'LH_RUN_DIR="${LH_RUN_DIRS[$LH_TASK]}"',
        f'echo "${{SLURM_JOB_ID:-}}" > "$LH_RUN_DIR"/{TASK_JOB_ID_FILE}',
        'echo "longhaul: array task $LH_TASK: training seed $LH_SEED, run $LH_RUN_NAME in $LH_RUN_DIR" >&2',
        "",
    ]


def _env_block(name: Word, run_dir: Word, spec_path: Word, job_id: str, stage: str | None) -> list[str]:
    env = job_env("slurm", name, run_dir, spec_path, stage=stage, job_id=Expand(f'"{job_id}"', job_id))
    out = ["# Offline model/data access and longhaul's job variables (always set, after any site setup)."]
    out += [f"export {k}={word(v)}" for k, v in env.items()]
    return [*out, ""]


__all__ = [
    "ARRAY_LOG_NAME",
    "CHECKPOINT_SIGNAL",
    "EXIT_REQUEUE",
    "EXIT_REQUEUE_LIMIT",
    "TASK_JOB_ID_FILE",
    "Stage",
    "memory_mib",
    "render_slurm",
    "slurm_run_dir",
]
