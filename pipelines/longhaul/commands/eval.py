"""`longhaul eval …`: evaluate a policy endpoint (pass^k, pass@k, subsets, CIs) and re-score result files."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from longhaul import constants as C
from longhaul.bounded import split_ids
from longhaul.commands import fail_on_spec_error, plain_console, table_console
from longhaul.layout import EVAL_RESULTS_FILE, EVAL_SUMMARY_FILE, EVAL_TRAJECTORIES_FILE
from longhaul.redact import redact_uri
from longhaul.spec.bounds import MAX_BOOTSTRAP, MAX_CONCURRENCY, MAX_RANDOM_SEED, MAX_SAMPLES

if TYPE_CHECKING:
    from longhaul.envs.airline.splits import Split
    from longhaul.eval.driver import EvalJob

out = table_console()
err = plain_console(stderr=True)


def _parse_ks(text: str | None) -> list[int] | None:
    """The k values of `--k` (`1,2,4`): at most 64 of them, each from 1 to `MAX_SAMPLES`."""
    if not text:
        return None
    shown = text if len(text) <= 60 else text[:57] + "..."
    parts = [x.strip() for x in text.split(",", 64) if x.strip()]
    if len(parts) > 64 or any(len(x) > 12 for x in parts):
        err.print(f"error --k: {shown!r}: at most 64 values of at most 12 digits (e.g. 1,2,4)")
        raise typer.Exit(2)
    try:
        ks = sorted({int(x) for x in parts})
    except ValueError:
        err.print(f"error --k: {shown!r} is not a comma-separated list of integers (e.g. 1,2,4)")
        raise typer.Exit(2) from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_SAMPLES:
        err.print(f"error --k: values must be from 1 to {MAX_SAMPLES:,} (got {shown!r})")
        raise typer.Exit(2)
    return ks


def print_summary(summary: dict[str, Any]) -> None:
    """A human-readable table: every rate with c/n, CIs, subsets, floor, error and abort rates."""
    ks = [str(k) for k in summary["k"]]
    table = Table(title=f"{summary['tasks']} tasks × trials: {summary['c_over_n']} successful trials")
    table.add_column("subset")
    table.add_column("tasks", justify="right")
    table.add_column("c/n", justify="right")
    for k in ks:
        table.add_column(f"pass^{k}", justify="right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    table.add_column("null floor", justify="right")

    def row(name: str, block: dict[str, Any]) -> None:
        ci = block.get("ci") or {}

        def cell(kind: str, k: str) -> str:
            v = block[kind][k]
            b = (ci.get(kind) or {}).get(k)
            return f"{v:.3f}" + (f" [{b[0]:.2f},{b[1]:.2f}]" if b else "")

        floor = block.get("null_agent_floor")
        table.add_row(
            name,
            str(block["tasks"]),
            block["c_over_n"],
            *[cell("pass_hat_k", k) for k in ks],
            *[cell("pass_at_k", k) for k in ks],
            "-" if floor is None else f"{floor:.3f}",
        )

    row("all", summary)
    for name, block in summary["subsets"].items():
        row(name, block)
    out.print(table)
    gen = summary.get("generalisation_pass_hat_1")
    if gen is not None:
        out.print(f"generalisation pass^1 = (uncovered_seen·24 + unseen·10)/34 = {gen:.3f}")
    out.print(
        f"tool-error rate {summary['tool_error_rate']:.3f} ({summary['tool_errors']}/{summary['tool_calls']} tool calls, "  # noqa: E501 - a string literal kept whole
        f"{summary['unknown_tool_calls']} to unknown tools); abort rate {summary['abort_rate']:.3f} "
        f"({summary['aborted_trials']}/{summary['trials']} trials); terminations {summary['terminations']}"
    )
    if summary.get("confidence"):
        out.print(f"[…] = {summary['confidence']:.0%} bootstrap CI over tasks")
    if summary.get("unscored_trials"):
        out.print(
            f"{summary['unscored_trials']} trial(s) ended on an endpoint error and are not scored: "
            f"tasks {', '.join(summary['incomplete_tasks'])} are left out of every rate above",
            style="yellow",
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "policy"


def register(app: typer.Typer) -> None:
    eval_app = typer.Typer(
        help="Evaluate a policy endpoint against the user simulator (pass^k, pass@k, subsets, CIs); "
        "`eval summarize` re-scores a results file.",
        invoke_without_command=True,
        no_args_is_help=False,
    )
    app.add_typer(eval_app, name="eval")
    eval_app.callback(invoke_without_command=True)(eval_cmd)
    eval_app.command("summarize")(summarize_cmd)


def eval_cmd(
    ctx: typer.Context,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Experiment file: limits, split, sampling, evaluation settings.")
    ] = None,
    policy_url: Annotated[
        str | None,
        typer.Option(
            "--policy-url",
            help="Policy base URL, e.g. http://127.0.0.1:8000/v1 "
            f"(default: ${C.ENV_POLICY_BASE_URL}, set by the launcher).",
        ),
    ] = None,
    policy_model: Annotated[
        str | None, typer.Option("--policy-model", help="Served policy model name (default: spec policy model).")
    ] = None,
    user_url: Annotated[
        str | None,
        typer.Option(
            "--user-url",
            help="User simulator base URL (default: spec user_simulator.url, "
            f"else ${C.ENV_SIMULATOR_BASE_URL}, set by the launcher).",
        ),
    ] = None,
    user_model: Annotated[
        str | None, typer.Option("--user-model", help="Served simulator model name (default: spec).")
    ] = None,
    tasks: Annotated[
        str | None, typer.Option("--tasks", help="Comma-separated task ids (default: the split's tasks).")
    ] = None,
    subset: Annotated[
        str | None, typer.Option("--subset", help="Only this subset of the split (train, test, unseen, …).")
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option("--samples", "-n", min=1, max=MAX_SAMPLES, help="Trials per task (default: spec)."),
    ] = None,
    k: Annotated[str | None, typer.Option("--k", help="k values, e.g. 1,2,4 (default: spec).")] = None,
    seed: Annotated[
        list[int] | None,
        typer.Option("--seed", min=0, max=MAX_RANDOM_SEED, help="Base seed(s); trials of several seeds are pooled."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, max=MAX_CONCURRENCY, help="Episodes in flight (default: spec)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Directory for results.jsonl, trajectories.jsonl, summary.json."),
    ] = None,
    retries: Annotated[
        int, typer.Option("--retries", min=1, max=100, help="Attempts per request (timeouts, 5xx).")
    ] = 4,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, max=86_400, help="Seconds per request.")] = 300.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Evaluate a policy endpoint: n trials per task, graded once each, summarised with pass^k and pass@k."""
    if ctx.invoked_subcommand is not None:
        return
    # deferred: the spec's pydantic models (~0.2 s)
    from longhaul.spec import SpecError, load_specs
    from longhaul.spec.models import ExperimentSpec

    exp_spec = ExperimentSpec()
    if spec is not None:
        try:
            exp_spec = load_specs([spec])[0].spec
        except SpecError as exc:
            fail_on_spec_error(exc)
    policy_url = policy_url or os.environ.get(C.ENV_POLICY_BASE_URL)
    user_url = user_url or exp_spec.user_simulator.url or os.environ.get(C.ENV_SIMULATOR_BASE_URL)
    if not policy_url or not user_url:
        missing = [n for n, v in (("--policy-url", policy_url), ("--user-url", user_url)) if not v]
        err.print(
            f"error {' and '.join(missing)} missing: give the OpenAI-compatible base URL(s) "
            "(e.g. http://127.0.0.1:8000/v1), or a spec with user_simulator.url"
        )
        raise typer.Exit(2)
    _run_eval(
        exp_spec,
        policy_url,
        policy_model,
        user_url,
        user_model,
        tasks,
        subset,
        samples,
        _parse_ks(k),
        seed,
        concurrency,
        output,
        retries,
        timeout,
        as_json,
        progress,
    )


