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

Size: over 400 lines because the sbatch script is rendered top to bottom in the order it runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from longhaul import constants as C
from longhaul import protocol
from longhaul.layout import default_run_dir
from longhaul.protocol import EXIT_REQUEUE
from longhaul.render.jobenv import job_env
from longhaul.render.verl import cpu_ray_start_resources
from longhaul.spec.models import ContainerRuntime, Experiment, Stage
from longhaul.spec.naming import run_name, seed_runs

#: The job's exit code when the requeue limit (`spec.backends.slurm.max_requeues`) stops it (module docstring).
#: Outside sysexits' 64-78 and not used by the launcher, so it cannot be mistaken for anything else.
EXIT_REQUEUE_LIMIT = 79
#: `protocol.CHECKPOINT_SIGNAL` as bash and sbatch name it (USR1).
CHECKPOINT_SIGNAL = protocol.CHECKPOINT_SIGNAL.name.removeprefix("SIG")
RAY_PORT = 6379
RAY_HEAD_TIMEOUT_S = 300
#: Prefix of the job's own Ray temporary root on each node (`<prefix>-<job id>`, see `_ray_env_block`).
RAY_TMP_ROOT = "/tmp/longhaul-ray"
#: Ray's default dashboard-agent port; node i of the job uses this + i (see `_ray_start_block`).
RAY_AGENT_PORT = 52365
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


@dataclass(frozen=True)
class _Expand:
    """A shell word that expands the array task's variables: `code` in commands, `shown` inside an echo's
    double quotes. Every other word of the script is a literal, quoted where it is written."""

    code: str
    shown: str


_Word = str | _Expand


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

    log_name = LOG_NAME if stage is None else f"slurm-{stage}-%j.out"
    if array:
        log_name = ARRAY_LOG_NAME if stage is None else f"slurm-{stage}-%A_%a.out"
    directives: list[tuple[str, str | None]] = [("job-name", name)]
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

    what = f" (stage {stage})" if stage else ""
    if array:
        what += f" (job array: one task per training seed, {', '.join(str(r.spec.algorithm.seed) for r in runs)})"
    lines = [
        "#!/bin/bash",
        f"# longhaul run {name}{what}: rendered from the Experiment spec by",
        "# longhaul.render.slurm. Do not edit; change the spec and submit again (`longhaul submit --backend slurm`).",
    ]
    lines += [_directive(k, v) for k, v in directives]
    lines += ["", "set -euo pipefail", ""]
    lines += _setup_block(slurm.setup)
    task_name: _Word = name
    task_dir: _Word = run_dir
    spec_path: _Word = f"{run_dir}/{C.SPEC_FILENAME}"
    job_id = "${SLURM_JOB_ID:-}"
    if array:
        lines += _array_task_block(runs)
        task_name = _Expand('"$LH_RUN_NAME"', "$LH_RUN_NAME")
        task_dir = _Expand('"$LH_RUN_DIR"', "$LH_RUN_DIR")
        spec_path = _Expand(f'"$LH_RUN_DIR"/{shlex.quote(C.SPEC_FILENAME)}', f"$LH_RUN_DIR/{C.SPEC_FILENAME}")
        job_id = "${SLURM_ARRAY_JOB_ID:-}_$LH_TASK"
    lines += _env_block(task_name, task_dir, spec_path, job_id, stage)
    job_var = C.ENV_JOB_ID if array else "SLURM_JOB_ID"
    limit = slurm.max_requeues if slurm.requeue else None
    if limit is not None:
        lines += _requeue_limit_block(limit, job_var)
    if res.nodes > 1:
        lines += _ray_env_block(exp)
    lines += _runtime_block(exp, stage)
    launch: list[_Word] = [*C.LAUNCHER_CMD, "--spec", spec_path, "--backend", "slurm", "--run-dir", task_dir]
    if stage:
        launch += ["--stage", stage]
    if res.nodes > 1:
        lines += _ray_start_block(exp)
    lines += _launch_block(exp, launch, requeue=slurm.requeue, job_var=job_var, max_requeues=limit)
    return "\n".join(lines) + "\n"


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


def _join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _word(w: _Word) -> str:
    return w.code if isinstance(w, _Expand) else shlex.quote(w)


def _shown(w: _Word) -> str:
    return w.shown if isinstance(w, _Expand) else _dq_echo(shlex.quote(w))


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
        f"LH_RUN_NAMES=({_join([run_name(r) for r in runs])})",
        f"LH_RUN_DIRS=({_join([slurm_run_dir(r) for r in runs])})",
        'LH_TASK="${SLURM_ARRAY_TASK_ID:?this script is a job array: submit it with sbatch (#SBATCH --array)}"',
        'LH_SEED="${LH_SEEDS[$LH_TASK]:?array task $LH_TASK has no training seed (valid: 0-' + f'{len(runs) - 1})}}"',
        'LH_RUN_NAME="${LH_RUN_NAMES[$LH_TASK]}"',
        'LH_RUN_DIR="${LH_RUN_DIRS[$LH_TASK]}"',
        f'echo "${{SLURM_JOB_ID:-}}" > "$LH_RUN_DIR"/{TASK_JOB_ID_FILE}',
        'echo "longhaul: array task $LH_TASK: training seed $LH_SEED, run $LH_RUN_NAME in $LH_RUN_DIR" >&2',
        "",
    ]


