"""`longhaul env …`: look at the τ² airline tasks, check the grader with the gold actions, the null-agent floor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from longhaul.bounded import InputError, split_ids
from longhaul.commands import fail_on_spec_error, plain_console

out = plain_console()
err = plain_console(stderr=True)


def _ids(tasks: str | None) -> list[str] | None:
    """The ids of `--tasks` (bounded: `longhaul.bounded.TASK_IDS`); exits with a one-line error when too many."""
    if not tasks:
        return None
    try:
        return split_ids(tasks, "--tasks")
    except InputError as exc:
        err.print(f"error {exc}")
        raise typer.Exit(2) from None


def _split(preset: str | None, spec: Path | None):
    # deferred: the airline task data (~10 ms); `longhaul --help` loads no command's dependencies
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.airline.tasks import load_tasks

    known = list(load_tasks())
    if spec is not None:
        from longhaul.spec import SpecError, load_specs  # deferred: the spec's pydantic models (~0.2 s)

        try:
            exp = load_specs([spec])[0]
        except SpecError as exc:
            fail_on_spec_error(exc)
        return build_split(exp.spec.environment.split, known_ids=known)
    try:
        return build_split(preset or "seed_40_10", known_ids=known)
    except ValueError as exc:
        err.print(f"error --split: {exc}")
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add `longhaul env` and its commands to `app`."""
    env_app = typer.Typer(
        help="τ²-bench airline environment: tasks, gold replay, null-agent floor.", no_args_is_help=True
    )
    app.add_typer(env_app, name="env")
    env_app.command("replay-gold")(replay_gold_cmd)
    env_app.command("tasks")(tasks_cmd)
    env_app.command("floor")(floor_cmd)


def replay_gold_cmd(
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task ids (default: all).")] = None,
    communicate: Annotated[bool, typer.Option(help="Also say the required strings.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Replay every task's gold actions through the environment and grader; exit 1 unless all score 1."""
    from longhaul.envs.airline.env import replay_gold  # deferred: tau2's vendored pydantic data model (~0.15 s)
    from longhaul.envs.airline.tasks import get_task, load_tasks  # deferred: the airline task data (~10 ms)

    ids = _ids(tasks) or list(load_tasks())
    try:
        for t in ids:
            get_task(t)
    except KeyError as exc:
        err.print(f"error --tasks: {exc.args[0]}")
        raise typer.Exit(2) from None
    grades = {t: replay_gold(t, communicate=communicate) for t in ids}
    ok = sum(1 for g in grades.values() if g.success)
    if as_json:
        doc = {
            "passed": ok,
            "total": len(ids),
            "tasks": {
                t: {
                    "reward": g.reward,
                    "db_match": g.db_match,
                    "communicated": g.communicated,
                    "details": g.details,
                }
                for t, g in grades.items()
            },
        }
        out.print_json(json.dumps(doc))
    else:
        for t, g in grades.items():
            mark = "ok  " if g.success else "FAIL"
            out.print(f"{mark} task {t:>3}: reward {g.reward:.1f}  db_match={g.db_match} communicated={g.communicated}")
        out.print(f"{ok}/{len(ids)}")
    if ok != len(ids):
        raise typer.Exit(1)


def tasks_cmd(
    split: Annotated[str | None, typer.Option("--split", help="seed_40_10 | tau2_official.")] = None,
    spec: Annotated[Path | None, typer.Option("--spec", help="Take the split from this Experiment file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the airline tasks with their subset labels in a split."""
    from longhaul.envs.airline.tasks import load_tasks  # deferred: the airline task data (~10 ms)

    sp = _split(split, spec)
    rows = []
    for tid, t in load_tasks().items():
        rows.append(
            {
                "task_id": tid,
                "subset": sp.primary(tid),
                "subsets": sp.labels(tid),
                "gold_actions": len(t.actions),
                "writes": t.writes,
                "communicate_info": list(t.communicate_info),
                "purpose": t.purpose,
            }
        )
    if as_json:
        out.print_json(json.dumps({"split": sp.name, "tasks": rows}))
        return
    table = Table(title=f"airline tasks, split {sp.name}")
    for col in ("id", "subsets", "gold", "writes", "communicate", "purpose"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["task_id"],
            ",".join(r["subsets"]) or "-",
            str(r["gold_actions"]),
            "yes" if r["writes"] else "",
            ",".join(r["communicate_info"]),
            r["purpose"][:60],
        )
    out.print(table)
    counts = ", ".join(f"{k} {len(v)}" for k, v in sp.subsets.items())
    out.print(f"{len(rows)} tasks; {counts}")


def floor_cmd(
    split: Annotated[str | None, typer.Option("--split", help="seed_40_10 | tau2_official.")] = None,
    spec: Annotated[Path | None, typer.Option("--spec", help="Take the split from this Experiment file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """pass^1 of an agent that does nothing (the conversation ends normally), overall and per subset."""
    from longhaul.envs.airline.env import null_agent_outcomes  # deferred: tau2's vendored pydantic data model (~0.15 s)

    sp = _split(split, spec)
    floor = null_agent_outcomes()
    doc = {
        "split": sp.name,
        "all": _mean(floor, list(floor)),
        "subsets": {k: _mean(floor, v) for k, v in sp.subsets.items()},
        "passing_tasks": [t for t, v in floor.items() if v],
    }
    if as_json:
        out.print_json(json.dumps(doc))
        return
    out.print(f"null-agent pass^1: all {doc['all']['rate']:.3f} ({doc['all']['c_over_n']})")
    for k, v in doc["subsets"].items():
        out.print(f"  {k:<15} {v['rate']:.3f} ({v['c_over_n']})")


def _mean(floor: dict[str, float], ids: list[str]) -> dict[str, object]:
    c = int(sum(floor[t] for t in ids))
    return {"rate": c / len(ids) if ids else 0.0, "c_over_n": f"{c}/{len(ids)}"}
