"""Policy over every Dockerfile of the repository (hadolint has no rule for most of these).

Parsed with BuildKit's own parser (PyPI `dockerfile`). The rules, each with why:
- every base is a global ARG whose default is `name:tag@sha256:<64 hex>` (reproducible, and CI substitutes
  locally built bases through the same ARGs); a stage may also start FROM an earlier stage;
- no `# syntax=` line (BuildKit would pull a frontend image: fails offline) and no heredocs (buildah 1.28 and
  docker 20.10 cannot parse them);
- the final stage runs as a numeric non-root USER (Kubernetes `runAsNonRoot` can only verify a number);
- no ARG or ENV is named like a secret (ARG/ENV values end up in the image history);
- pip never reaches an index at build time (`--no-index`);
- the trainer sets the offline variables (the same set as `longhaul.constants.OFFLINE_ENV`), bakes models with
  `hf download` at pinned commits with the token as a build secret, and makes /models world-readable.
Each rule is also run on a small bad Dockerfile, so a broken rule cannot pass silently.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

dockerfile = pytest.importorskip("dockerfile", reason="PyPI `dockerfile` (test extra) parses Dockerfiles")

from longhaul.constants import LAUNCHER_CMD, OFFLINE_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted([ROOT / "Dockerfile", *ROOT.glob("images/*.Dockerfile")])
TRAINER = ROOT / "Dockerfile"
STACKS = ROOT / "images" / "stacks"

PINNED = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+:[A-Za-z0-9_][A-Za-z0-9._-]*@sha256:[0-9a-f]{64}$")
LOCAL_BASE = re.compile(r"^localhost/[a-z0-9._/-]+:[A-Za-z0-9._-]+$")
SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)(_|$)", re.I)
VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::?-[^}]*)?\}?")


@dataclass
class Stage:
    base: str
    name: str | None
    commands: list


def parse(text: str) -> tuple[dict[str, str], list[Stage], list]:
    """Global ARG defaults, stages, and all commands of a Dockerfile text."""
    cmds = list(dockerfile.parse_string(text))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for c in cmds:
        if c.cmd == "FROM":
            value = list(c.value)
            name = value[2] if len(value) >= 3 and value[1].upper() == "AS" else None
            stages.append(Stage(value[0], name, []))
        elif not stages:
            if c.cmd == "ARG":
                key, _, default = c.value[0].partition("=")
                global_args[key] = default
        else:
            stages[-1].commands.append(c)
    return global_args, stages, cmds


def env_pairs(cmd) -> dict[str, str]:
    vals = list(cmd.value)
    return dict(zip(vals[::2], vals[1::2], strict=True))


def violations(text: str) -> list[str]:
    """Every policy violation of one Dockerfile text (empty = compliant)."""
    found: list[str] = []
    if re.search(r"^\s*#\s*syntax\s*=", text, re.M | re.I):
        found.append("has a '# syntax=' line (BuildKit would pull a frontend image offline)")
    try:
        global_args, stages, cmds = parse(text)
    except Exception as exc:  # GoParseError, e.g. an unterminated heredoc
        return [*found, f"does not parse: {exc}"]
    if any(c.heredocs for c in cmds) or re.search(r"^\s*(RUN|COPY)\s[^\n]*<<-?\s*['\"]?[A-Za-z_]", text, re.M):
        found.append("uses a heredoc (buildah 1.28 / docker 20.10 cannot parse it)")
    names: list[str] = []
    for st in stages:
        refs = VAR.findall(st.base)
        resolved = VAR.sub(lambda m: global_args.get(m.group(1), ""), st.base)
        if resolved in names:
            pass
        elif len(refs) == 1 and st.base.strip("${}") == refs[0]:
            default = global_args.get(refs[0])
            if default is None:
                found.append(f"FROM {st.base}: {refs[0]} is not a global ARG with a default")
            elif not PINNED.match(default):
                found.append(f"FROM {st.base}: default {default!r} is not name:tag@sha256:<64 hex>")
        else:
            found.append(f"FROM {st.base}: a base must be a digest-pinned global ARG or an earlier stage")
        if st.name:
            names.append(st.name)
    for c in cmds:
        if c.cmd in ("ARG", "ENV"):
            keys = [v.partition("=")[0] for v in c.value] if c.cmd == "ARG" else list(env_pairs(c))
            found += [
                f"line {c.start_line}: {c.cmd} {k} looks like a secret; use a build secret"
                for k in keys
                if SECRET_NAME.search(k)
            ]
        if c.cmd == "RUN":
            run = " ".join(c.value)
            for m in re.finditer(r"\bpip3?\s+(install|wheel|download)\b[^&;|]*", run):
                if "--no-index" not in m.group(0):
                    found.append(
                        f"line {c.start_line}: '{m.group(0).strip()[:60]}' may reach an index (add --no-index)"
                    )
            if "huggingface-cli" in run:
                found.append(f"line {c.start_line}: huggingface-cli is gone from huggingface_hub; use `hf download`")
    if stages:
        users = [c for c in stages[-1].commands if c.cmd == "USER"]
        user = users[-1].value[0] if users else "root"
        uid = user.split(":")[0]
        if not uid.isdigit() or int(uid) == 0:
            found.append(f"final stage runs as {user!r}: needs a numeric non-root USER (runAsNonRoot)")
    return found


# --------------------------------------------------------------------------------------------------------
# The repository's Dockerfiles


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_follows_policy(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


def test_all_dockerfiles_found() -> None:
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile", "operator.Dockerfile"}


def trainer() -> tuple[dict[str, str], list[Stage]]:
    global_args, stages, _ = parse(TRAINER.read_text(encoding="utf-8"))
    return global_args, stages


def stage(name: str) -> Stage:
    return next(s for s in trainer()[1] if s.name == name)


def test_trainer_sets_offline_environment_of_constants() -> None:
    env: dict[str, str] = {}
    for c in stage("runtime").commands:
        if c.cmd == "ENV":
            env.update(env_pairs(c))
    missing = {k: v for k, v in OFFLINE_ENV.items() if env.get(k) != v}
    assert missing == {}, f"runtime ENV lacks or changes {missing}"
    assert env["HF_HOME"].startswith("/models")
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"


def test_trainer_entrypoint_is_the_launcher() -> None:
    cmds = {c.cmd: c for c in stage("runtime").commands if c.cmd in ("ENTRYPOINT", "CMD")}
    assert cmds["ENTRYPOINT"].json and cmds["CMD"].json, "exec form, so signals reach the launcher"
    assert tuple(cmds["ENTRYPOINT"].value) + tuple(cmds["CMD"].value) == LAUNCHER_CMD


def test_model_source_stages_exist_for_each_choice() -> None:
    global_args, stages = trainer()
    names = {s.name for s in stages}
    assert global_args["MODEL_SRC"] in {"hub", "local"}
    assert {"models-hub", "models-local"} <= names
    assert any(s.base == "models-${MODEL_SRC}" for s in stages)


def test_hub_models_are_pinned_and_token_is_a_build_secret() -> None:
    hub = stage("models-hub")
    args = dict(c.value[0].split("=", 1) for c in hub.commands if c.cmd == "ARG")
    for key in ("POLICY_REVISION", "SIMULATOR_REVISION"):
        assert re.fullmatch(r"[0-9a-f]{40}", args[key]), f"{key}={args[key]!r} is not a commit"
    runs = [c for c in hub.commands if c.cmd == "RUN"]
    assert any("--mount=type=secret,id=hf_token" in c.flags for c in runs)
    bake = (ROOT / "images" / "bake-models.sh").read_text(encoding="utf-8")
    assert "hf download" in bake and "huggingface-cli" not in bake
    assert "HF_TOKEN_PATH=/run/secrets/hf_token" in bake, "token read from the secret mount, never echoed"
    assert "chmod -R a+rX" in bake


def test_local_models_are_world_readable() -> None:
    runs = " ".join(" ".join(c.value) for c in stage("models-local").commands if c.cmd == "RUN")
    assert "chmod -R a+rX /models" in runs, "Apptainer runs as the calling user, not USER 1000"


def test_dependency_layer_does_not_depend_on_the_source_tree() -> None:
    copies = [" ".join(c.value) for c in stage("deps").commands if c.cmd == "COPY"]
    assert copies and not any("pipelines" in c for c in copies)


# --------------------------------------------------------------------------------------------------------
# Stacks: matched version sets, digest-pinned bases, Dockerfile defaults = the cuda13 stack


def stack_env(name: str) -> dict[str, str]:
    env = {}
    for line in (STACKS / name / "stack.env").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def stack_pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (STACKS / name / "requirements.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)", line.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(3)
    return pins


@pytest.mark.parametrize("name", sorted(p.name for p in STACKS.iterdir() if p.is_dir()))
def test_stack_bases_are_pinned_or_local(name: str) -> None:
    env = stack_env(name)
    for key in ("BUILDER_IMAGE", "BASE_IMAGE"):
        assert PINNED.match(env[key]) or LOCAL_BASE.match(env[key]), f"{name}: {key}={env[key]}"
    assert (STACKS / name / "constraints.txt").is_file()
    text = (STACKS / name / "requirements.txt").read_text(encoding="utf-8")
    assert not re.search(r"^\s*autoawq", text, re.M | re.I), "vLLM serves AWQ natively; autoawq conflicts"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cuda13", {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0", "flash-attn": "2.8.3"}),
    ],
)
def test_gpu_stacks_are_matched_sets(name: str, expected: dict[str, str]) -> None:
    pins = stack_pins(name)
    assert {k: pins.get(k) for k in expected} == expected


def test_cpu_stacks_have_no_vllm() -> None:
    for name in ("cpu-min", "operator"):
        assert "vllm" not in stack_pins(name)


def test_every_stack_with_verl_has_the_verl_the_overrides_are_composed_against() -> None:
    """A stack ships the veRL whose config the rendered overrides compose and validate against in the unit tests
    (tests/unit/render/test_verl_overrides.py runs veRL's own Hydra config of the venv's veRL): any other veRL
    would refuse them at start-up (veRL 0.8.0 has no trainer.use_v1)."""
    from longhaul.verlcpu import SUPPORTED_VERL

    stacks = sorted(p.name for p in STACKS.iterdir() if (p / "stack.env").is_file())
    with_verl = {name: stack_pins(name)["verl"] for name in stacks if "verl" in stack_pins(name)}
    assert with_verl == {"cuda13": SUPPORTED_VERL}, with_verl


def test_dockerfile_defaults_are_the_cuda13_stack() -> None:
    global_args, _ = trainer()
    env = stack_env("cuda13")
    assert global_args["BUILDER_IMAGE"] == env["BUILDER_IMAGE"]
    assert global_args["BASE_IMAGE"] == env["BASE_IMAGE"]
    for name in ("wheelhouse", "deps", "runtime"):
        args = [c.value[0] for c in stage(name).commands if c.cmd == "ARG"]
        assert "STACK=cuda13" in args, (name, args)


# --------------------------------------------------------------------------------------------------------
# The rules catch what they are meant to catch

GOOD = """\
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:{digest}
FROM ${{BASE_IMAGE}} AS build
RUN pip install --no-index --find-links /w x
FROM build
USER 1000:1000
""".format(digest="a" * 64)


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (GOOD.replace("USER 1000:1000\n", ""), "needs a numeric non-root USER"),
        (GOOD.replace("USER 1000:1000", "USER root"), "needs a numeric non-root USER"),
        (GOOD.replace("USER 1000:1000", "USER 0:0"), "needs a numeric non-root USER"),
        (GOOD.replace("@sha256:" + "a" * 64, ""), "is not name:tag@sha256"),
        (GOOD.replace("debian:bookworm-slim", "debian"), "is not name:tag@sha256"),
        (
            GOOD.replace("FROM ${BASE_IMAGE}", "FROM nvidia/cuda:12.9.1-base-ubuntu24.04"),
            "digest-pinned global ARG",
        ),
        ("# syntax=docker/dockerfile:1\n" + GOOD, "syntax="),
        (GOOD + "RUN <<EOF\necho hi\nEOF\n", "heredoc"),
        (GOOD + "ARG HF_TOKEN\n", "ARG HF_TOKEN looks like a secret"),
        (GOOD + "ENV WANDB_API_KEY=x\n", "ENV WANDB_API_KEY looks like a secret"),
        (GOOD.replace("--no-index ", ""), "may reach an index"),
        (GOOD + "RUN huggingface-cli download x\n", "use `hf download`"),
    ],
)
def test_policy_flags_bad_dockerfiles(bad: str, expected: str) -> None:
    assert violations(GOOD) == []
    found = violations(bad)
    assert any(expected in v for v in found), found


def test_secret_names_do_not_flag_tokenizer_settings() -> None:
    assert not SECRET_NAME.search("TOKENIZERS_PARALLELISM")
    assert SECRET_NAME.search("HF_TOKEN") and SECRET_NAME.search("MLFLOW_TRACKING_PASSWORD")


def test_stack_env_files_are_plain_assignments() -> None:
    # The deps stage sources stack.env with bash: only KEY=VALUE lines without shell syntax.
    for path in STACKS.glob("*/stack.env"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                assert re.fullmatch(r"[A-Z_]+", key), (path, line)
                assert shlex.quote(value) == value or value == "", (path, line)
