"""Hostile and malformed input through every command of the CLI (issue 30): refused cleanly or accepted inert.

`data/hostile_inputs.yaml` holds the corpus: each case states the command line, its input files and the expected
outcome — refused (non-zero exit, one short error naming the field, file or option) or accepted (exit 0, or the
stated code) — and the runner (`support.hostile`) checks, for every case: the exit code, no traceback and no
exception escaping the CLI, no hang (SIGALRM), time and peak memory within bounds of the same command on valid
input (the corpus's `baselines`), nothing written in the sandbox (working directory and HOME), nothing executed
(no process started, no socket connected). The counts (cases, refused cleanly, accepted inert) go to the
reliability report (area "hostile input").

The CLI-wide rule is held over typer's registered commands, walked at test time, so a new command is covered
without editing this file: every command has corpus cases, and an exception no command foresaw becomes one line
naming what failed and a non-zero exit for every one of them (`longhaul --debug` shows the traceback).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support.hostile import (
    REFUSED,
    Outcome,
    check_bounds,
    command_path,
    load_corpus,
    prepare,
    registered_commands,
    run_case,
    summarize,
)

AREA = "hostile input"
#: The issue's classes; each has cases, and each has at least one case that fails on the code before its fix.
CLASSES = [str(n) for n in range(1, 12)]
#: The classes fixed by the issue's last change (with the CLI-wide rule, "beyond"): each has cases that fail on the
#: code just before it ("head"); the others were fixed earlier and fail on the code the issue was filed against.
LAST_CHANGE = ["1", "2", "5", "7", "9", "beyond"]
#: The whole corpus must run in this time on a loaded 2-core CI machine (measured, printed and reported).
WALL_BUDGET_S = 90.0

CASES, BASELINES = load_corpus()


def test_the_corpus_is_large_and_covers_every_class() -> None:
    ids = [c.id for c in CASES]
    assert len(CASES) >= 300, len(CASES)
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    classes = Counter(c.cls for c in CASES)
    assert set(CLASSES) <= set(classes), classes
    failing = {c.cls for c in CASES if c.old}
    assert set(CLASSES) <= failing, f"classes without a case that fails on the old code: {set(CLASSES) - failing}"
    on_head = {c.cls for c in CASES if c.old == "head"}
    assert set(LAST_CHANGE) <= on_head, set(LAST_CHANGE) - on_head
    assert {c.old for c in CASES} <= {None, "head", "filed"}
    assert {c.expect for c in CASES} == {REFUSED, "accepted"}
    for c in CASES:
        assert c.expect == "accepted" or c.names, f"{c.id}: a refusal must name what it refuses"


def test_every_registered_command_has_corpus_cases_and_a_baseline() -> None:
    commands = set(registered_commands())
    covered = Counter(command_path(c.argv) for c in CASES)
    missing = sorted(commands - set(covered))
    assert not missing, f"commands without hostile-input cases: {missing}"
    assert commands <= set(BASELINES), sorted(commands - set(BASELINES))


def test_hostile_input_corpus(tmp_path: Path, reliability: Any) -> None:
    t0 = time.perf_counter()
    prepare()
    baselines: dict[str, Outcome] = {}
    for key, case in BASELINES.items():
        run_case(case, tmp_path / "warm")  # imports and caches: the measured run is the second
        out = run_case(case, tmp_path / "baseline")
        assert not out.problems, (key, out.problems, out.output[-2000:])
        baselines[key] = out
    outcomes = []
    for case in CASES:
        out = run_case(case, tmp_path / "cases")
        if case.via == "cli":
            check_bounds(out, baselines[command_path(case.argv)])
        outcomes.append(out)
    wall = time.perf_counter() - t0
    counts = summarize(outcomes)
    slowest = sorted(outcomes, key=lambda o: -o.wall_s)[:3]
    print(
        f"hostile-input corpus: {counts['cases']} cases, {counts['refused_cleanly']} refused cleanly, "
        f"{counts['accepted_inert']} accepted inert, {counts['failed']} failed; {wall:.1f} s wall "
        f"(slowest: {', '.join(f'{o.case.id} {o.wall_s:.1f} s' for o in slowest)})"
    )
    refusals = [o for o in outcomes if o.case.expect == REFUSED]
    accepted = [o for o in outcomes if o.case.expect != REFUSED]
    took = f"{len(outcomes)} cases × every command, {wall:.0f} s"
    for what, group, lost in (
        (f"refused cleanly, one error naming the field or file ({took})", refusals, "tracebacks, hangs, writes, wrong"),
        ("accepted inert, nothing written or executed", accepted, "writes, executions, refusals"),
    ):
        bad = sum(1 for o in group if o.problems)
        reliability(AREA, what, injected=len(group), survived=len(group) - bad, lost=bad, lost_what=lost)
    failures = [
        f"{o.case.id} ({' '.join(o.case.argv)[:120]}): {'; '.join(o.problems)}\n    output: {o.output[-600:]!r}"
        for o in outcomes
        if o.problems
    ]
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures)
    assert wall < WALL_BUDGET_S * 2, f"the corpus took {wall:.0f} s (budget {WALL_BUDGET_S:.0f} s)"


def _required_args(cmd: Any, scratch: Path) -> list[str]:
    """Values that get `cmd`'s required parameters past parsing (the callback never runs them): every required
    parameter of the CLI is a path or a name, and an existing file's path is both."""
    args: list[str] = []
    value = str(scratch / "input.yaml")
    for p in cmd.params:
        if p.required:
            args += [p.opts[0], value] if p.param_type_name == "option" else [value]
    return args