def _env_block(name: _Word, run_dir: _Word, spec_path: _Word, job_id: str, stage: str | None) -> list[str]:
    env = job_env("slurm", name, run_dir, spec_path, stage=stage, job_id=_Expand(f'"{job_id}"', job_id))
    out = ["# Offline model/data access and longhaul's job variables (always set, after any site setup)."]
    out += [f"export {k}={_word(v)}" for k, v in env.items()]
    return [*out, ""]


def _runtime_block(exp: Experiment, stage: str | None = None) -> list[str]:
    """Bash arrays that put a command into the job's runtime: PYXIS (srun options) and CONTAINER (argv prefix)."""
    slurm = exp.spec.backends.slurm
    cont = slurm.container
    gpus = exp.spec.resources.gpus_per_node
    if cont.runtime == ContainerRuntime.NONE:
        venv = (
            shlex.quote(slurm.venv)
            if slurm.venv
            else f'"${{{C.ENV_VENV}:?runtime none: set spec.backends.slurm.venv or submit with {C.ENV_VENV}}}"'
        )
        return [
            "# Runtime 'none': the virtualenv "
            + ("from spec.backends.slurm.venv." if slurm.venv else f"captured at submit time (${C.ENV_VENV})."),
            "set +u",
            f"source {venv}/bin/activate",
            "set -u",
            "PYXIS=()",
            "CONTAINER=()",
            "",
        ]
    # No image in the spec: the site names it at submit time ($LONGHAUL_IMAGE, exported into the job by sbatch).
    image = (
        shlex.quote(cont.image)
        if cont.image
        else f'"${{{C.ENV_IMAGE}:?runtime {cont.runtime}: set spec.backends.slurm.container.image or {C.ENV_IMAGE}}}"'
    )
    if cont.runtime == ContainerRuntime.APPTAINER:
        # --containall: no host HOME or environment leaks in; pass the job variables, bind the submit directory.
        names = list(job_env("slurm", "", "", "", stage=stage, job_id=""))
        if exp.spec.resources.nodes > 1:
            names += ["RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_TMPDIR"]
        argv = ["apptainer", "exec"] + (["--nv"] if gpus > 0 else []) + ["--containall"]
        out = [
            "# Runtime 'apptainer': every command runs in the image with the submit directory bound.",
            "PYXIS=()",
            f'CONTAINER=({_join(argv)} --pwd "$SLURM_SUBMIT_DIR" -B "$SLURM_SUBMIT_DIR"',
        ]
        out += [f"  -B {shlex.quote(b)}" for b in cont.binds]
        out += [f'  --env "{n}=${{{n}:-}}"' for n in names]
        if gpus > 0:
            # Passed only when set: `${X:-}` would turn "unset" (every GPU of the node) into "" (none).
            mask = C.CUDA_MASK_VAR
            out.append(f'  ${{{mask}+--env "{mask}=${mask}"}}')
        out += [
            '  --env "SLURM_JOB_ID=$SLURM_JOB_ID" --env "SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"',
            f"  {image})",
            "",
        ]
        return out
    # pyxis/enroot: srun runs each step inside the image; the job environment passes through.
    mounts = [*(shlex.quote(b) for b in cont.binds), '"$SLURM_SUBMIT_DIR"']
    return [
        "# Runtime 'pyxis': every command is an srun step inside the image (enroot), submit directory mounted.",
        f"PYXIS=(--container-image={image} --container-mounts={','.join(mounts)}",
        '  --container-workdir="$SLURM_SUBMIT_DIR" --no-container-mount-home)',
        "CONTAINER=()",
        "",
    ]


def _ray_env_block(exp: Experiment) -> list[str]:
    res = exp.spec.resources
    return [
        f"# Multi-node ({res.nodes} nodes): Ray head on the first node, a worker on each other node (each an srun",
        "# step), the driver attached via RAY_ADDRESS (veRL's documented Slurm layout). Token auth with one token",
        "# file in the run directory, which must be on a filesystem shared by the nodes (checkpoints need it too).",
        'mapfile -t LH_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'LH_HEAD="${LH_NODES[0]}"',
        'LH_HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$LH_HEAD" hostname --ip-address | awk \'{print $1}\')"',
        f'export RAY_ADDRESS="$LH_HEAD_IP:{RAY_PORT}"',
        "# Ray's temporary root, private to the job on every node: `ray start` records its cluster in",
        "# <root>/ray/ray_current_cluster, where a later plain `ray.init()` on that node (another job, a one-node",
        "# run) would find this job's cluster, long gone, and try to attach to it instead of starting its own.",
        f'export RAY_TMPDIR="{RAY_TMP_ROOT}-${{SLURM_JOB_ID}}"',
        "export RAY_AUTH_MODE=token",
        f'export RAY_AUTH_TOKEN_PATH="${C.ENV_RUN_DIR}/.ray/auth_token"',
        'mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")"',
        "( umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' > \"$RAY_AUTH_TOKEN_PATH\" )",
        "",
    ]


