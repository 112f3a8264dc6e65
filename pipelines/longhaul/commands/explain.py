"""`longhaul explain`: per-turn PRM-Lite rule hits, process and reward, and each estimator's token advantages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _load_trajectories(path: Path) -> list[dict[str, Any]]:
    """A trajectory JSON object, a JSON list of them, or JSONL (one per line); records wrapping the trajectory
    under a `trajectory` key are unwrapped."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from exc
    out_items = []
    for i, it in enumerate(items):
        if isinstance(it, dict) and "trajectory" in it and isinstance(it["trajectory"], dict):
            it = it["trajectory"]
        if not isinstance(it, dict) or "turns" not in it:
            raise ValueError(f"{path}: item {i} is not a trajectory record (no 'turns'); expected the episode runner's JSON")
        out_items.append(it)
    return out_items


def _short(s: str, n: int = 100) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _print(report: dict[str, Any]) -> None:
    st = report["settings"]
    out.print(
        f"estimator {report['estimator']}  credit={st['credit']}  process={st['process']} (weight {st['weight']})  "
        f"alpha={st['alpha']} unit={st['discount_unit']} p={st['length_exponent']} seed_compat={st['seed_compat']}  "
        f"group of {report['group_size']}"
    )
    for tr in report["trajectories"]:
        out.print(
            f"\n[bold]task {tr['task_id']} trial {tr['trial']}[/bold]  termination={tr['termination']}  "
            f"outcome={tr['outcome']:.0f}  process={tr['process']:+.4f} (raw {tr['process_raw']:+.4f}, "
            f"mean step {tr['mean_step_score']:+.4f})  reward={tr['reward']:+.4f}"
            + ("" if tr["process_in_reward"] else "  \\[process not in reward]"),
            markup=True,
        )
        table = Table(show_lines=False, pad_edge=False)
        for col in ("turn", "action", "rules fired", "share", *report_advantage_columns(tr)):
            table.add_column(col)
        for t in tr["turns"]:
            if t["tool_calls"]:
                action = "; ".join(
                    f"{c['name']}({_short(c['arguments'] or '', 60)})"
                    + (" ERROR" if c["is_error"] else "") + ("" if c["known_tool"] else " UNKNOWN")
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
            table.add_row(str(t["index"]), action, rules or "", f"{t['process_share']:+.4f}", *advs)
        out.print(table)
        if tr["trajectory_hits"]:
            out.print("trajectory rules: " + ", ".join(f"{h['rule']} {h['weight']:+.3f}" for h in tr["trajectory_hits"]))
        if tr["unknown_tool_calls"] or tr["unparsed_tool_calls"]:
            out.print(f"unknown tool calls: {tr['unknown_tool_calls']}, unparsable calls: {tr['unparsed_tool_calls']}")


def report_advantage_columns(tr: dict[str, Any]) -> list[str]:
    return [f"A {name} (first…last)" for name in tr["advantages"]]


def register(app: typer.Typer) -> None:
    @app.command()
    def explain(
        files: Annotated[list[Path], typer.Argument(help="Trajectory JSON/JSONL files; together they form one group.")],
        spec: Annotated[Path | None, typer.Option("--spec", help="Experiment YAML (reward and algorithm settings).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Explain trajectories: PRM-Lite rules per turn, process score, reward and each estimator's advantages."""
        from longhaul.algos.explain import build_explanation
        from longhaul.spec import SpecError, load_specs
        from longhaul.spec.models import Experiment

        if spec is not None:
            try:
                (exp,) = load_specs([spec])
            except SpecError as exc:
                from longhaul.commands.spec import fail_on_spec_error

                fail_on_spec_error(exc)
        else:
            exp = Experiment(apiVersion="longhaul.dev/v1alpha1", kind="Experiment", metadata={"name": "explain"})
        trajs: list[dict[str, Any]] = []
        for f in files:
            try:
                trajs.extend(_load_trajectories(f))
            except (OSError, ValueError) as exc:
                err.print(f"error {exc}")
                raise typer.Exit(2) from None
        report = build_explanation(trajs, exp)
        if as_json:
            out.print_json(json.dumps(report))
        else:
            _print(report)
