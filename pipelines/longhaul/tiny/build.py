"""Make (or reuse) the tiny local policy and user-simulator models: tokenizer, chat template, Qwen2 weights and
their warm starts. No model hub is involved; the result is cached under a content key.

The recipe (`longhaul.tiny.recipe`) runs in a child process with deterministic arithmetic
(`longhaul.tiny.arithmetic`): on one machine a key means the same weights; another CPU rounds differently, so the
build holds the models to their criteria (`longhaul.tiny.checks`): each warm start trains until its checks meet
them (`longhaul.tiny.gate`), and a build that never does is refused, nothing written.

Layout of `out_dir` (default `.cache/longhaul/models`, the paths specs/smoke.yaml uses):
  tiny-policy/   config.json, model.safetensors, tokenizer files, chat_template.jinja, longhaul-tiny.json
  tiny-user/     the same files (smaller; warm-started on scripted simulator conversations, `longhaul.tiny.simulator`)
  .longhaul-tiny.json   the build key and the build report; a matching key means "reuse"
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from longhaul.tiny.arithmetic import DETERMINISTIC_ENV, child_env
from longhaul.tiny.checks import CLOSE_BAND, STEP0_BAND, criteria, criteria_report
from longhaul.tiny.inputs import build_inputs, default_date_line
from longhaul.tiny.local_chat import step0_setup
from longhaul.tiny.models import POLICY_ARCH, USER_ARCH
from longhaul.tiny.recipe import CONFIG_FILE, REPORT_FILE
from longhaul.tiny.tokenizer import load_chat_template

#: Bump when the recipe changes in a way the key below cannot see (e.g. the training loop).
RECIPE_VERSION = 6  # 6: gated warm starts, decay to zero, per-machine deterministic arithmetic; 5: criteria
DEFAULT_OUT_DIR = Path(".cache/longhaul/models")
POLICY_DIRNAME = "tiny-policy"
USER_DIRNAME = "tiny-user"
MARKER = ".longhaul-tiny.json"

#: Torch threads of every build: reductions split by thread, so the weights depend on it (a test process that had
#: set one thread for a rollout server once built a different simulator under the same key).
BUILD_THREADS = 2


class TinyBuildError(RuntimeError):
    """The build failed or its models missed a criterion; nothing was written to the output directory."""


@dataclass(frozen=True)
class TinyBuildConfig:
    steps: int = 1600  # most warm-start steps of the policy (it stops at its first check that meets the criteria)
    seed: int = 7
    vocab_size: int = 4096
    max_length: int = 8192
    learning_rate: float = 3e-3
    check_prompts: int = 10  # held-out first turns generated after the warm start (0 = skip the check)
    check_every: int = 25  # the policy's checks run every this many warm-start steps (0 = only at the end) ...
    check_from: int = 400  # ... from this step on (`longhaul.tiny.gate`)
    user_steps: int = 800  # most warm-start steps of the user simulator
    user_learning_rate: float = 1e-2  # the smaller user model learns its few lines faster at a higher rate
    check_user_tasks: int = 30  # held-out tasks the user simulator is checked on (0 = skip the check)
    user_check_every: int = 50  # the simulator's checks run every this many warm-start steps ...
    user_check_from: int = 200  # ... from this step on
    stop_on_criteria: bool = True  # each warm start stops at its first check that meets its criteria
    date_line: str | None = None  # None = the spec's default date line
    # The spec (a path, like `out_dir` relative to the project root) whose step-0 evaluation the policy's gate
    # estimates in-process (`longhaul.tiny.local_chat`; band `checks.STEP0_BAND`): the demo's, so `make demo` starts
    # where the README says on any machine. None or "" = no such criterion.
    step0_spec: str | None = "specs/demo.yaml"


@dataclass
class TinyBuildReport:
    key: str
    cached: bool
    policy_dir: str
    user_dir: str
    timings_s: dict[str, float] = field(default_factory=dict)
    vocab_size: int = 0
    system_prompt_tokens: int = 0
    warmstart: dict[str, Any] = field(default_factory=dict)
    tool_calls: dict[str, Any] = field(default_factory=dict)
    user_warmstart: dict[str, Any] = field(default_factory=dict)
    user_check: dict[str, Any] = field(default_factory=dict)  # held-out replies of the simulator (stop rate, …)
    arithmetic: dict[str, Any] = field(default_factory=dict)  # kernels the recipe ran with (`arithmetic_facts`)
    criteria: list[dict[str, Any]] = field(default_factory=list)  # `checks.criteria`, each with its verdict


def compute_build_key(config: TinyBuildConfig, inputs: dict[str, Any]) -> str:
    """Content key: recipe version, config, chat template, architectures and every input text."""
    payload = {
        "recipe": RECIPE_VERSION,
        # The checks too: they decide where each warm start stops. The step-0 spec by content, below, not by path.
        "config": {k: v for k, v in asdict(config).items() if k != "step0_spec"},
        "bands": {"close": CLOSE_BAND, "step0": STEP0_BAND},
        "template": load_chat_template(),
        "archs": [asdict(POLICY_ARCH), asdict(USER_ARCH)],
        "corpus": inputs["corpus"],
        "conversations": inputs["conversations"],
        "user_conversations": inputs["user_conversations"],
        "tools": inputs["tools"],
        "arithmetic": DETERMINISTIC_ENV,
    }
    if config.step0_spec:  # what of the spec the estimate reads, not the whole spec (its training settings)
        payload["step0"] = step0_setup(load_step0_spec(config.step0_spec)[0])
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def read_marker(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def ensure_tiny_models(
    out_dir: Path = DEFAULT_OUT_DIR,
    config: TinyBuildConfig = TinyBuildConfig(),
    *,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> TinyBuildReport:
    """Build the tiny models into `out_dir` unless a build with the same key is already there.

    Concurrent callers (parallel tests, two terminals) serialise on a lock file in `out_dir`; the second one then
    finds the first one's build and reuses it. The new build is written to a private temporary directory and
    moved into place at the end, so an interrupted build never leaves half-written models behind.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(out_dir, config, force=force, log=log)


