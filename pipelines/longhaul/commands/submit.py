"""Run commands: submit, status, logs (backend adapters in `longhaul.submit.<backend>`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from longhaul import bounded
from longhaul.commands import fail_on_spec_error, plain_console
from longhaul.commands.plan import refuse_over_memory
from longhaul.constants import SPEC_FILENAME
from longhaul.layout import DEFAULT_RUNS_DIR, RECORD_FILE, default_run_dir
from longhaul.submit import BACKENDS, BackendUnavailable, backend_of_run, get_backend

err = plain_console(stderr=True)
out = plain_console()


def _fail(message: str, code: int = 1) -> None:
    err.print(f"error {message}")
    raise typer.Exit(code)


class _SpecRun(NamedTuple):
    name: str
    slurm_dir: Path  # where `longhaul submit --backend slurm` puts it
    submitted: Path | None  # the run directory with its submit.json (Slurm or local), None if not submitted here


def _spec_runs(run: str) -> tuple[bool, list[_SpecRun]] | None:
    """For a spec file: (has training seeds, its runs: one per seed, else the one run). None for anything else."""
    path = Path(run)
    if path.is_dir() or path.suffix not in (".yaml", ".yml") or not path.is_file():
        return None
    from longhaul.spec import SpecError, load_spec, run_name, seed_runs  # deferred: the spec's models (~0.2 s)

    try:
        exp = load_spec(path)
    except SpecError as exc:
        fail_on_spec_error(exc)
    out = []
    for r in seed_runs(exp):
        cands = [Path(default_run_dir(r, "slurm")), Path(default_run_dir(r, "local"))]
        out.append(_SpecRun(run_name(r), cands[0], next((c for c in cands if (c / RECORD_FILE).is_file()), None)))
    return bool(exp.spec.algorithm.seeds), out


def resolve_run_dirs(run: str) -> list[tuple[str, Path | None]] | None:
    """The seed runs RUN names when it is a spec with training seeds: (run name, run directory or None when that
    run was not submitted from here), failing when none was. None for anything else (see `resolve_run_dir`)."""
    spec = _spec_runs(run)
    if spec is None or not spec[0]:
        return None
    runs = spec[1]
    if not any(r.submitted for r in runs):
        listed = "\n".join(f"  {r.slurm_dir}" for r in runs)
        _fail(
            f"{run}: no run of this spec has been submitted from here (one run per training seed; no "
            f"{RECORD_FILE} in any of):\n{listed}"
        )
    return [(r.name, r.submitted) for r in runs]


def resolve_run_dir(run: str) -> Path:
    """RUN may be a run directory, a run name under ./runs/, or a spec file (its Slurm/local run directory).

    A spec with training seeds has one run directory per seed: the error lists them."""
    path = Path(run)
    if path.is_dir():
        return path
    spec = _spec_runs(run)
    if spec is not None:
        has_seeds, runs = spec
        if has_seeds:
            listed = "\n".join(f"  {r.submitted or r.slurm_dir}" for r in runs)
            state = "" if any(r.submitted for r in runs) else " (none submitted from here yet)"
            _fail(
                f"{run}: this spec has {len(runs)} training seeds, one run each{state}; name one run directory "
                f"(or its run name):\n{listed}",
                2,
            )
        (one,) = runs
        if one.submitted is not None:
            return one.submitted
        _fail(f"{run}: this spec has not been submitted from here (no {one.slurm_dir}/{RECORD_FILE})")
    cand = Path(DEFAULT_RUNS_DIR) / run
    if cand.is_dir():
        return cand
    _fail(f"{run}: not a run directory, a run name under ./{DEFAULT_RUNS_DIR}/, or a spec file")
    raise AssertionError  # unreachable


def _fetch_status(run_dir: Path) -> dict:
    try:
        mod = get_backend(backend_of_run(run_dir), need=("fetch_status",))
        return {**mod.fetch_status(run_dir), **_memory_plan(run_dir)}
    except BackendUnavailable as exc:
        _fail(str(exc), 2)
    except (RuntimeError, OSError) as exc:
        _fail(f"{run_dir}: {exc}")
    raise AssertionError  # unreachable


def _memory_plan(run_dir: Path) -> dict[str, str]:
    """`{"memory_plan": <one line>}` from the run's resolved spec (`longhaul plan`), when the run directory has it."""
    spec = run_dir / SPEC_FILENAME
    if not spec.is_file():
        return {}
    # deferred: the memory plan renders the launch plan (~0.3 s with the spec's models)
    from longhaul.memory.load import memory_summary
    from longhaul.spec import SpecError, load_spec

    try:
        return {"memory_plan": memory_summary(load_spec(spec))}
    except SpecError as exc:
        return {"memory_plan": f"unavailable: {exc}"}


def _status_line(st: dict) -> str:
    job = st.get("job") or {}
    line = f"{st.get('run_name')}  phase={job.get('phase', '?')}  state={job.get('state', '?')}"
    for key, label in (("job_id", "job"), ("reason", "reason"), ("restarts", "restarts"), ("exit_code", "exit")):
        if job.get(key) not in (None, "", 0):
            line += f"  {label}={job[key]}"
    if st.get("checkpoint_step") is not None:
        line += f"  checkpoint_step={st['checkpoint_step']}"
    if st.get("stages_done"):
        line += f"  stages_done={','.join(st['stages_done'])}"
    if st.get("memory_plan"):
        line += f"\n  memory plan: {st['memory_plan']}"
    return line


