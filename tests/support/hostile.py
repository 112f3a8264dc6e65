"""The hostile-input corpus (`tests/reliability/data/hostile_inputs.yaml`) and its in-process runner.

Every case runs the real CLI (`longhaul.cli.app`, through `typer.testing.CliRunner`) inside this process, in a
fresh sandbox directory that is its working directory and HOME. Around each case:

- a SIGALRM timer (`HANG_S`): a handler that raises interrupts even a blocking `open()` of a FIFO, so a hang is a
  finding, not a stuck test;
- peak memory: the process's resident high-water mark is reset (`/proc/self/clear_refs`) before and read
  (`VmHWM`) after, so the peak of this one case is measured, at no cost to the case;
- nothing executed: `subprocess.Popen`, `os.system`, the `exec*`/`spawn*`/`fork` family and socket connections
  raise `Executed` (a BaseException: no `except Exception` in the product can swallow it);
- nothing written: the sandbox tree (names, sizes, modification times) is compared before and after; an accepted
  case may list the paths it is meant to write (`writes`).

A few cases (`via: process`) need a real process: the console entry point and `--debug`'s traceback.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "reliability" / "data" / "hostile_inputs.yaml"
#: A case that has not answered after this many seconds hangs.
HANG_S = 30.0
#: A case may take this many times its command's time on valid input, and at least `MIN_TIME_S`.
TIME_FACTOR = 10.0
MIN_TIME_S = 3.0
#: A case may use this much more peak memory than its command on valid input (MiB).
MEMORY_SLACK_MIB = 256
#: Outcomes.
REFUSED, ACCEPTED = "refused", "accepted"


class Executed(BaseException):
    """A case started a process or opened a network connection."""


class CaseTimeout(BaseException):
    """A case did not answer within `HANG_S`."""


@dataclass(frozen=True)
class Case:
    """One command line with its input files and the expected outcome."""

    id: str
    cls: str  # the class (1-11) or "beyond"
    argv: tuple[str, ...]
    files: dict[str, Any]
    expect: str  # REFUSED or ACCEPTED
    names: tuple[str, ...] = ()  # what a refusal must name (field, file, option); an accepted case's output holds
    exit: int | None = None  # the exact exit code, when it matters
    writes: tuple[str, ...] = ()  # paths an accepted case may create (prefixes, relative to the sandbox)
    old: str | None = None  # "head" / "filed": the older tree the case fails on (see the data file)
    via: str = "cli"  # "cli" (in process) or "process" (a real `python -m longhaul.cli`)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What one case did."""

    case: Case
    exit_code: int | None = None
    output: str = ""
    wall_s: float = 0.0
    peak_mib: float = 0.0
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# The corpus


def _expand(entry: dict[str, Any], group: dict[str, Any]) -> list[Case]:
    argvs = group.get("commands") or [entry["argv"]]
    files = {**copy.deepcopy(group.get("files", {})), **copy.deepcopy(entry.get("files", {}))}
    if "set" in entry or "unset" in entry or "spec" in entry:
        base = {"spec": entry.get("spec", group.get("spec", "smoke"))}
        files["spec.yaml"] = {**base, "set": entry.get("set", {}), "unset": entry.get("unset", [])}
    names = entry.get("names", group.get("names", ()))
    out = []
    for argv in argvs:
        suffix = "" if len(argvs) == 1 else "@" + "-".join(a.lstrip("-") for a in argv if not a.endswith(".yaml"))
        out.append(
            Case(
                id=entry["id"] + suffix,
                cls=str(entry.get("class", group.get("class"))),
                argv=tuple(_arg(a) for a in argv),
                files=files,
                expect=entry.get("expect", group.get("expect", REFUSED)),
                names=tuple([names] if isinstance(names, str) else names),
                exit=entry.get("exit", group.get("exit")),
                writes=tuple(entry.get("writes", group.get("writes", ()))),
                old=entry.get("old", group.get("old")),
                via=entry.get("via", "cli"),
                env=dict(entry.get("env", {})),
            )
        )
    return out