def summarize_cmd(
    results: Annotated[
        Path,
        typer.Argument(help="Per-trial JSONL (task_id, trial, success, subset[s]).", exists=True, dir_okay=False),
    ],
    k: Annotated[str | None, typer.Option("--k", help="k values, e.g. 1,2,4 (default: 1,2,4,8 up to n).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    bootstrap: Annotated[
        int, typer.Option("--bootstrap", min=0, max=MAX_BOOTSTRAP, help="Bootstrap resamples for CIs (0 = none).")
    ] = 1000,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            min=0,
            max=MAX_RANDOM_SEED,
            help="Seed of the bootstrap resampling (an evaluation's first seed reproduces its CIs).",
        ),
    ] = 0,
    null_floor: Annotated[bool, typer.Option(help="Add the do-nothing agent's floor (airline task ids).")] = True,
) -> None:
    """Recompute every metric from per-trial records (old runs can be re-scored)."""
    # deferred: the spec's pydantic models via eval.evaluate (~0.2 s)
    from longhaul.eval.evaluate import load_records, summarize_evaluation

    try:
        records = load_records(results)
    except ValueError as exc:  # bounded.InputError: names the file and line, the limit and a fix
        err.print(f"error {exc}")
        raise typer.Exit(2) from None
    try:
        summary = summarize_evaluation(
            records, _parse_ks(k), bootstrap=bootstrap, confidence=confidence, seed=seed, null_floor=null_floor
        )
    except (ValueError, KeyError) as exc:
        err.print(f"error {results}: {exc.args[0] if exc.args else exc}")
        raise typer.Exit(2) from None
    if as_json:
        out.print_json(json.dumps(summary))
    else:
        print_summary(summary)


