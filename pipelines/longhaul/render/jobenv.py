"""The job environment: the variables a backend gives a run's launcher (pure). Each renderer writes it in its
own syntax: the Kubernetes container's `env`, the sbatch script's `export` lines, the local launch plan's `env`.

A job has more environments than this one, and they are not copies of it:

- per server (`longhaul.render.plan`): the loopback address and the server's GPUs (`CUDA_VISIBLE_DEVICES`);
- per stage: veRL's CPU platform switch (`longhaul.verlcpu.cpu_job_env`), and, at run time, where the servers
  listen (`longhaul.launcher.supervisor.build_server_env`) and the tracking run, which exist only once the
  launcher has started them.

What the backends add to the job environment, and why, is said where they add it.
"""

from __future__ import annotations

from typing import TypeVar

from longhaul import constants as C

#: A value as the renderer holds it: a string, or (Slurm) a shell word that expands at run time.
V = TypeVar("V")


def job_env(
    backend: str, run_name: V, run_dir: V, spec_file: V, *, stage: str | None = None, job_id: V | None = None
) -> dict[str, str | V]:
    """Offline flags, then longhaul's job variables: run name, run directory, spec file, backend, and the stage
    and job id when the backend knows them. The order is the order renderers write them in."""
    env: dict[str, str | V] = dict(C.OFFLINE_ENV)
    env.update({C.ENV_RUN_NAME: run_name, C.ENV_RUN_DIR: run_dir, C.ENV_SPEC: spec_file, C.ENV_BACKEND: backend})
    if stage:
        env[C.ENV_STAGE] = stage
    if job_id is not None:
        env[C.ENV_JOB_ID] = job_id
    return env