def _arg(value: Any) -> str:
    """One argv word: a string, a number, or `{repeat, times, prefix, suffix}` for a long one."""
    if isinstance(value, dict):
        return value.get("prefix", "") + value["repeat"] * value["times"] + value.get("suffix", "")
    return str(value)


def load_corpus(path: Path = CORPUS) -> tuple[list[Case], dict[str, Case]]:
    """(cases, baselines by command path) of the corpus file."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    cases: list[Case] = []
    for group in doc["groups"]:
        for entry in group["cases"]:
            cases.extend(_expand(entry, group))
    baselines = {
        key: Case(
            id=f"baseline:{key}",
            cls="baseline",
            argv=tuple(b["argv"]),
            files=b.get("files", {}),
            expect=ACCEPTED,
            exit=b.get("exit"),
            writes=tuple(b.get("writes", ())),
        )
        for key, b in doc["baselines"].items()
    }
    return cases, baselines


@functools.cache
def cli() -> Any:
    """The click command tree of `longhaul.cli.app`, built once (typer builds it anew for every call, ~50 ms)."""
    import typer.main

    from longhaul.cli import app

    return typer.main.get_command(app)


def command_path(argv: tuple[str, ...]) -> str:
    """The registered command an argv runs (`eval summarize`, `render`), from typer's own command tree."""
    node: Any = cli()
    words = []
    for arg in argv:
        if arg.startswith("-"):
            continue
        sub = getattr(node, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        node = sub
    return " ".join(words)


def registered_commands() -> list[str]:
    """Every leaf command path of `longhaul`, walked from typer's command tree (a new command is listed here
    without touching any test)."""
    out = []

    def walk(node: Any, prefix: list[str]) -> None:
        subs = getattr(node, "commands", None)
        if subs is None:
            out.append(" ".join(prefix))
            return
        if prefix and getattr(node, "invoke_without_command", False):
            out.append(" ".join(prefix))  # a group that is itself a command (`longhaul eval …`)
        for name, sub in subs.items():
            walk(sub, [*prefix, name])

    walk(cli(), [])
    return out


# ---------------------------------------------------------------------------------------------------------
# Input files


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _unset(doc: dict[str, Any], dotted: str) -> None:
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        node = node.get(k, {})
    node.pop(keys[-1], None)


@functools.cache
def _base_spec(stem: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "specs" / f"{stem}.yaml").read_text(encoding="utf-8"))


def _spec_text(kind: dict[str, Any]) -> str:
    doc = copy.deepcopy(_base_spec(kind["spec"]))
    for dotted in kind.get("unset", []):
        _unset(doc, dotted)
    for dotted, value in kind.get("set", {}).items():
        _set(doc, dotted, value)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def materialize(files: dict[str, Any], root: Path) -> None:
    """Create the case's input files under `root` (kinds: spec, text, json, jsonl, repeat, bytes, sparse, fifo,
    dir, symlink, copy)."""
    for name, kind in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(kind, str):
            path.write_text(kind, encoding="utf-8")
        elif "spec" in kind:
            path.write_text(_spec_text(kind), encoding="utf-8")
        elif "text" in kind:
            path.write_text(kind["text"], encoding="utf-8")
        elif "json" in kind:
            path.write_text(json.dumps(kind["json"]), encoding="utf-8")
        elif "jsonl" in kind:
            path.write_text("".join(json.dumps(r) + "\n" for r in kind["jsonl"]), encoding="utf-8")
        elif "repeat" in kind:
            path.write_text(kind.get("prefix", "") + kind["repeat"] * kind["times"] + kind.get("suffix", ""))
        elif "bytes" in kind:
            path.write_bytes(bytes.fromhex(kind["bytes"]))
        elif "sparse" in kind:
            with open(path, "wb") as fh:
                fh.write(kind.get("head", "").encode())
                fh.truncate(kind["sparse"])
        elif "fifo" in kind:
            os.mkfifo(path)
        elif "dir" in kind:
            path.mkdir(exist_ok=True)
            materialize(kind["dir"] or {}, path)
        elif "symlink" in kind:
            path.symlink_to(kind["symlink"])
        elif "copy" in kind:
            shutil.copy(ROOT / kind["copy"], path)
        else:  # pragma: no cover - a corpus error
            raise ValueError(f"unknown file kind {kind!r} for {name}")


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of everything under `root`, without following links or opening files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            # a directory's own size and time change with its entries: those are compared one by one
            out[os.path.relpath(p, root)] = (0, 0) if os.path.isdir(p) else (st.st_size, st.st_mtime_ns)
    return out