@pytest.mark.parametrize("command", registered_commands())
def test_an_unexpected_error_is_one_line_for_every_command(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a command raises that it did not foresee: exit 1, one line on stderr that names the command's
    input file and the error (its first line only; no traceback, no chained cause); `--debug` lets it through."""
    import typer.main
    from typer.testing import CliRunner

    from longhaul.cli import app

    (tmp_path / "input.yaml").write_text("x: 1\n")
    real = typer.main.get_command

    def get_command(typer_app: Any) -> Any:
        root = real(typer_app)
        node = root
        for word in command.split():
            node = node.commands[word]

        def boom(*a: Any, **k: Any) -> None:
            raise RuntimeError("boom: first line\nsecond line, joined into the one line") from KeyError("cause")

        node.callback = boom
        return root

    monkeypatch.setattr("typer.testing._get_command", get_command)
    leaf = real(app)
    for word in command.split():
        leaf = leaf.commands[word]
    args = [*command.split(), *_required_args(leaf, tmp_path)]
    res = CliRunner().invoke(app, args)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.exit_code == 1 and not isinstance(res.exception, RuntimeError), (res.exit_code, res.exception)
    assert len(lines) == 1 and "unexpected RuntimeError (boom: first line second line" in lines[0], res.stderr
    assert "Traceback" not in res.output and "KeyError" not in res.output
    if _required_args(leaf, tmp_path):
        assert str(tmp_path / "input.yaml") in lines[0], lines[0]
    debug = CliRunner().invoke(app, ["--debug", *args])
    assert isinstance(debug.exception, RuntimeError)


_RAISING_ENTRY_POINT = """
import sys
import typer.main
from longhaul import cli

real = typer.main.get_command


def get_command(app):
    root = real(app)

    def boom(**kwargs):
        raise RuntimeError("boom")

    root.commands["schema"].callback = boom
    return root


typer.main.get_command = get_command
sys.argv = ["longhaul", *sys.argv[1:]]
cli.main()
"""


def test_the_console_entry_point_prints_one_line_and_debug_the_traceback() -> None:
    """The real entry point (`longhaul.cli.main`, what the console script runs), in a process of its own: an
    unexpected error is one line and exit 1; `longhaul --debug` prints Python's traceback instead."""
    import subprocess
    import sys

    plain = subprocess.run([sys.executable, "-c", _RAISING_ENTRY_POINT, "schema"], capture_output=True, text=True)
    assert plain.returncode == 1, plain
    assert plain.stderr.strip().count("\n") == 0 and "unexpected RuntimeError (boom)" in plain.stderr, plain.stderr
    debug = subprocess.run(
        [sys.executable, "-c", _RAISING_ENTRY_POINT, "--debug", "schema"], capture_output=True, text=True
    )
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr, debug.stderr
    assert "RuntimeError: boom" in debug.stderr