def _run_eval(
    exp_spec: Any,
    policy_url: str,
    policy_model: str | None,
    user_url: str,
    user_model: str | None,
    tasks: str | None,
    subset: str | None,
    samples: int | None,
    ks: list[int] | None,
    seeds: list[int] | None,
    concurrency: int | None,
    output: Path | None,
    retries: int,
    timeout: float,
    as_json: bool,
    progress: bool,
) -> None:
    """`longhaul eval` as a recipe: the tasks and the sampling from the options and the spec, one evaluation job
    (`longhaul.eval.driver`), its trials with a progress bar, the summary written and printed."""
    # deferred: httpx via the chat clients and the evaluation driver, the spec's models (~0.3 s)
    from longhaul.clients.openai_compat import RetryPolicy
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.eval.driver import Endpoint, EvalJob
    from longhaul.eval.evaluate import EvalPlan, build_run_info

    ev = exp_spec.evaluation
    limits = EpisodeLimits.from_spec(exp_spec)
    split, task_ids = _resolve_tasks(exp_spec, tasks, subset)
    n, ks, seeds = _resolve_sampling(ev, samples, ks, seeds)
    policy_model = policy_model or exp_spec.policy.model.name
    user_model = user_model or exp_spec.user_simulator.model.name
    conc = concurrency or ev.concurrency
    out_dir = output or Path("runs") / "eval" / _slug(policy_model)
    job = EvalJob(
        spec=exp_spec,
        plan=EvalPlan(task_ids, n, seeds),
        split=split,
        limits=limits,
        policy=Endpoint(policy_url, policy_model, os.environ.get(C.ENV_POLICY_API_KEY)),
        user=Endpoint(user_url, user_model, os.environ.get(C.ENV_USER_SIM_API_KEY)),
        concurrency=conc,
        results_path=out_dir / EVAL_RESULTS_FILE,
        trajectories_path=out_dir / EVAL_TRAJECTORIES_FILE,
        run_info=build_run_info(policy_model, user_model, limits, split),
        retry=RetryPolicy(attempts=retries, timeout_s=timeout),
        max_connections=max(conc, 1) * 2,
    )
    _start_output(job, out_dir)
    records = _run_trials(job, progress)
    _report(job, records, ks, out_dir, as_json)