#: Columns of `longhaul history` (status.history keys, `longhaul.k8s.status.record_history`) and their headings.
HISTORY_COLUMNS = (
    ("runName", "RUN"),
    ("specHash", "SPEC HASH"),
    ("gitCommit", "GIT COMMIT"),
    ("phase", "PHASE"),
    ("mlflowRunId", "MLFLOW RUN"),
    ("startTime", "STARTED"),
    ("completionTime", "COMPLETED"),
)


def history_table(experiment: dict) -> str:
    """The runs an Experiment had (its `status.history`, newest last) as aligned text columns; spec hashes and
    commits shortened to 12 hex digits (the run name carries the hash's first 8)."""
    entries = (experiment.get("status") or {}).get("history") or []
    meta = experiment.get("metadata") or {}
    if not entries:
        return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}: no runs recorded yet"
    rows = [[h for _, h in HISTORY_COLUMNS]]
    for e in entries:
        row = [str(e.get(k) or "-") for k, _ in HISTORY_COLUMNS]
        row[1], row[2] = row[1][:12], row[2][:12]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HISTORY_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def register(app: typer.Typer) -> None:
    """Add `longhaul submit`, `status`, `history` and `logs` to `app`."""
    app.command()(submit)
    app.command()(status)
    app.command()(history)
    app.command()(logs)


def submit(
    spec: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    backend: Annotated[str, typer.Option("--backend", "-b", help=f"One of: {', '.join(BACKENDS)}.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted; run nothing.")] = False,
    ignore_memory_plan: Annotated[
        bool,
        typer.Option("--ignore-memory-plan", help="Submit even when `longhaul plan` finds a phase over GPU capacity."),
    ] = False,
) -> None:
    """Render SPEC for BACKEND and submit it (the same spec resumes the same run)."""
    from longhaul.spec import SpecError, load_spec  # deferred: the spec's pydantic models (~0.2 s)

    try:
        exp = load_spec(spec)
    except SpecError as exc:
        fail_on_spec_error(exc)
    refuse_over_memory(exp, spec, ignore=ignore_memory_plan)
    try:
        mod = get_backend(backend, need=("submit_run",))
        result = mod.submit_run(exp, dry_run=dry_run)
    except BackendUnavailable as exc:
        _fail(str(exc), 2)
    except (RuntimeError, ValueError, OSError) as exc:
        _fail(f"{spec}: {backend} submission failed: {exc}; nothing further was submitted")
    if dry_run:
        typer.echo(result.script, nl=False)
        err.print(result.message)
        return
    typer.echo(result.job_id or "")
    err.print(result.message)


def status(
    run: Annotated[str, typer.Argument(help="Run directory, run name (under ./runs) or spec file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Phase of a submitted run (Pending, Running, Succeeded, Failed) with the backend's own state.

    A spec with training seeds: one line per seed run (`--json`: a list)."""
    runs = resolve_run_dirs(run)
    if runs is None:
        st = _fetch_status(resolve_run_dir(run))
        if as_json:
            typer.echo(json.dumps(st, indent=2, default=str))
            return
        out.print(_status_line(st))
        return
    sts = [_fetch_status(d) if d is not None else {"run_name": n, "run_dir": None, "submitted": False} for n, d in runs]
    if as_json:
        typer.echo(json.dumps(sts, indent=2, default=str))
        return
    for st in sts:
        out.print(_status_line(st) if st.get("submitted", True) else f"{st['run_name']}  not submitted from here")


def history(
    name: Annotated[str, typer.Argument(help="Experiment name (metadata.name) in the cluster.")],
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Namespace of the Experiment (default: the kubectl context's)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print status.history as JSON.")] = False,
) -> None:
    """The runs a Kubernetes Experiment had, oldest first: run name, spec hash, git commit, phase, MLflow run.

    Read from the Experiment's status.history, which the operator keeps (the last 50 runs); deleting the
    Experiment deletes it too (the MLflow runs stay)."""
    from longhaul.submit.kubernetes import KubectlError, fetch_experiment  # deferred: the spec's models (~0.2 s)

    try:
        exp = fetch_experiment(name, namespace=namespace, kubeconfig=kubeconfig)
    except (KubectlError, OSError) as exc:
        _fail(f"{name}: {exc}")
    if as_json:
        typer.echo(json.dumps((exp.get("status") or {}).get("history") or [], indent=2))
        return
    typer.echo(history_table(exp))


def logs(
    run: Annotated[str, typer.Argument(help="Run directory, run name (under ./runs) or spec file.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
) -> None:
    """Print the job log of a submitted run (all requeued runs of the job are in one file)."""
    run_dir = resolve_run_dir(run)
    try:
        mod = get_backend(backend_of_run(run_dir), need=("fetch_logs",))
        for chunk in mod.fetch_logs(run_dir, follow=follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except BackendUnavailable as exc:
        _fail(str(exc), 2)
    except bounded.InputError as exc:  # the log is not a regular file
        _fail(str(exc), 2)
    except (RuntimeError, OSError) as exc:
        _fail(f"{run_dir}: {exc}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
