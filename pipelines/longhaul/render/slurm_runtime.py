"""How the sbatch script's commands are written and where they run (pure): every value from the spec is
shell-quoted (`word`) or, for the array task's variables, expanded (`Expand`); the job's runtime (the virtualenv,
apptainer or pyxis) is two bash arrays, PYXIS (srun options) and CONTAINER (argv prefix), that every command and
every `srun` step (`srun_on`) is put through."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from longhaul import constants as C
from longhaul.render.jobenv import job_env
from longhaul.spec.backends import ContainerRuntime
from longhaul.spec.models import Experiment


@dataclass(frozen=True)
class Expand:
    """A shell word that expands the array task's variables: `code` in commands, `shown` inside an echo's
    double quotes. Every other word of the script is a literal, quoted where it is written."""

    code: str
    shown: str


Word = str | Expand


def join_argv(argv: list[str]) -> str:
    """`argv` as one shell-quoted command line."""
    return " ".join(shlex.quote(a) for a in argv)


def word(w: Word) -> str:
    """`w` as a shell word in a command."""
    return w.code if isinstance(w, Expand) else shlex.quote(w)


def shown(w: Word) -> str:
    """`w` as shown inside an echo's double quotes."""
    return w.shown if isinstance(w, Expand) else dq_echo(shlex.quote(w))


def dq_echo(text: str) -> str:
    """Make `text` safe inside a double-quoted echo (it is already shell-quoted for execution)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


def runtime_block(exp: Experiment, stage: str | None = None) -> list[str]:
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
            f'CONTAINER=({join_argv(argv)} --pwd "$SLURM_SUBMIT_DIR" -B "$SLURM_SUBMIT_DIR"',
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


def srun_on(node: str) -> str:
    """An `srun` step on one node (`node`: a bash variable), in the job's runtime. Commands started in the
    background are rendered with it directly, not through the script's `on_node` function: `$!` must be srun itself
    (it forwards SIGUSR1 and SIGTERM to its task), not a subshell that the signal would kill, leaving srun behind."""
    return f'srun --overlap --nodes=1 --ntasks=1 -w "{node}" "${{PYXIS[@]}}" "${{CONTAINER[@]}}"'