def _ray_start_block(exp: Experiment) -> list[str]:
    res = exp.spec.resources
    if res.gpus_per_node == 0:
        # veRL's CPU platform: each node's trainer rank is one logical "GPU" (render.verl.render_cpu_overrides).
        cpu_res = cpu_ray_start_resources()
        ray_res = f"--num-cpus={cpu_res['num_cpus']} --num-gpus={cpu_res['num_gpus']}"
    else:
        ray_res = f"--num-cpus={res.cpus_per_node} --num-gpus={res.gpus_per_node}"
    return [
        f'on_node() {{ local node="$1"; shift; {_srun_on("$node")} "$@"; }}',
        "LH_RAY_PIDS=()",
        'stop_ray() { for p in "${LH_RAY_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }',
        "trap stop_ray EXIT",
        "# Each node's dashboard agent gets its own port (Ray's default plus the node's index): Slurm may place two",
        "# of the job's nodes on one host (several slurmd per host), where the default port would clash.",
        f'{_srun_on("$LH_HEAD")} ray start --head --node-ip-address="$LH_HEAD_IP" --port={RAY_PORT} {ray_res} '
        f"--dashboard-agent-listen-port={RAY_AGENT_PORT} --block &",
        "LH_RAY_PIDS+=($!)",
        f"for _ in $(seq 1 {RAY_HEAD_TIMEOUT_S}); do",
        '  on_node "$LH_HEAD" ray status --address="$RAY_ADDRESS" >/dev/null 2>&1 && break',
        "  sleep 1",
        "done",
        "LH_I=0",
        'for node in "${LH_NODES[@]:1}"; do',
        "  LH_I=$((LH_I + 1))",
        f'  {_srun_on("$node")} ray start --address="$RAY_ADDRESS" {ray_res} '
        f'--dashboard-agent-listen-port="$(({RAY_AGENT_PORT} + LH_I))" --block &',
        "  LH_RAY_PIDS+=($!)",
        "done",
        "# The driver needs every node: veRL places one trainer rank group per node and fails when one is missing.",
        "LH_RAY_UP=0",
        f"for _ in $(seq 1 {RAY_HEAD_TIMEOUT_S}); do",
        '  LH_RAY_UP="$(on_node "$LH_HEAD" ray status --address="$RAY_ADDRESS" 2>/dev/null '
        "| awk '/^Active:/{a=1;next} /^[A-Za-z]/{a=0} a&&/node_/{n++} END{print n+0}')\"",
        '  [ "$LH_RAY_UP" -ge "${#LH_NODES[@]}" ] && break',
        "  sleep 2",
        "done",
        'echo "longhaul: Ray cluster at $RAY_ADDRESS: $LH_RAY_UP of ${#LH_NODES[@]} nodes up (${LH_NODES[*]})" >&2',
        'if [ "$LH_RAY_UP" -lt "${#LH_NODES[@]}" ]; then',
        f'  echo "longhaul: Ray nodes missing after {RAY_HEAD_TIMEOUT_S} s; see the ray start output above" >&2',
        "  exit 1",
        "fi",
        "",
    ]


def _requeue_limit_block(limit: int, job_var: str) -> list[str]:
    """Stop a job that Slurm restarted more than `limit` times, before anything runs (module docstring, 6)."""
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


def _srun_on(node: str) -> str:
    """An `srun` step on one node (`node`: a bash variable), in the job's runtime. Commands started in the
    background are rendered with it directly, not through the script's `on_node` function: `$!` must be srun itself
    (it forwards SIGUSR1 and SIGTERM to its task), not a subshell that the signal would kill, leaving srun behind."""
    return f'srun --overlap --nodes=1 --ntasks=1 -w "{node}" "${{PYXIS[@]}}" "${{CONTAINER[@]}}"'


def _launch_block(
    exp: Experiment, launch: list[_Word], *, requeue: bool, job_var: str, max_requeues: int | None = None
) -> list[str]:
    """Run the launcher and act on its exit code; `job_var` names this job (an array task: `<array id>_<index>`).

    `max_requeues`: no `scontrol requeue` once the job has been restarted that many times (exit 79 instead)."""
    if exp.spec.resources.nodes > 1:
        prefix = f"{_srun_on('$LH_HEAD')} "
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
        f'{" ".join(_shown(w) for w in launch)}" >&2',
        f"{prefix}{' '.join(_word(w) for w in launch)} &",
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


def _dq_echo(text: str) -> str:
    """Make `text` safe inside a double-quoted echo (it is already shell-quoted for execution)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


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