def _resolve_tasks(exp_spec: Any, tasks: str | None, subset: str | None) -> tuple[Split, list[str]]:
    """The split of the spec and the task ids to evaluate (`--tasks`, else `--subset`, else the split's); exit 2
    naming the problem for an unknown subset or task id."""
    # deferred: the spec's pydantic models via eval.evaluate (~0.2 s), the airline task data
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.airline.tasks import load_tasks
    from longhaul.eval.evaluate import select_tasks

    known = list(load_tasks())
    try:
        split = build_split(exp_spec.environment.split, known_ids=known)
        task_ids = select_tasks(split, subset, split_ids(tasks, "--tasks") if tasks else None)
        known_set = set(known)
        bad = [t for t in task_ids if t not in known_set]
        if bad:
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise ValueError(f"unknown task ids {bad[:10]}{more}; valid ids 0 … {len(known) - 1}")
    except ValueError as exc:
        err.print(f"error {exc}")
        raise typer.Exit(2) from None
    return split, task_ids


def _resolve_sampling(
    ev: Any, samples: int | None, ks: list[int] | None, seeds: list[int] | None
) -> tuple[int, list[int], list[int]]:
    """Trials per task and seed, the k values and the seeds (the options, else the spec's); exit 2 when the
    largest k needs more trials per task than that."""
    n = samples or ev.samples_per_task
    ks = ks or list(ev.k)
    seeds = list(seeds) if seeds else list(ev.seeds)
    if max(ks) > n * len(seeds):
        err.print(f"error --k {max(ks)} needs at least that many trials per task (n = {n} × {len(seeds)} seed(s))")
        raise typer.Exit(2)
    return n, ks, seeds


def _start_output(job: EvalJob, out_dir: Path) -> None:
    """A fresh output directory (earlier results and trajectories removed) and the header line on stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in (job.results_path, job.trajectories_path):
        p.unlink(missing_ok=True)
    plan = job.plan
    err.print(
        f"evaluating {job.policy.model} @ {redact_uri(job.policy.base_url)}: {len(plan.task_ids)} tasks × "
        f"{plan.samples * len(plan.seeds)} trials = {len(plan.trials())} episodes (user {job.user.model} @ "
        f"{redact_uri(job.user.base_url)}, concurrency {job.concurrency}, max_turns {job.limits.max_turns}) → "
        f"{out_dir}"
    )


def _run_trials(job: EvalJob, progress: bool) -> list[dict[str, Any]]:
    """Every trial of the job under a progress bar on stderr (episodes done, successes); exit 1 when an endpoint
    fails past its retries for too many of them."""
    # deferred: rich.progress (~10 ms) and httpx via the evaluation driver (~0.1 s)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # deferred: httpx via the evaluation driver (~0.1 s)
    from longhaul.envs.protocols import PolicyEndpointError
    from longhaul.eval.driver import run_evaluation

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, TextColumn("{task.fields[ok]} ok"), console=err, disable=not progress) as bar:
            task = bar.add_task("episodes", total=len(job.plan.trials()), ok=0)
            ok = 0

            def done(traj: Any) -> None:
                nonlocal ok
                ok += int(traj.outcome)
                bar.update(task, advance=1, ok=ok)

            return run_evaluation(job, on_done=done)
    except PolicyEndpointError as exc:
        err.print(f"error evaluation aborted: {exc}")
        err.print(f"finished trials so far are in {job.results_path}; no summary was written.")
        raise typer.Exit(1) from None


def _report(job: EvalJob, records: list[dict[str, Any]], ks: list[int], out_dir: Path, as_json: bool) -> None:
    """The summary (`longhaul.eval.driver.summarize`, with the run's facts) to `summary.json` and the terminal."""
    # deferred: httpx via the evaluation driver (~0.1 s)
    from longhaul.eval.driver import summarize

    summary = summarize(records, ks, job.spec.evaluation, job.plan.seeds)
    summary["run"] = dict(job.run_info)
    summary_path = out_dir / EVAL_SUMMARY_FILE
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if as_json:
        out.print_json(json.dumps(summary))
    else:
        print_summary(summary)
        out.print(f"results: {job.results_path}  trajectories: {job.trajectories_path}  summary: {summary_path}")