# ---------------------------------------------------------------------------------------------------------
# Guards around one case


def _raise_executed(*args: Any, **kwargs: Any) -> Any:
    raise Executed(f"started a process or connection: {str(args)[:200]}")


_PATCHED = (
    (subprocess, "Popen"),
    (os, "system"),
    (os, "fork"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    *((os, n) for n in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "spawnv", "spawnve")),
    (socket.socket, "connect"),
    (socket.socket, "connect_ex"),
)


@contextlib.contextmanager
def nothing_executed() -> Iterator[None]:
    """Within: starting a process or connecting a socket raises `Executed`."""
    saved = [(mod, name, getattr(mod, name)) for mod, name in _PATCHED if hasattr(mod, name)]
    for mod, name, _ in saved:
        setattr(mod, name, _raise_executed)
    try:
        yield
    finally:
        for mod, name, orig in saved:
            setattr(mod, name, orig)


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout(f"no answer after {HANG_S:.0f} s")


def _peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kib(key: str) -> int:
    m = re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(m.group(1)) if m else 0


# ---------------------------------------------------------------------------------------------------------
# Running


def _invoke_in_process(
    argv: tuple[str, ...], env: dict[str, str | None]
) -> tuple[int | None, str, BaseException | None]:
    """`longhaul ARGV` in this process, as `typer.testing.CliRunner.invoke` runs it (isolated streams and
    environment), on the command tree built once."""
    from typer.testing import CliRunner

    exc: BaseException | None = None
    with CliRunner().isolation(env=env) as streams:
        try:
            cli().main(args=list(argv), prog_name="longhaul")
            code: Any = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
        except Exception as e:  # noqa: BLE001 - an exception escaping the CLI is a finding
            code, exc = 1, e
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            out, err = streams[0].getvalue(), streams[1].getvalue()
    output = (out + err).decode("utf-8", errors="replace")
    return code if isinstance(code, int) else 1, output, exc


def _invoke_process(argv: tuple[str, ...], env: dict[str, str | None]) -> tuple[int | None, str, BaseException | None]:
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *argv], capture_output=True, text=True, env=full, timeout=HANG_S
    )
    return proc.returncode, proc.stdout + proc.stderr, None


