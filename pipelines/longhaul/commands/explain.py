"""`longhaul explain`: per-turn PRM-Lite rule hits, process and reward, per-turn credit (baseline and advantage
of each turn with `credit: turn`) and each estimator's token advantages. Reads trajectory files or directories
of `*.jsonl` traces (bounded by `longhaul.bounded.TRAJECTORIES`: size, line length, records, nesting)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from longhaul import bounded
from longhaul.commands import fail_on_spec_error, plain_console, table_console
from longhaul.envs.records import check_trajectory_record

out = table_console()
err = plain_console(stderr=True)


def _trace_files(path: Path) -> list[Path]:
    """The files behind one argument: a file itself, or every `*.jsonl` file under a directory (recursively,
    sorted by path: a run's `rollouts/` directory)."""
    if path.is_dir():
        files = sorted((p for p in path.rglob("*.jsonl") if p.is_file()), key=_natural_key)
        if not files:
            raise ValueError(f"{path}: directory has no *.jsonl files")
        return files
    return [path]


def _natural_key(path: Path) -> list[Any]:
    """Sort key that orders step_2 before step_10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path.as_posix())]


def _load_trajectories(path: Path) -> tuple[list[dict[str, Any]], list[Any], int]:
    """(trajectories, group keys, skipped) from a trajectory JSON object, a JSON list of them, or JSONL (one per
    line). Records wrapping the trajectory under a `trajectory` key (rollout traces, `longhaul.agentloop.traces`)
    are unwrapped; their `uid` (veRL's group id) is the group key (None otherwise); a trace without a
    trajectory (a failed rollout) is skipped and counted."""
    items = bounded.read_json_records(path, bounded.TRAJECTORIES, expected="trajectory JSON, or one per line")
    out_items, keys, skipped = [], [], 0
    for i, it in enumerate(items):
        key = None
        if isinstance(it, dict) and "trajectory" in it:
            if it["trajectory"] is None:
                skipped += 1
                continue
            key = it.get("uid")
            it = it["trajectory"]
        if not isinstance(it, dict) or "turns" not in it:
            raise ValueError(
                f"{path}: item {i} is not a trajectory record (no 'turns'); expected the episode runner's JSON"
            )
        try:
            check_trajectory_record(it)
        except ValueError as exc:
            raise ValueError(f"{path}: item {i} {exc}; expected the episode runner's JSON") from None
        out_items.append(it)
        keys.append(key)
    return out_items, keys, skipped


def _short(s: str, n: int = 100) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _print(report: dict[str, Any]) -> None:
    st = report["settings"]
    out.print(
        f"estimator {report['estimator']}  credit={st['credit']}  process={st['process']} (weight {st['weight']})  "
        f"alpha={st['alpha']} unit={st['discount_unit']} p={st['length_exponent']} seed_compat={st['seed_compat']}  "
        + (
            f"group of {report['group_size']}"
            if report["num_groups"] <= 1
            else f"{report['group_size']} trajectories in {report['num_groups']} groups (by rollout uid)"
        )
    )
    for tr in report["trajectories"]:
        out.print(
            f"\n[bold]task {escape(str(tr['task_id']))} trial {escape(str(tr['trial']))}[/bold]"
            + (f"  group {escape(str(tr['group']))}" if report["num_groups"] > 1 else "")
            + f"  termination={escape(str(tr['termination']))}  "
            f"outcome={tr['outcome']:.0f}  process={tr['process']:+.4f} (raw {tr['process_raw']:+.4f}, "
            f"mean step {tr['mean_step_score']:+.4f})  reward={tr['reward']:+.4f}"
            + ("" if tr["process_in_reward"] else "  \\[process not in reward]"),
            markup=True,
        )
        credit = tr.get("credit")
        if credit is not None:
            out.print(
                f"credit: turn  trajectory-level reward {credit['trajectory_reward']:+.4f} -> term "
                f"{credit['trajectory_advantage']:+.4f} on every turn; A turn = that + (w·share − baseline)"
                + (" / max(group std of trajectory-level rewards, 1)" if st["norm_adv_by_std"] else "")
                + ", before the estimators' multipliers"
            )
        versions = [t["policy_version"] for t in tr["turns"] if t.get("policy_version")]
        if versions:
            first, last = min(v[0] for v in versions), max(v[1] for v in versions)
            out.print(
                f"policy versions {first}…{last}"
                + (" (an asynchronous trainer's update came mid-episode)" if last > first else "")
                + "".join(f"; turn {t['index']} resumed across {_version(t)}" for t in tr["turns"] if _resumed(t))
            )
        table = Table(show_lines=False, pad_edge=False)
        credit_cols = ("w·share", "baseline (n)", "A turn") if credit is not None else ()
        version_col = ("policy v",) if versions else ()
        advantage_cols = report_advantage_columns(tr)
        for col in ("turn", *version_col, "action", "rules fired", "share", *credit_cols, *advantage_cols):
            table.add_column(col)
        for t in tr["turns"]:
            if t["tool_calls"]:
                action = "; ".join(
                    f"{c['name']}({_short(c['arguments'] or '', 60)})"
                    + (" ERROR" if c["is_error"] else "")
                    + ("" if c["known_tool"] else " UNKNOWN")
                    + (" UNPARSED" if c["parse_error"] else "")
                    for c in t["tool_calls"]
                )
            else:
                action = ("to user: " if t["to_user"] else "") + _short(t["content"], 80)
            rules = "; ".join(
                f"{s['tool']}: " + (", ".join(f"{h['rule']} {h['weight']:+.3f}" for h in s["hits"]) or "-")
                for s in t["steps"]
            )
            advs = []
            for name in tr["advantages"]:
                a = tr["advantages"][name][t["index"]]
                advs.append("-" if a is None else f"{a['first']:+.3f}…{a['last']:+.3f}")
            cells = []
            if credit is not None:
                c = t.get("credit")
                cells = (
                    ["-"] * 3
                    if c is None
                    else [f"{c['share']:+.4f}", f"{c['baseline']:+.4f} ({c['siblings']})", f"{c['advantage']:+.4f}"]
                )
            version_cell = (_version(t),) if versions else ()
            table.add_row(
                str(t["index"]), *version_cell, action, rules or "", f"{t['process_share']:+.4f}", *cells, *advs
            )
        out.print(table)
        if tr["trajectory_hits"]:
            out.print(
                "trajectory rules: " + ", ".join(f"{h['rule']} {h['weight']:+.3f}" for h in tr["trajectory_hits"])
            )
        if tr["unknown_tool_calls"] or tr["unparsed_tool_calls"]:
            out.print(f"unknown tool calls: {tr['unknown_tool_calls']}, unparsable calls: {tr['unparsed_tool_calls']}")


def _version(turn: dict[str, Any]) -> str:
    """A turn's policy weights version: `3`, or `3→4` for a generation resumed after a weight update."""
    v = turn.get("policy_version")
    if not v:
        return "-"
    return str(v[0]) if v[0] == v[1] else f"{v[0]}→{v[1]}"


def _resumed(turn: dict[str, Any]) -> bool:
    v = turn.get("policy_version")
    return bool(v) and v[0] != v[1]


def report_advantage_columns(tr: dict[str, Any]) -> list[str]:
    return [f"A {name} (first…last)" for name in tr["advantages"]]


def register(app: typer.Typer) -> None:
    @app.command()
    def explain(
        files: Annotated[
            list[Path],
            typer.Argument(
                help="Trajectory JSON/JSONL files, or directories (every *.jsonl under them, sorted, e.g. a run's "
                "rollouts/). Trajectories form one group, except rollout traces, which are grouped by their uid."
            ),
        ],
        spec: Annotated[
            Path | None, typer.Option("--spec", help="Experiment YAML (reward and algorithm settings).")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Explain trajectories: PRM-Lite rules per turn, process score, reward and each estimator's advantages."""
        # deferred: torch via the advantage estimators (~1 s) and the spec's pydantic models
        from longhaul.algos.explain import build_explanation
        from longhaul.spec import SpecError, load_specs
        from longhaul.spec.models import Experiment

        if spec is not None:
            try:
                (exp,) = load_specs([spec])
            except SpecError as exc:
                fail_on_spec_error(exc)
        else:
            exp = Experiment(apiVersion="longhaul.dev/v1alpha1", kind="Experiment", metadata={"name": "explain"})
        trajs: list[dict[str, Any]] = []
        keys: list[Any] = []
        skipped = 0
        for arg in files:
            try:
                for f in _trace_files(arg):
                    t, k, n = _load_trajectories(f)
                    trajs.extend(t)
                    keys.extend(k)
                    skipped += n
                    if len(trajs) > bounded.TRAJECTORIES.max_records:  # the same bound over all files together
                        raise ValueError(
                            f"{f}: more than {bounded.TRAJECTORIES.max_records:,} trajectories in all "
                            f"files together; {bounded.TRAJECTORIES.hint}"
                        )
            except (OSError, ValueError) as exc:
                err.print(f"error {exc}")
                raise typer.Exit(2) from None
        if skipped:
            err.print(f"note: skipped {skipped} trace record(s) without a trajectory (failed rollouts)")
        if not trajs:
            err.print("error no trajectories to explain")
            raise typer.Exit(2)
        report = build_explanation(trajs, exp, groups=keys)
        if as_json:
            out.print_json(json.dumps(report))
        else:
            _print(report)