def load_step0_spec(path: str) -> tuple[Any, str]:
    """The spec `step0_spec` names and its text; `TinyBuildError` (one line) when it cannot be read or parsed."""
    # deferred: pydantic and the spec's models (~0.3 s), only for a gated build
    from longhaul.spec import SpecError, parse_spec_text

    try:
        text = Path(path).read_text(encoding="utf-8")
        return parse_spec_text(text, file=path), text
    except OSError as exc:
        raise TinyBuildError(
            f"{path}: cannot read the step-0 spec ({exc.strerror}); pass --step0-spec FILE, or '' for none"
        ) from None
    except SpecError as exc:
        raise TinyBuildError(f"the step-0 spec is not valid: {exc}") from None


def run_recipe(
    build_dir: Path, config: TinyBuildConfig, log: Callable[[str], None], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run `longhaul.tiny.recipe` into the new directory `build_dir` in a child process with the deterministic
    arithmetic on top of `env` (default: this process's environment); its output goes to `log`. Returns the
    report's measured fields; nothing is checked against the criteria here."""
    build_dir.mkdir(parents=True)
    recipe_config = {**asdict(config), "threads": BUILD_THREADS}
    if config.step0_spec:
        recipe_config["step0_spec_text"] = load_step0_spec(config.step0_spec)[1]
    (build_dir / CONFIG_FILE).write_text(json.dumps(recipe_config, indent=2) + "\n", encoding="utf-8")
    argv = [sys.executable, "-m", "longhaul.tiny.recipe", str(build_dir)]
    tail: list[str] = []
    with subprocess.Popen(
        argv, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            log(line)
            tail = [*tail[-19:], line]
    if proc.returncode != 0:
        raise TinyBuildError(f"tiny build failed (exit {proc.returncode}): {tail[-1] if tail else 'no output'}")
    return json.loads((build_dir / REPORT_FILE).read_text(encoding="utf-8"))


def _ensure_locked(
    out_dir: Path,
    config: TinyBuildConfig,
    *,
    force: bool,
    log: Callable[[str], None],
) -> TinyBuildReport:
    t0 = time.perf_counter()
    inputs = build_inputs(config.date_line or default_date_line())
    key = compute_build_key(config, inputs)
    policy_dir, user_dir = out_dir / POLICY_DIRNAME, out_dir / USER_DIRNAME
    marker = read_marker(out_dir)
    if (
        not force
        and marker
        and marker.get("key") == key
        and (policy_dir / "config.json").exists()
        and (user_dir / "config.json").exists()
    ):
        report = TinyBuildReport(**{**marker["report"], "cached": True})
        log(f"tiny models up to date (key {key}) in {out_dir}")
        return report

    tmp = out_dir / f".build-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        measured = run_recipe(tmp, config, log)
        report = TinyBuildReport(key=key, cached=False, policy_dir=str(policy_dir), user_dir=str(user_dir))
        for name, value in measured.items():
            setattr(report, name, value)
        facts = report.arithmetic
        log(
            f"arithmetic: torch {facts.get('torch_cpu_capability')} kernels, MKL_CBWR={facts.get('mkl_cbwr') or '-'}, "
            f"{facts.get('torch_threads')} threads (the same weights on this machine; another CPU rounds differently, "
            "builds other weights and is held to the same criteria, below)"
        )
        checked = criteria(report.tool_calls, report.user_check)
        report.criteria = criteria_report(checked)
        log("criteria of the build (held-out tasks):")
        for c in checked:
            log(f"  {c.line()}")
        missed = [c.name for c in checked if not c.met]
        if missed:
            raise TinyBuildError(
                f"tiny build {key} missed its criteria {', '.join(missed)} (see the table above); nothing was "
                f"written to {out_dir}: report it with the log of `longhaul tiny build --force`"
            )
        for name in (POLICY_DIRNAME, USER_DIRNAME):
            (tmp / name / "longhaul-tiny.json").write_text(json.dumps({"key": key, "role": name}, indent=2) + "\n")
        for name in (POLICY_DIRNAME, USER_DIRNAME):
            shutil.rmtree(out_dir / name, ignore_errors=True)
            (tmp / name).rename(out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.timings_s["total"] = round(time.perf_counter() - t0, 2)
    (out_dir / MARKER).write_text(json.dumps({"key": key, "report": asdict(report)}, indent=2) + "\n")
    log(f"tiny models written to {out_dir} in {report.timings_s['total']:.0f}s (key {key})")
    return report