def case_env(sandbox: Path) -> dict[str, str | None]:
    """The environment of a case: HOME in the sandbox, none of longhaul's endpoint variables."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("LONGHAUL_", "MLFLOW_"))}
    env["HOME"] = str(sandbox / "home")
    env["DO_NOT_TRACK"] = "true"  # MLflow's usage telemetry (it writes ~/.config/mlflow and reports home): off
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    return env


def prepare() -> None:
    """Once before the cases: what libraries do once per process at import — the platform probe
    (`platform.processor()` runs `uname -p`) and matplotlib's font list (`fc-list`, cached under the real HOME) —
    is done now, so that no case is charged with a process or a file it did not cause."""
    import importlib
    import platform

    platform.processor()
    # What commands import lazily, so that a case's time is its work, not a first import (mlflow and matplotlib
    # for compare: several seconds on a loaded machine, more than the commands' own time bound).
    for module in ("matplotlib.font_manager", "longhaul.tracking.compare", "longhaul.algos.explain"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def run_case(case: Case, workdir: Path, time_limit_s: float = HANG_S) -> Outcome:
    """Run one case in a fresh sandbox under `workdir` and check what it did against what the case expects
    (except the time and memory bounds, which need the baseline: `check_bounds`)."""
    out = Outcome(case)
    sandbox = workdir / re.sub(r"[^A-Za-z0-9_.-]", "_", case.id)[:80]
    sandbox.mkdir(parents=True)
    (sandbox / "home").mkdir()
    materialize(case.files, sandbox)
    before = snapshot(sandbox)
    env = {**case_env(sandbox), **case.env}
    cwd = os.getcwd()
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    exc: BaseException | None = None
    os.chdir(sandbox)
    rss0 = _status_kib("VmRSS")
    _peak_reset()
    t0 = time.perf_counter()
    try:
        if case.via == "process":
            out.exit_code, out.output, exc = _invoke_process(case.argv, env)
        else:
            signal.setitimer(signal.ITIMER_REAL, time_limit_s)
            with nothing_executed():
                out.exit_code, out.output, exc = _invoke_in_process(case.argv, env)
    except (Executed, CaseTimeout) as e:
        exc = e
    except BaseExceptionGroup as group:  # raised inside asyncio tasks: the first of ours, else the group
        ours = group.subgroup(lambda e: isinstance(e, Executed | CaseTimeout))
        exc = ours.exceptions[0] if ours is not None else group
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        out.wall_s = time.perf_counter() - t0
        out.peak_mib = max(0, _status_kib("VmHWM") - rss0) / 1024
        os.chdir(cwd)
    _check(out, exc, before, snapshot(sandbox))
    shutil.rmtree(sandbox, ignore_errors=True)
    return out


def _check(out: Outcome, exc: BaseException | None, before: dict, after: dict) -> None:
    case, p = out.case, out.problems
    if isinstance(exc, CaseTimeout):
        p.append(f"hang: {exc}")
        return
    if isinstance(exc, Executed):
        p.append(f"executed: {exc}")
        return
    if exc is not None:
        p.append(f"exception escaped the CLI: {type(exc).__name__}: {str(exc)[:200]}")
    if "Traceback (most recent call last)" in out.output and "--debug" not in case.argv:
        p.append("printed a traceback")
    if case.exit is not None and out.exit_code != case.exit:
        p.append(f"exit code {out.exit_code}, expected {case.exit}")
    if case.expect == REFUSED:
        if not out.exit_code:
            p.append("accepted, expected a refusal")
        if "--debug" not in case.argv and len([x for x in out.output.splitlines() if x.strip()]) > 40:
            p.append("a refusal of more than 40 lines")
    elif case.exit is None and out.exit_code != 0:
        p.append(f"exit code {out.exit_code}, expected acceptance (0)")
    for name in case.names:
        if name not in out.output:
            p.append(f"output does not name {name!r}")
    new = sorted(k for k in after.keys() - before.keys() if not any(k.startswith(w) for w in case.writes))
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    gone = sorted(before.keys() - after.keys())
    for what, paths in (("wrote", new), ("changed", changed), ("removed", gone)):
        if paths:
            p.append(f"{what} {', '.join(paths[:5])}")


def check_bounds(out: Outcome, baseline: Outcome) -> None:
    """Time and memory of a case against its command on valid input."""
    limit = max(MIN_TIME_S, TIME_FACTOR * baseline.wall_s)
    if out.wall_s > limit:
        out.problems.append(f"took {out.wall_s:.1f} s, over {limit:.1f} s ({TIME_FACTOR:g}x the valid input's)")
    mem_limit = baseline.peak_mib + MEMORY_SLACK_MIB
    if out.peak_mib > mem_limit:
        out.problems.append(f"peak memory +{out.peak_mib:.0f} MiB, over {mem_limit:.0f} MiB")


def summarize(outcomes: list[Outcome]) -> dict[str, int]:
    """Counts: cases, refused cleanly, accepted inert, failed."""
    ok = [o for o in outcomes if not o.problems]
    return {
        "cases": len(outcomes),
        "refused_cleanly": sum(1 for o in ok if o.case.expect == REFUSED),
        "accepted_inert": sum(1 for o in ok if o.case.expect == ACCEPTED),
        "failed": len(outcomes) - len(ok),
    }
