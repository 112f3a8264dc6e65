"""Security checks with figures (issue 15, item 3): injection, path traversal, pod security, RBAC, planted secrets.

1. **Injection corpus × every string field.** `data/injections.yaml` (≥ 100 payloads: shell, `#SBATCH`, YAML, label,
   Helm/Go template, env-var expansion, control characters, very long strings, unicode look-alikes, paths, URLs) is
   pushed through every string field of the Experiment spec — enumerated by walking the pydantic JSON schema, so a
   new field is covered without touching this file — and through every user-settable string value of the Helm
   chart. Each (payload, field) is either refused at validation with an error naming the field, or accepted and
   then proven inert in every output it reaches:
   - sbatch: `bash -n`, then the script is *executed* in a sandbox (temporary directory and HOME; `srun`,
     `scontrol`, `apptainer`, `ray`, `source` are recording stubs; a fake `longhaul` on PATH records its argv and
     environment): no canary file appears, the launcher's argv/env, the container image, binds and sourced venv
     equal the spec's values byte for byte, and no `#SBATCH` line exists beyond the header. A script equal to an
     already executed one up to the run name is covered by that execution.
   - Kubernetes: the manifests are parsed back from the exact text `longhaul render` prints; every object has the
     shape of the benign render (no extra keys or objects), changed scalars carry the payload verbatim, the
     ConfigMap's spec re-validates to the same Experiment, no env value or command can be expanded by Kubernetes
     (`$(VAR)`), and the RayJob entrypoint (a shell string) parses back to the launcher argv in bash.
   - launch plan (JSON, argv lists) and veRL's Hydra overrides (parsed with Hydra's own parser: one key each, no
     sweep, no interpolation).
   - Helm: `helm template` of the chart, the payload in every string value at once (one aliased copy of the chart
     per payload, so one `helm template` run covers the corpus), parsed back and compared with the benign render.
   `backends.slurm.setup` is shell by design: its figure is separate and says whether each line stays one line.
2. **Path traversal**: `..`, system directories, options disguised as paths, in every path field and in the CLI's
   run-directory arguments.
3. **Pod security** of every rendered pod (all shipped specs, multi-node and multi-seed variants, the operator
   Deployment from the chart).
4. **RBAC allow/deny matrix** computed from the chart's rendered rules, against exactly what the operator and kopf
   call.
5. **Planted secrets**: every rendered artefact, the CLI's outputs, and a launcher run's logs, run directory and
   MLflow params/tags are grepped for planted secret values.

Figures go to the reliability report (area "security").
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul import bounded
from longhaul import constants as C
from longhaul.render import BACKENDS, _yaml_docs, render
from longhaul.render.kubernetes import launcher_argv, render_kubernetes
from longhaul.render.slurm import render_slurm, slurm_run_dir
from longhaul.spec import SpecError, run_name, seed_runs, spec_hash
from longhaul.spec.backends import ContainerRuntime
from longhaul.spec.load import build_experiment
from longhaul.spec.models import Experiment

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
CHART = ROOT / "charts" / "longhaul"
AREA = "security"
CANARY = "PWNED"

Record = Callable[..., None]


# ---------------------------------------------------------------------------------------------------------
# The corpus


@dataclass(frozen=True)
class Payload:
    id: str
    category: str
    value: str


def load_corpus() -> list[Payload]:
    out = []
    for entry in yaml.safe_load((DATA / "injections.yaml").read_text(encoding="utf-8")):
        value = entry["repeat"] * entry["times"] if "repeat" in entry else entry["value"]
        assert isinstance(value, str), entry
        out.append(Payload(entry["id"], entry["category"], value))
    return out


CORPUS = load_corpus()


def test_corpus_is_large_and_varied() -> None:
    ids = [p.id for p in CORPUS]
    assert len(CORPUS) >= 100 and len(set(ids)) == len(ids)
    cats = {p.category for p in CORPUS}
    assert {"shell", "sbatch", "yaml", "label", "helm", "env", "control", "long", "unicode", "path", "url"} <= cats
    assert any("\0" in p.value for p in CORPUS) and max(len(p.value) for p in CORPUS) > 64 * 1024


# ---------------------------------------------------------------------------------------------------------
# String fields of the spec, from its JSON schema

ITEM, KEY, VALUE = "[]", "{key}", "{value}"


@dataclass(frozen=True)
class Slot:
    """One place a string can go: a field, a list item, a map key or a map value (`map_key`: under that key)."""

    path: tuple[str, ...]
    closed: bool  # an enum / literal: a closed set of strings
    map_key: str | None = None

    @property
    def name(self) -> str:
        text = ".".join(self.path)
        return f"{text}[{self.map_key}]" if self.map_key else text

    @property
    def prefix(self) -> str:
        """The dotted path an error must name (up to the first list/map marker)."""
        out = []
        for part in self.path:
            if part in (ITEM, KEY, VALUE):
                break
            out.append(part)
        return ".".join(out)


#: Map values that mean something to longhaul get a slot each (a value under an ordinary key is one more).
MAP_VALUE_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("metadata", "annotations"): (C.ANNOTATION_GIT_COMMIT, C.ANNOTATION_SEED_GROUP),
}


def spec_string_slots() -> list[Slot]:
    """Every string slot of `Experiment`, walking its JSON schema ($ref, anyOf, arrays, maps, map keys)."""
    schema = Experiment.model_json_schema()
    defs = schema.get("$defs", {})
    found: dict[tuple[tuple[str, ...], str | None], Slot] = {}

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            ref = defs[node["$ref"].rsplit("/", 1)[-1]]
            node = {**ref, **{k: v for k, v in node.items() if k != "$ref"}}
        return node

    def add(path: tuple[str, ...], closed: bool, map_key: str | None = None) -> None:
        found.setdefault((path, map_key), Slot(path, closed, map_key))

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        node = resolve(node)
        for alt in node.get("anyOf", []) + node.get("oneOf", []):
            walk(alt, path)
        kind = node.get("type")
        if kind == "string" or "enum" in node or "const" in node:
            if kind in (None, "string"):
                add(path, "enum" in node or "const" in node)
        elif kind == "array":
            walk(node.get("items", {}), (*path, ITEM))
        elif kind == "object":
            for key, sub in (node.get("properties") or {}).items():
                walk(sub, (*path, key))
            values = [v for v in (node.get("patternProperties") or {}).values()]
            if isinstance(node.get("additionalProperties"), dict):
                values.append(node["additionalProperties"])
            if values:
                add((*path, KEY), False)
                for v in values:
                    walk(v, (*path, VALUE))
                    for mk in MAP_VALUE_KEYS.get(path, ()):
                        add((*path, VALUE), False, mk)

    walk(schema, ())
    return [s for s in found.values() if s.path not in (("apiVersion",), ("kind",))] + [
        s for s in found.values() if s.path in (("apiVersion",), ("kind",))
    ]


SLOTS = spec_string_slots()
SETUP = ("spec", "backends", "slurm", "setup", ITEM)


def test_schema_walk_finds_the_string_fields() -> None:
    names = {s.name for s in SLOTS}
    for expected in (
        "metadata.name",
        "metadata.labels.{key}",
        "metadata.annotations.{value}[longhaul.dev/git-commit]",
        "spec.backends.slurm.setup.[]",
        "spec.backends.slurm.container.binds.[]",
        "spec.backends.kubernetes.checkpoint_volume.mount_path",
        "spec.tracking.tags.{value}",
        "spec.backends.kubernetes.node_selector.{key}",
        "spec.user_simulator.url",
        "spec.policy.lora.target_modules.[]",
        "spec.backends.kubernetes.tolerations.[].value",
    ):
        assert expected in names, f"{expected} not found by the schema walk: {sorted(names)}"
    assert len([s for s in SLOTS if not s.closed]) >= 50


# ---------------------------------------------------------------------------------------------------------
# Base specs that make every field live, and the variants each field is rendered in


def _base_doc() -> dict[str, Any]:
    """lata.yaml with every optional string field set to something benign (so each slot exists)."""
    doc = yaml.safe_load((ROOT / "specs" / "lata.yaml").read_text(encoding="utf-8"))
    s = doc["spec"]
    doc["metadata"].update(
        {
            "namespace": "team-a",
            "labels": {"example.com/team": "a"},
            "annotations": {
                "example.com/note": "benign",
                C.ANNOTATION_GIT_COMMIT: "0123456789abcdef0123456789abcdef01234567",
            },
        }
    )
    s["stages"] = ["sft", "grpo", "eval"]
    s["policy"]["model"].update({"path": "models/policy", "revision": "v1"})
    s["policy"]["lora"]["target_modules"] = ["q_proj"]
    s["user_simulator"]["model"]["path"] = "models/user"
    s["sft"] = {
        "teacher": {
            "model": {"name": "Qwen/Qwen2.5-72B-Instruct-AWQ", "path": "models/teacher"},
            "url": "http://teacher:8000/v1",
        },
        "dataset": "data/sft.jsonl",
    }
    s["reward"]["rules"] = {"placeholder": {"write_weight": -0.1}}
    s["tracking"] = {"uri": "http://mlflow:5000", "experiment": "exp", "tags": {"owner": "me"}}
    s["backends"] = {
        "kubernetes": {
            "namespace": "team-a",
            "service_account": "trainer",
            "node_selector": {"example.com/pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "priority_class": "high",
            "queue": "team-a-queue",
            "checkpoint_volume": {"claim_name": "ckpt", "mount_path": "/checkpoints"},
        },
        "slurm": {
            "partition": "gpu",
            "account": "proj",
            "qos": "normal",
            "setup": ["module load cuda/12.4"],
            "container": {"runtime": "apptainer", "image": "images/trainer.sif", "binds": ["/data:/data:ro"]},
            "output_dir": "runs",
        },
        "local": {"output_dir": "runs", "policy_server_cmd": ["bin/serve"]},
    }
    return doc


def _variant(name: str) -> dict[str, Any]:
    """A fresh copy of the variant's document."""
    if name not in _VARIANT_DOCS:
        _VARIANT_DOCS[name] = json.dumps(_make_variant(name))
    return json.loads(_VARIANT_DOCS[name])  # a deep copy, several times faster than copy.deepcopy


_VARIANT_DOCS: dict[str, str] = {}


def _make_variant(name: str) -> dict[str, Any]:
    doc = _base_doc()
    s = doc["spec"]
    if name == "pyxis":
        s["backends"]["slurm"]["container"] = {
            "runtime": "pyxis",
            "image": "images/trainer.sqsh",
            "binds": ["/data:/data"],
        }
    elif name == "venv":
        s["backends"]["slurm"]["container"] = {"runtime": "none"}
        s["backends"]["slurm"]["venv"] = "venv"
    elif name in ("nodes2", "jobset"):
        s["resources"]["nodes"] = 2
        if name == "jobset":
            s["backends"]["kubernetes"]["multinode_engine"] = "jobset"
    elif name == "seeds":
        s["algorithm"]["seeds"] = [1, 2]
        s["algorithm"].pop("seed", None)
    elif name == "external-sim":
        s["user_simulator"].update(
            {"placement": "external", "url": "http://sim:8001/v1", "api_key_secret": {"name": "sim", "key": "api-key"}}
        )
    elif name == "cpu":  # veRL's CPU platform: where the local backend's policy_server_cmd is used
        s["resources"]["gpus_per_node"] = 0
        s["policy"]["lora"] = {"rank": 0}
    elif name == "uri-secret":
        s["tracking"].pop("uri")
        s["tracking"]["uri_secret"] = {"name": "mlflow", "key": "tracking-uri"}
    else:
        assert name == "apptainer", name
    return doc


#: Where a field is live, by path prefix (first match): the variants its payloads are rendered in.
CONTEXTS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("spec", "user_simulator", "url"), ("external-sim",)),
    (("spec", "user_simulator", "api_key_secret"), ("external-sim",)),
    (("spec", "tracking", "uri_secret"), ("uri-secret",)),
    (("spec", "backends", "slurm", "container"), ("apptainer", "pyxis", "nodes2")),
    (("spec", "backends", "slurm", "venv"), ("venv",)),
    (("spec", "backends", "slurm"), ("apptainer", "seeds", "nodes2")),
    (("spec", "backends", "kubernetes"), ("apptainer", "nodes2", "jobset")),
    (("spec", "backends", "local"), ("apptainer", "cpu")),
    (("metadata", "name"), ("apptainer", "seeds")),
    ((), ("apptainer",)),
]
VARIANTS = ("apptainer", "pyxis", "venv", "nodes2", "jobset", "seeds", "external-sim", "uri-secret", "cpu")


def variants_of(slot: Slot) -> tuple[str, ...]:
    for prefix, names in CONTEXTS:
        if slot.path[: len(prefix)] == prefix:
            return names
    raise AssertionError(slot)


def place(doc: dict[str, Any], slot: Slot, payload: str) -> None:
    """Put `payload` into `doc` at `slot` (the base doc provides every container on the way)."""

    def go(node: Any, parts: tuple[str, ...]) -> None:
        head, rest = parts[0], parts[1:]
        if head == ITEM:
            assert isinstance(node, list) and node, (slot, node)
            if rest:
                go(node[0], rest)
            else:
                node[0] = payload
        elif head == KEY:
            assert isinstance(node, dict) and node and not rest, (slot, node)
            k0 = next(iter(node))
            node[payload] = node.pop(k0)
        elif head == VALUE:
            assert isinstance(node, dict) and node, (slot, node)
            k = slot.map_key or next(iter(node))
            if rest:
                go(node[k], rest)
            else:
                node[k] = payload
        elif rest:
            if node.get(head) is None:
                node[head] = [{}] if rest[0] == ITEM else {}
            go(node[head], rest)
        else:
            node[head] = payload

    go(doc, slot.path)


def read_back(exp: Experiment, slot: Slot, payload: str) -> bool:
    """Whether the validated model holds `payload` at `slot` unchanged (byte for byte)."""
    node: Any = exp.model_dump(mode="json")
    for part in slot.path:
        if part == ITEM:
            node = node[0]
        elif part == KEY:
            return payload in node
        elif part == VALUE:
            node = node[slot.map_key or next(iter(node))]
        else:
            node = node[part]
    return node == payload


# ---------------------------------------------------------------------------------------------------------
# The sbatch sandbox

_STUBS = r"""
# Recording stubs for the sandboxed sbatch script (sourced through BASH_ENV before the script runs).
_lh_rec() { local tool="$1"; shift; local f; f="$(mktemp "$LH_CALLS/$tool.XXXXXX")"; printf '%s\0' "$@" > "$f"; }
apptainer() {
  _lh_rec apptainer "$@"
  [ "$1" = exec ] || return 64
  shift
  local envs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --nv|--containall) shift ;;
      --env) envs+=("$2"); shift 2 ;;
      --pwd|-B) shift 2 ;;
      -*) echo "stub apptainer: unexpected option $1" >&2; return 64 ;;
      *) break ;;
    esac
  done
  _lh_rec apptainer-image "$1"
  shift
  env -- "${envs[@]}" "$@"
}
srun() {
  _lh_rec srun "$@"
  while [ $# -gt 0 ]; do
    case "$1" in
      -w) shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  "$@"
}
scontrol() { _lh_rec scontrol "$@"; if [ "$1 $2" = "show hostnames" ]; then echo node1; echo node2; fi; }
module() { _lh_rec module "$@"; }
hostname() { echo 127.0.0.1; }
source() { _lh_rec source "$@"; }
"""

_FAKE_LONGHAUL = r"""#!/bin/bash
f="$(mktemp "$LH_CALLS/longhaul.XXXXXX")"
printf '%s\0' "$@" > "$f"
env -0 > "$f.env"
"""

# `ray status` answers as Ray 2.60 does with both nodes of the job (scontrol's node1, node2) active: the
# multi-node script waits for that before it starts the launcher.
_FAKE_RAY = r"""#!/bin/bash
f="$(mktemp "$LH_CALLS/ray.XXXXXX")"
printf '%s\0' "$@" > "$f"
if [ "$1" = status ]; then
  printf '%s\n' '======== Autoscaler status: 2026-12-04 00:00:00 ========' 'Node status' \
    '---------------------------------------------------------------' 'Active:' ' 1 node_0a1b' ' 1 node_2c3d' \
    'Pending:' ' (no pending nodes)' 'Recent failures:' ' (no failures)'
fi
"""


@dataclass
class Sandbox:
    """A directory to run one script in, with its stubs and records."""

    root: Path
    calls: Path

    @classmethod
    def create(cls, base: Path) -> Sandbox:
        base.mkdir(parents=True, exist_ok=True)
        bindir = base / "bin"
        if not bindir.is_dir():
            bindir.mkdir()
            (bindir / "longhaul").write_text(_FAKE_LONGHAUL)
            (bindir / "longhaul").chmod(0o755)
            (bindir / "ray").write_text(_FAKE_RAY)
            (bindir / "ray").chmod(0o755)
            (base / "stubs.sh").write_text(_STUBS)
        n = len(list(base.glob("run-*")))
        root = base / f"run-{n}"
        calls = root / ".calls"
        calls.mkdir(parents=True)
        return cls(root, calls)

    def records(self, tool: str) -> list[list[str]]:
        out = []
        for f in sorted(self.calls.glob(f"{tool}.*"), key=lambda p: p.stat().st_mtime_ns):
            if f.name.endswith(".env"):
                continue
            out.append(f.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1])
        return out

    def launcher_env(self) -> dict[str, str]:
        (f,) = [p for p in self.calls.glob("longhaul.*.env")]
        pairs = f.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
        return dict(p.split("=", 1) for p in pairs)

    def canaries(self) -> list[Path]:
        return [p for p in self.root.rglob(CANARY) if p.is_file()]


def bash_n(path: Path) -> str | None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else proc.stderr.strip()


def run_script(box: Sandbox, script: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = box.root / "job.sbatch"
    path.write_text(script, encoding="utf-8", errors="surrogateescape")
    env = {
        "PATH": f"{box.root.parent / 'bin'}:/usr/bin:/bin",
        "HOME": str(box.root),
        "BASH_ENV": str(box.root.parent / "stubs.sh"),
        "LH_CALLS": str(box.calls),
        "SLURM_JOB_ID": "7",
        "SLURM_ARRAY_JOB_ID": "7",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURM_SUBMIT_DIR": str(box.root),
        "SLURM_JOB_NODELIST": "node[1-2]",
        "LANG": "C.UTF-8",
        **(extra_env or {}),
    }
    return subprocess.run(
        ["bash", str(path)], cwd=box.root, env=env, capture_output=True, text=True, timeout=60, errors="replace"
    )


def sbatch_header_problems(script: str, base_script: str) -> list[str]:
    """`#SBATCH` lines outside the header, or header directives other than the benign script's."""

    def directives(text: str) -> tuple[list[str], int]:
        lines = text.split("\n")
        header = []
        for line in lines[1:]:
            if not line.startswith("#"):
                break
            if line.startswith("#SBATCH"):
                header.append(re.sub(r"=.*", "", line))
        return header, sum(1 for line in lines if line.lstrip().startswith("#SBATCH"))

    got, total = directives(script)
    want, _ = directives(base_script)
    problems = []
    if got != want:
        problems.append(f"#SBATCH directives {got} differ from the benign script's {want}")
    if total != len(got):
        problems.append(f"{total - len(got)} #SBATCH line(s) outside the header")
    return problems


def check_sbatch_execution(exp: Experiment, script: str, base_script: str, box: Sandbox) -> list[str]:
    """Run the script in the sandbox; what differs from the spec's values (byte for byte) is a problem."""
    problems = sbatch_header_problems(script, base_script)
    path = box.root / "job.sbatch"
    path.write_text(script, encoding="utf-8", errors="surrogateescape")
    err = bash_n(path)
    if err:
        return [*problems, f"bash -n: {err}"]
    runs = seed_runs(exp)
    run = runs[0]  # array task 0 (the only run without seeds)
    for r in runs:  # the submit step creates the run directories (Slurm does not)
        d = Path(slurm_run_dir(r))
        (box.root / d if not d.is_absolute() else d).mkdir(parents=True, exist_ok=True)
    slurm = exp.spec.backends.slurm
    extra = {"LONGHAUL_IMAGE": "site-image.sif", "LONGHAUL_VENV": str(box.root / "site-venv")}
    proc = run_script(box, script, extra)
    if box.canaries():
        problems.append(f"canary created: {box.canaries()}")
    if proc.returncode != 0:
        return [*problems, f"script exited {proc.returncode}: {proc.stderr[-2000:]}"]
    launches = box.records("longhaul")
    run_dir = slurm_run_dir(run)
    want_argv = [
        *C.LAUNCHER_CMD[1:],
        "--spec",
        f"{run_dir}/{C.SPEC_FILENAME}",
        "--backend",
        "slurm",
        "--run-dir",
        run_dir,
    ]
    if launches != [want_argv]:
        problems.append(f"launcher argv {launches!r} != {want_argv!r}")
        return problems
    env = box.launcher_env()
    want_env = {
        C.ENV_RUN_NAME: run_name(run),
        C.ENV_RUN_DIR: run_dir,
        C.ENV_SPEC: f"{run_dir}/{C.SPEC_FILENAME}",
        C.ENV_BACKEND: "slurm",
        **C.OFFLINE_ENV,
    }
    for k, v in want_env.items():
        if env.get(k) != v:
            problems.append(f"launcher env {k}={env.get(k)!r} != {v!r}")
    cont = slurm.container
    if cont.runtime == ContainerRuntime.APPTAINER:
        # Every apptainer call (the launcher's; with several nodes also Ray's) gets the same image and binds. A
        # background Ray call stopped when the script exits may leave an empty record: those are skipped.
        want_image = cont.image or extra["LONGHAUL_IMAGE"]
        images = [r for r in box.records("apptainer-image") if r]
        if not images or any(r != [want_image] for r in images):
            problems.append(f"apptainer image {images!r} != {want_image!r}")
        for argv in (r for r in box.records("apptainer") if r):
            binds = [argv[i + 1] for i, a in enumerate(argv) if a == "-B"]
            if binds != [str(box.root), *cont.binds]:
                problems.append(f"apptainer binds {binds!r} != {[str(box.root), *cont.binds]!r}")
    elif cont.runtime == ContainerRuntime.PYXIS:
        (argv,) = [a for a in box.records("srun") if any(x.startswith("--container-image=") for x in a)]
        image = next(x.split("=", 1)[1] for x in argv if x.startswith("--container-image="))
        mounts = next(x.split("=", 1)[1] for x in argv if x.startswith("--container-mounts="))
        want_image = cont.image or extra["LONGHAUL_IMAGE"]
        if image != want_image or mounts != ",".join([*cont.binds, str(box.root)]):
            problems.append(
                f"pyxis image/mounts {image!r} {mounts!r} != {want_image!r} {[*cont.binds, str(box.root)]!r}"
            )
    else:
        venv = slurm.venv or extra["LONGHAUL_VENV"]
        if box.records("source") != [[f"{venv}/bin/activate"]]:
            problems.append(f"sourced {box.records('source')!r} != {venv + '/bin/activate'!r}")
    return problems


# ---------------------------------------------------------------------------------------------------------
# Comparing renders with the benign render


def _names(exp: Experiment) -> list[tuple[str, str]]:
    """(text, placeholder) pairs that make renders of different specs comparable: run names and spec hashes."""
    pairs = []
    for i, r in enumerate([exp, *seed_runs(exp)]):
        h = spec_hash(r)
        pairs += [(run_name(r), f"<run{i}>"), (h, f"<hash{i}>"), (h[:8], f"<h8-{i}>")]
    if exp.spec.algorithm.seeds:
        pairs.insert(0, (run_name(exp), "<run0>"))
    # Longest first: a run name contains its 8-hex hash.
    return sorted(dict(pairs).items(), key=lambda kv: -len(kv[0]))


def normalize(value: Any, names: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for text, ph in names:
            value = value.replace(text, ph)
        return value
    if isinstance(value, dict):
        return {normalize(k, names): normalize(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v, names) for v in value]
    return value


def diff_scalars(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, a, b) for every difference; containers of different shape are one difference."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in diff_scalars(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diff_scalars(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


def shape(value: Any, keymap: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        return {keymap(k): shape(v, keymap) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v, keymap) for v in value]
    return type(value).__name__


def _pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every pod spec inside a workload (Job, RayJob head/workers, JobSet)."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Job":
        yield spec["template"]["spec"]
    elif kind == "RayJob":
        rc = spec["rayClusterSpec"]
        yield rc["headGroupSpec"]["template"]["spec"]
        for g in rc["workerGroupSpecs"]:
            yield g["template"]["spec"]
    elif kind == "JobSet":
        for rj in spec["replicatedJobs"]:
            yield rj["template"]["spec"]["template"]["spec"]
    elif kind == "Deployment":
        yield spec["template"]["spec"]


def expandable_values(objs: list[dict[str, Any]]) -> list[str]:
    """Container env values, commands and args that Kubernetes would expand (`$(VAR)`)."""
    out = []
    for obj in objs:
        for pod in _pod_specs(obj):
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                for s in [
                    *(c.get("command") or []),
                    *(c.get("args") or []),
                    *(e["value"] for e in c.get("env") or [] if "value" in e),
                ]:
                    if "$(" in s:
                        out.append(s)
    return out


def bash_words(text: str, box: Sandbox) -> tuple[list[str], list[Path]]:
    """How bash splits `text` (a shell command line, e.g. a RayJob entrypoint) into words, run in the sandbox."""
    proc = subprocess.run(
        ["bash", "-c", f"set -- {text}\nprintf '%s\\0' \"$@\""],
        cwd=box.root,
        env={"PATH": "/usr/bin:/bin", "HOME": str(box.root)},
        capture_output=True,
        timeout=30,
    )
    return proc.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1], box.canaries()


@dataclass
class Baseline:
    """The benign render of one variant, executed and parsed once."""

    exp: Experiment
    script: str
    objs: list[dict[str, Any]]
    plan: Any
    verl: list[str]
    norm_script: str = ""
    norm_objs: list[Any] = dc_field(default_factory=list)
    norm_plan: Any = None
    norm_verl: list[str] = dc_field(default_factory=list)


def _plan(exp: Experiment) -> Any:
    return (
        json.loads(render(exp, "local").text())
        if not exp.spec.algorithm.seeds
        else [json.loads(t) for t in render(exp, "local").files.values()]
    )


def _verl(exp: Experiment) -> list[str]:
    return [line for t in render(exp, "verl").files.values() for line in t.splitlines()]


def make_baseline(name: str, box_base: Path) -> Baseline:
    exp = build_experiment(_variant(name), file=f"<{name}>")
    b = Baseline(exp, render_slurm(exp), render_kubernetes(exp), _plan(exp), _verl(exp))
    names = _names(exp)
    b.norm_script, b.norm_objs = normalize(b.script, names), normalize(b.objs, names)
    b.norm_plan, b.norm_verl = normalize(b.plan, names), normalize(b.verl, names)
    problems = check_sbatch_execution(exp, b.script, b.script, Sandbox.create(box_base))
    assert not problems, f"benign {name} script: {problems}"
    text = render(exp, "kubernetes").text()
    assert list(yaml.load_all(text, Loader=yaml.CSafeLoader)) == b.objs
    assert not expandable_values(b.objs)
    return b


# ---------------------------------------------------------------------------------------------------------
# One (payload, slot, variant): refused with the field named, or inert everywhere


@dataclass
class Outcome:
    refused: bool = False
    problems: list[str] = dc_field(default_factory=list)
    executed: int = 0  # sandbox executions


def _hydra_problems(lines: list[str], base: list[str], payload: str) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    problems = []
    for line, ref in zip(lines, base, strict=True):
        if line == ref:
            continue
        try:
            (ov,) = parser.parse_overrides([line])
            (ref_ov,) = parser.parse_overrides([ref])
        except Exception as exc:  # noqa: BLE001 - any parse failure is a finding
            problems.append(f"veRL override {line!r} does not parse: {exc}")
            continue
        value = ov.value()
        values = value if isinstance(value, list) and isinstance(ref_ov.value(), list) else [value]
        if (
            ov.key_or_group != ref_ov.key_or_group
            or ov.is_sweep_override()
            or not all(isinstance(v, str) for v in values)
        ):
            problems.append(f"veRL override {line!r} parses to {ov.key_or_group}={value!r} (benign: {ref!r})")
        elif any("${" in v for v in values) or not any(payload in v for v in values):
            problems.append(f"veRL override {line!r}: value {value!r} does not carry the payload verbatim")
    return problems


#: Payloads whose ConfigMap scalar has been round-tripped through the product's YAML emitter.
_EMITTED: set[str] = set()


def check_inert(exp: Experiment, slot: Slot, payload: str, base: Baseline, box_base: Path) -> Outcome:
    out = Outcome()
    p = out.problems
    if not read_back(exp, slot, payload):
        p.append("the validated spec does not hold the payload byte for byte")
    names = _names(exp)

    # sbatch
    script = render_slurm(exp)
    if normalize(script, names) != base.norm_script:
        out.executed += 1
        p += check_sbatch_execution(exp, script, base.script, Sandbox.create(box_base))

    # Kubernetes
    objs = render_kubernetes(exp)
    norm = normalize(objs, names)
    cms = [o for o in objs if o["kind"] == "ConfigMap"]
    for cm, run in zip(cms, seed_runs(exp), strict=True):
        # The resolved spec travels as one YAML scalar (emitted as `longhaul render` emits it, `_yaml_docs`) and
        # must come back as the same Experiment. The rest of the ConfigMap is compared with the benign render below.
        # How that scalar is emitted depends on the characters and line shapes in it, which a payload brings along
        # whichever free-text field holds it: checked once per payload (the pure-Python emitter is slow).
        text = cm["data"][C.SPEC_FILENAME]
        if payload not in _EMITTED:
            _EMITTED.add(payload)
            if yaml.load(_yaml_docs([{"data": text}]), Loader=yaml.CSafeLoader) != {"data": text}:
                p.append(f"ConfigMap {cm['metadata']['name']}: the spec does not round-trip through YAML")
        if len(text.encode()) > bounded.SPEC.max_bytes:
            p.append(f"the ConfigMap's spec is {len(text.encode()):,} bytes: the job would refuse it")
        elif build_experiment(yaml.load(text, Loader=yaml.CSafeLoader), "configmap") != run:
            p.append("the ConfigMap's spec does not re-validate to the same Experiment")
    strip = [{k: v for k, v in o.items() if not (o["kind"] == "ConfigMap" and k == "data")} for o in norm]
    base_strip = [
        {k: v for k, v in o.items() if not (o["kind"] == "ConfigMap" and k == "data")} for o in base.norm_objs
    ]
    diffs = diff_scalars(strip, base_strip)
    if diffs:
        text = render(exp, "kubernetes").text()
        parsed = list(yaml.load_all(text, Loader=yaml.CSafeLoader))
        if parsed != objs:
            p.append("the manifests do not parse back to the rendered objects")
        base_key = next(iter(_container(_variant("apptainer"), slot) or {}), None) if KEY in slot.path else None

        def keymap(k: str) -> str:
            return "<KEY>" if k in (payload, base_key) else k

        if shape(strip, keymap) != shape(base_strip, keymap):
            p.append("the manifests' shape (keys, objects, list lengths) differs from the benign render")
        for path, new, _old in diffs:
            if isinstance(new, str) and payload not in new and not (KEY in slot.path and payload in path):
                p.append(f"manifest {path}: {new!r} does not carry the payload verbatim")
        p += [f"Kubernetes would expand {v!r}" for v in expandable_values(objs)]
        box = Sandbox.create(box_base)
        for obj in objs:
            if obj["kind"] == "RayJob":
                stage = obj["metadata"]["labels"][C.LABEL_STAGE]
                want = launcher_argv(
                    next(
                        r for r in seed_runs(exp) if run_name(r) in obj["metadata"]["name"] or len(seed_runs(exp)) == 1
                    ),
                    stage,
                )
                words, canaries = bash_words(obj["spec"]["entrypoint"], box)
                if words != want or canaries:
                    p.append(f"RayJob entrypoint splits into {words!r} in bash (want {want!r}); canaries {canaries}")

    # launch plan and veRL overrides
    plan = normalize(_plan(exp), names)
    for path, new, _old in diff_scalars(plan, base.norm_plan):
        if not isinstance(new, str) or payload not in new:
            p.append(f"launch plan {path}: {new!r} (benign {_old!r}) does not carry the payload verbatim")
        elif "argv" in path and new.startswith("-") and slot.path[-2:] != ("policy_server_cmd", ITEM):
            # (policy_server_cmd is a command line by design: its words may be options)
            p.append(f"launch plan {path}: {new!r} would be read as an option")
    verl = normalize(_verl(exp), names)
    if len(verl) != len(base.norm_verl):
        p.append(f"{len(verl)} veRL overrides, benign render has {len(base.norm_verl)}")
    else:
        p += _hydra_problems(verl, base.norm_verl, payload)
    return out


def _container(doc: dict[str, Any], slot: Slot) -> Any:
    """The map a KEY slot changes, in `doc` (for the benign key)."""
    node: Any = doc
    for part in slot.path:
        if part == KEY:
            return node
        node = node[0] if part == ITEM else node[slot.map_key or next(iter(node))] if part == VALUE else node.get(part)
    return None


def check_pair(payload: Payload, slot: Slot, baselines: dict[str, Baseline], box_base: Path) -> Outcome:
    """Refused in every variant with the field named, or inert in every variant where it is accepted."""
    total = Outcome(refused=True)
    for vname in variants_of(slot):
        doc = _variant(vname)
        place(doc, slot, payload.value)
        try:
            exp = build_experiment(doc, file="injection.yaml")
        except SpecError as exc:
            named = [pr for pr in exc.problems if re.match(re.escape(slot.prefix) + r"($|[.\[])", pr.path)]
            if not named:
                total.problems.append(f"[{vname}] refused without naming {slot.prefix}: {exc}")
            if total.refused:
                break  # refused by the field's own type: the other variants (which differ elsewhere) refuse it too
            continue
        total.refused = False
        try:
            one = check_inert(exp, slot, payload.value, baselines[vname], box_base)
        except Exception as exc:  # noqa: BLE001 - an accepted spec that cannot be rendered or re-read is a finding
            one = Outcome(problems=[f"accepted, then {type(exc).__name__}: {str(exc)[:300]}"])
        total.executed += one.executed
        total.problems += [f"[{vname}] {x}" for x in one.problems]
    return total


# ---------------------------------------------------------------------------------------------------------
# 1. Injection corpus × spec string fields


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Baseline]:
    base = tmp_path_factory.mktemp("benign")
    return {name: make_baseline(name, base) for name in VARIANTS}


def _short(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


def test_injection_corpus_through_every_spec_string_field(
    baselines: dict[str, Baseline], tmp_path: Path, reliability: Record
) -> None:
    t0 = time.monotonic()
    free = [s for s in SLOTS if not s.closed and s.path != SETUP]
    closed = [s for s in SLOTS if s.closed]
    findings: list[str] = []
    counts = {"free": [0, 0, 0], "closed": [0, 0, 0]}  # injected, survived, lost
    refused = executed = 0
    for kind, slots in (("free", free), ("closed", closed)):
        for slot in slots:
            for payload in CORPUS:
                o = check_pair(payload, slot, baselines, tmp_path)
                counts[kind][0] += 1
                executed += o.executed
                if o.problems:
                    counts[kind][2] += 1
                    findings.append(f"{slot.name} <- {payload.id} {_short(payload.value)}: {'; '.join(o.problems)}")
                else:
                    counts[kind][1] += 1
                    refused += o.refused
    reliability(
        AREA,
        f"injection corpus ({len(CORPUS)}) × spec string fields ({len(free)})",
        injected=counts["free"][0],
        survived=counts["free"][1],
        lost=counts["free"][2],
        lost_what="injections accepted",
    )
    reliability(
        AREA,
        f"injection corpus × closed-set (enum) spec fields ({len(closed)})",
        injected=counts["closed"][0],
        survived=counts["closed"][1],
        lost=counts["closed"][2],
        lost_what="injections accepted",
    )
    print(
        f"\nspec fields: {len(free)} free + {len(closed)} enum; {counts}; refused {refused}, accepted and inert "
        f"{counts['free'][1] + counts['closed'][1] - refused}; {executed} sandbox executions; "
        f"{time.monotonic() - t0:.1f} s"
    )
    assert not findings, f"{len(findings)} injection finding(s):\n" + "\n".join(findings[:60])


# ---------------------------------------------------------------------------------------------------------
# 1b. Setup lines: shell by design, but each stays one line


def test_setup_lines_stay_one_line(tmp_path: Path, reliability: Record) -> None:
    """`backends.slurm.setup` is site shell (`module load …`) and runs by design. What must hold: control
    characters and `#SBATCH` are refused with the field named; every accepted line passes `bash -n` in the whole
    script and either fails on its own (the job stops before the launcher) or leaves the launcher's argv and
    environment exactly as the spec says. A line never swallows or rewrites the rest of the script."""
    slot = next(s for s in SLOTS if s.path == SETUP)
    base = build_experiment(_variant("apptainer"), "<setup>")
    base_script = render_slurm(base)
    refused = contained = ran = failed_closed = 0
    escapes: list[str] = []
    for payload in CORPUS:
        doc = _variant("apptainer")
        place(doc, slot, payload.value)
        try:
            exp = build_experiment(doc, "injection.yaml")
        except SpecError as exc:
            assert any(p.path.startswith("spec.backends.slurm.setup") for p in exc.problems), exc
            refused += 1
            continue
        script = render_slurm(exp)
        box = Sandbox.create(tmp_path)
        path = box.root / "job.sbatch"
        path.write_text(script, encoding="utf-8", errors="surrogateescape")
        problems = sbatch_header_problems(script, base_script)
        err = bash_n(path)
        if err:
            problems.append(f"bash -n: {err}")
        else:
            proc = run_script(box, script)
            ran += bool(box.canaries())
            launches = box.records("longhaul")
            if not launches:
                if proc.returncode == 0:
                    problems.append("the script exited 0 without running the launcher")
                failed_closed += 1
            else:
                run_dir = slurm_run_dir(exp)
                want = [
                    *C.LAUNCHER_CMD[1:],
                    "--spec",
                    f"{run_dir}/{C.SPEC_FILENAME}",
                    "--backend",
                    "slurm",
                    "--run-dir",
                    run_dir,
                ]
                env = box.launcher_env()
                if launches != [want] or env.get(C.ENV_RUN_DIR) != run_dir or env.get(C.ENV_RUN_NAME) != run_name(exp):
                    problems.append(f"launcher argv/env changed: {launches!r}")
        if problems:
            escapes.append(f"{payload.id} {_short(payload.value)}: {'; '.join(problems)}")
        else:
            contained += 1
    reliability(
        AREA,
        "injection corpus × slurm setup lines (shell by design; each must stay one line)",
        injected=len(CORPUS),
        survived=refused + contained,
        lost=len(escapes),
        lost_what="lines that escaped their line",
    )
    print(
        f"\nsetup lines: {refused} refused, {contained} contained ({failed_closed} stopped the job at their line, "
        f"{ran} ran a command by design)"
    )
    assert not escapes, "\n".join(escapes)


# ---------------------------------------------------------------------------------------------------------
# Helm


def helm_bin() -> str:
    for cand in (os.environ.get("HELM"), str(ROOT / ".cache/bin/helm"), shutil.which("helm")):
        if cand and Path(cand).is_file():
            return cand
    pytest.fail("helm not found: run scripts/ci/k8s-tools.sh (installs the pinned helm into .cache/bin)")
    raise AssertionError


def helm(
    tmp: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    home = {
        "HELM_CACHE_HOME": str(tmp / ".helm/c"),
        "HELM_CONFIG_HOME": str(tmp / ".helm/g"),
        "HELM_DATA_HOME": str(tmp / ".helm/d"),
    }
    proc = subprocess.run(
        [helm_bin(), *args], capture_output=True, text=True, timeout=300, env={**os.environ, **home, **(env or {})}
    )
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout[-2000:]
    return proc


def helm_docs(tmp: Path, *sets: str) -> list[dict[str, Any]]:
    out = helm(tmp, "template", "lh", str(CHART), "--namespace", "longhaul", *sets).stdout
    return [d for d in yaml.load_all(out, Loader=yaml.CSafeLoader) if d]


@dataclass(frozen=True)
class HelmSlot:
    path: tuple[str, ...]  # with ITEM / KEY / VALUE markers

    @property
    def pointer(self) -> str:
        """JSON pointer prefix Helm's schema errors use (up to the first marker, list items as /0)."""
        out = []
        for part in self.path:
            if part in (KEY, VALUE):
                break
            out.append("0" if part == ITEM else part)
        return "/" + "/".join(out)


def helm_string_slots() -> list[HelmSlot]:
    """Every string a chart user can set: string properties of values.schema.json and string leaves of
    values.yaml, maps of strings (keys and values), lists of strings and of objects with string fields."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    found: dict[tuple[str, ...], HelmSlot] = {}

    def from_schema(node: dict[str, Any], path: tuple[str, ...]) -> None:
        kind = node.get("type")
        if kind == "string" or "enum" in node:
            found[path] = HelmSlot(path)
        elif kind == "array":
            from_schema(node.get("items", {}), (*path, ITEM))
        elif kind == "object" or "properties" in node:
            for k, sub in (node.get("properties") or {}).items():
                from_schema(sub, (*path, k))
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") == "string":
                found[(*path, KEY)] = HelmSlot((*path, KEY))
                found[(*path, VALUE)] = HelmSlot((*path, VALUE))

    def from_values(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, str):
            found.setdefault(path, HelmSlot(path))
        elif isinstance(node, list) and node and all(isinstance(x, str) for x in node):
            found.setdefault((*path, ITEM), HelmSlot((*path, ITEM)))
        elif isinstance(node, dict):
            for k, v in node.items():
                from_values(v, (*path, k))

    from_schema(schema, ())
    from_values(values, ())
    return sorted(found.values(), key=lambda s: s.path)


def _closed(slot: HelmSlot, schema: dict[str, Any]) -> bool:
    """Whether the schema limits the slot to a closed set (enum/const): no benign marker fits there."""
    node: Any = schema
    for part in slot.path:
        if part == ITEM:
            node = node.get("items", {})
        elif part in (KEY, VALUE):
            return False
        else:
            node = (node.get("properties") or {}).get(part, {})
    return "enum" in node or "const" in node


def _helm_values(
    slots: list[HelmSlot], texts: dict[HelmSlot, str], defaults: dict[str, Any], object_items: set[tuple[str, ...]]
) -> dict[str, Any]:
    """values.yaml with each slot in `texts` set to its text (maps get one entry {key text: value text})."""
    values = copy.deepcopy(defaults)
    for slot in slots:
        if slot not in texts:
            continue
        text = texts[slot]
        *parents, last = slot.path
        node: Any = values
        for i, part in enumerate(parents):
            if part == ITEM:
                node = node[0]
                continue
            if part in (KEY, VALUE):
                break
            nxt = slot.path[i + 1]
            if nxt == ITEM:
                if not isinstance(node.get(part), list) or not node[part]:
                    node[part] = [{}] if (*slot.path[: i + 2],) in object_items else [""]
            elif not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if last == ITEM:
            node[0] = text
        elif last == KEY:
            value = next(iter(node.values()), "")
            node.clear()
            node[text] = value
        elif last == VALUE:
            key = next(iter(node), None)
            node.clear()
            node[key if key is not None else "lhkey"] = text
        else:
            node[last] = text
    return values


def _replace(value: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for old, new in pairs:
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {_replace(k, pairs): _replace(v, pairs) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, pairs) for v in value]
    return value


_SCHEMA_ERROR = re.compile(r"^- at '([^']*)'")
_SOURCE = re.compile(r"^# Source: parent/charts/([^/]+)/(.*)$", re.M)


def _schema_errors(stderr: str) -> dict[str, list[str]]:
    """Helm's schema errors per chart alias: `{alias: [json pointer, ...]}`."""
    out: dict[str, list[str]] = {}
    alias = None
    for line in stderr.splitlines():
        if re.fullmatch(r"lhalias-[a-z0-9-]+:", line.strip()):
            alias = line.strip()[:-1]
            out.setdefault(alias, [])
        elif alias and (m := _SCHEMA_ERROR.match(line.strip())) and not line.rstrip().endswith("validation failed"):
            # A parent's "validation failed" only summarises its children; a map key refused by `propertyNames`
            # is reported at '' (Helm drops the map's path there).
            out[alias].append(m.group(1) or _MAP_KEY)
    return out


_MAP_KEY = "<a map key>"


def _covers(pointer: str, slot: HelmSlot) -> bool:
    """Whether a schema error at `pointer` is about `slot` (the slot itself, inside it, or its list); a refused
    map key refuses the maps' entries (each map holds one entry, the payload as key and value)."""
    if pointer == _MAP_KEY:
        return KEY in slot.path or VALUE in slot.path
    return bool(pointer) and (
        pointer == slot.pointer or pointer.startswith(slot.pointer + "/") or slot.pointer.startswith(pointer + "/")
    )


def _split_aliases(text: str) -> tuple[dict[str, list[list[Any]]], dict[str, str]]:
    """The rendered [template, document] pairs per alias, and the aliases whose output does not parse."""
    out: dict[str, list[list[Any]]] = {}
    broken: dict[str, str] = {}
    alias = None
    for chunk in re.split(r"^---\s*$", text, flags=re.M):
        m = _SOURCE.search(chunk)
        alias = m.group(1) if m else alias  # a chunk without a Source line was split off the previous one
        try:
            docs = [d for d in yaml.load_all(chunk, Loader=yaml.CSafeLoader) if d]
        except yaml.YAMLError as exc:
            broken[str(alias)] = str(exc)[:200]
            continue
        for doc in docs:
            out.setdefault(str(alias), []).append([m.group(2) if m else "<extra document>", doc])
    return out, broken


@pytest.mark.k8s
def test_injection_corpus_through_every_helm_value(tmp_path: Path, reliability: Record) -> None:
    """Every string a chart user can set, with every payload, through `helm template`: refused by the values
    schema (the error names the value) or rendered exactly as the benign render with the payload in place."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    slots = helm_string_slots()
    object_items = {s.path[:-1] for s in slots if len(s.path) > 1 and s.path[-2] == ITEM}
    closed = {s for s in slots if _closed(s, schema)}
    markers = {s: f"lhb{i}x" for i, s in enumerate(slots) if s not in closed}
    # One copy of the chart per (payload, watch mode), aliased, in one parent chart: one `helm template` run.
    parent = tmp_path / "parent"
    shutil.copytree(CHART, parent / "charts" / "longhaul")
    sub_schema = parent / "charts" / "longhaul" / "values.schema.json"
    patched = json.loads(sub_schema.read_text())
    patched["properties"]["global"] = {}  # Helm passes `global` to every subchart; the chart is not one otherwise
    sub_schema.write_text(json.dumps(patched))
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    modes = {"n": {"clusterWide": False}, "c": {"clusterWide": True}}
    aliases: dict[str, tuple[Payload | None, str]] = {}
    texts: dict[str, dict[HelmSlot, str]] = {}
    for mode in modes:
        aliases[f"lhalias-base-{mode}"] = (None, mode)
        texts[f"lhalias-base-{mode}"] = dict(markers)
        for i, p in enumerate(CORPUS):
            aliases[f"lhalias-{i:04d}-{mode}"] = (p, mode)
            # A YAML mapping key has at most 1024 characters: a longer one cannot be written in a values file.
            texts[f"lhalias-{i:04d}-{mode}"] = {
                s: markers[s] if s.path[-1] == KEY and len(p.value) > 1000 else p.value for s in slots
            }

    def write_parent(names: list[str]) -> None:
        deps = [{"name": "longhaul", "version": version, "alias": a} for a in names]
        (parent / "Chart.yaml").write_text(
            yaml.safe_dump({"apiVersion": "v2", "name": "parent", "version": "0.0.1", "dependencies": deps})
        )
        values = {}
        for a in names:
            v = _helm_values(slots, texts[a], defaults, object_items)
            v["watch"]["clusterWide"] = modes[aliases[a][1]]["clusterWide"]
            values[a] = v
        # JSON (which YAML reads unchanged): PyYAML writes YAML 1.1, and Helm would read e.g. an unquoted 1e3
        # as a number.
        (parent / "values.yaml").write_text(json.dumps(values))

    # Run 0: the benign render. A slot whose schema no marker satisfies (a const, a quantity) keeps its default and
    # is only tested for refusal.
    base_names = [a for a, (p, _) in aliases.items() if p is None]
    write_parent(base_names)
    zero = helm(tmp_path, "template", "lh", str(parent), "--namespace", "longhaul", check=False)
    for pointers in (_schema_errors(zero.stderr) if zero.returncode else {}).values():
        for s in slots:
            if any(_covers(ptr, s) for ptr in pointers):
                markers.pop(s, None)
                for a in base_names:
                    texts[a].pop(s, None)
    # Run 1: every payload in every slot; the schema names what it refuses.
    names = list(aliases)
    write_parent(names)
    first = helm(tmp_path, "template", "lh", str(parent), "--namespace", "longhaul", check=False)
    refused_at = _schema_errors(first.stderr) if first.returncode else {}
    assert first.returncode == 0 or refused_at, first.stderr[-3000:]
    refused: dict[str, set[HelmSlot]] = {}
    for a, pointers in refused_at.items():
        assert aliases[a][0] is not None, f"the benign values are refused: {pointers}"
        refused[a] = {s for s in slots if any(_covers(ptr, s) for ptr in pointers)}
        unexplained = [ptr for ptr in pointers if not any(_covers(ptr, s) for s in slots)]
        assert not unexplained, f"{a}: schema errors outside the string slots: {unexplained}\n{first.stderr[:3000]}"
    # Run 2: refused slots back to their benign marker (closed sets to their default), the rest keeps the payload.
    for a, bad in refused.items():
        for s in bad:
            if s in markers:
                texts[a][s] = markers[s]
            else:
                texts[a].pop(s, None)
    failed: dict[str, str] = {}
    for _ in range(len(names)):
        write_parent(names)
        second = helm(tmp_path, "template", "lh", str(parent), "--namespace", "longhaul", check=False)
        if second.returncode == 0:
            break
        m = re.search(r"charts/(lhalias-[a-z0-9-]+)/templates", second.stderr)
        assert m and m.group(1) in names and aliases[m.group(1)][0] is not None, second.stderr[-3000:]
        failed[m.group(1)] = second.stderr.strip()[-300:]
        names.remove(m.group(1))
    rendered, broken = _split_aliases(second.stdout)
    failed.update({a: f"the output does not parse: {e}" for a, e in broken.items()})
    findings: list[str] = []
    injected = survived = 0
    for a, (payload, mode) in aliases.items():
        if payload is None:
            continue
        bad = refused.get(a, set())
        carried = [s for s in slots if s not in bad and texts[a].get(s) == payload.value]
        injected += len(bad) + len(carried)
        survived += len(bad)
        if a in failed:
            findings.append(f"[{mode}] {payload.id}: helm template failed without naming a value: {failed[a]}")
            continue
        pairs = [(markers[s], payload.value) for s in carried if s in markers]
        expected = _replace(_replace(rendered[f"lhalias-base-{mode}"], pairs), [(f"lhalias-base-{mode}", "<alias>")])
        got = _replace(rendered.get(a, []), [(a, "<alias>")])
        if got == expected:
            survived += len(carried)
        else:
            diffs = diff_scalars(got, expected)[:3]
            findings.append(
                f"[{mode}] {payload.id} {_short(payload.value)} in {[s.path for s in carried]}: output "
                f"differs from the benign render with the payload in place: {diffs}"
            )
    reliability(
        AREA,
        f"injection corpus ({len(CORPUS)}) × Helm values ({len(slots)}) × watch modes (2)",
        injected=injected,
        survived=survived,
        lost=injected - survived,
        lost_what="injections accepted",
    )
    assert not findings, "\n".join(findings[:40])


# ---------------------------------------------------------------------------------------------------------
# 2. Path traversal

#: Path fields of the spec and what each may hold. read: models, datasets, images, venvs (absolute allowed, not
#: /proc, /sys, /dev); write: run outputs (not / or a system directory); mount: absolute, not a system directory or
#: a directory the pod mounts itself; bind: SRC[:DST[:OPTS]] (host system paths may be bound, not /; DST absolute).
PATH_FIELDS: dict[str, str] = {
    "spec.policy.model.path": "read",
    "spec.user_simulator.model.path": "read",
    "spec.sft.teacher.model.path": "read",
    "spec.sft.dataset": "read",
    "spec.backends.slurm.venv": "read",
    "spec.backends.slurm.container.image": "read",
    "spec.backends.slurm.output_dir": "write",
    "spec.backends.local.output_dir": "write",
    "spec.backends.kubernetes.checkpoint_volume.mount_path": "mount",
    "spec.backends.slurm.container.binds.[]": "bind",
}

#: (value, refused for read, write, mount, bind)
PATH_CASES: list[tuple[str, bool, bool, bool, bool]] = [
    # climbing out
    ("..", True, True, True, True),
    ("../../etc/passwd", True, True, True, True),
    ("runs/../../..", True, True, True, True),
    ("/data/../etc", True, True, True, True),
    ("/data:/data/../etc", False, False, False, True),
    # options and unexpanded home
    ("-rf", True, True, True, True),
    ("--help", True, True, True, True),
    ("~/.ssh", True, True, True, True),
    # pseudo-filesystems and system directories
    ("/proc/self/environ", True, True, True, False),
    ("/sys/kernel", True, True, True, False),
    ("/dev/sda", True, True, True, False),
    ("/etc/passwd", False, True, True, False),
    ("/etc", False, True, True, False),
    ("//etc", False, True, True, False),
    ("/usr/lib", False, True, True, False),
    ("/boot", False, True, True, False),
    ("/", False, True, True, True),
    ("/data:/proc", False, False, False, True),
    ("/data:/", False, False, False, True),
    ("/data:relative", False, False, False, True),
    # the pod's own mounts
    ("/tmp", False, False, True, False),
    ("/home/longhaul/ckpt", False, False, True, False),
    ("/scratch", False, False, True, False),
    # a path component no filesystem stores
    ("runs/" + "a" * 256, True, True, True, True),
    # lists smuggled into one bind
    ("/data,/:/host", False, False, False, True),
    # fine everywhere it makes sense
    ("runs", False, False, True, False),
    ("/checkpoints", False, False, False, False),
    ("/scratch2/runs", False, False, False, False),
    ("/usr/local/models/qwen", False, True, True, False),
    ("./-x", False, False, True, False),
    ("/dev/infiniband:/dev/infiniband", False, False, False, True),
    ("/etc/slurm:/etc/slurm:ro", False, False, False, False),
]


def _path_doc(field: str, value: str) -> dict[str, Any]:
    doc = _variant("venv" if field.endswith(".venv") else "apptainer")
    slot = next(s for s in SLOTS if s.name == field)
    place(doc, slot, value)
    return doc


def test_path_traversal_is_refused_with_the_field_named(reliability: Record) -> None:
    kinds = ("read", "write", "mount", "bind")
    wrong: list[str] = []
    injected = refused = 0
    for field, kind in PATH_FIELDS.items():
        for value, *expect in PATH_CASES:
            # ':' (bind syntax) is outside every other path's character set.
            want = True if ":" in value and kind != "bind" else expect[kinds.index(kind)]
            injected += 1
            try:
                build_experiment(_path_doc(field, value), "paths.yaml")
                got, message = False, ""
            except SpecError as exc:
                named = [p for p in exc.problems if p.path.startswith(field.removesuffix(".[]"))]
                got, message = bool(named), "; ".join(p.render() for p in exc.problems)
                if not named:
                    wrong.append(f"{field} = {value!r}: refused without naming the field: {message}")
                    continue
            refused += got
            if got != want:
                wrong.append(
                    f"{field} = {value!r}: {'refused' if got else 'accepted'}, expected "
                    f"{'refusal' if want else 'acceptance'} {message}"
                )
    reliability(
        AREA,
        "path traversal (.., options, ~, system dirs, own mounts) × path fields",
        injected=injected,
        survived=injected - len(wrong),
        lost=len(wrong),
        lost_what="wrong decisions",
    )
    assert not wrong, "\n".join(wrong)
    # The error says why, in the house style (file:line is added by load_spec; here the field and the reason).
    with pytest.raises(SpecError, match=r"spec\.backends\.slurm\.output_dir: '\.\.' is not allowed"):
        build_experiment(_path_doc("spec.backends.slurm.output_dir", "../x"), "paths.yaml")


def test_cli_run_directory_arguments(tmp_path: Path, reliability: Record) -> None:
    """`longhaul status` / `logs` take a run directory, a run name or a spec: any directory the user names is
    only read (their own files, their own rights), and one that is not a submitted run is refused clearly; nothing
    is ever written. A run name is a name: one that climbs (`../x`) never resolves outside ./runs."""
    from typer.testing import CliRunner

    from longhaul.cli import app

    (tmp_path / "runs").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (outside / "run").mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    checks = 0
    try:
        before = sorted(p.relative_to(tmp_path.parent) for p in tmp_path.parent.rglob("*") if tmp_path.name in str(p))
        runner = CliRunner()
        for args in (
            ["status", "../../etc"],
            ["status", "/proc/self"],
            ["status", "/etc"],
            ["logs", "../../etc"],
            ["status", f"../{outside.name}/run"],
            ["status", "runs/../../.."],
            ["logs", "/proc/self"],
            ["status", "../../../../../../../etc/passwd"],
            ["status", "no-such-run"],
        ):
            res = runner.invoke(app, args)
            checks += 1
            out = (res.stdout or "") + (res.stderr if res.stderr_bytes is not None else "")
            assert res.exit_code != 0, (args, out)
            assert re.search(r"not a (submitted )?run directory", out), (args, out)
        after = sorted(p.relative_to(tmp_path.parent) for p in tmp_path.parent.rglob("*") if tmp_path.name in str(p))
        assert after == before, "a status/logs call wrote files"
    finally:
        os.chdir(cwd)
    reliability(
        AREA, "CLI run-directory arguments (status/logs with .., /proc, /etc)", injected=checks, survived=checks
    )


# ---------------------------------------------------------------------------------------------------------
# 3. Pod security


def pod_security_checks(pod: dict[str, Any], *, trainer: bool) -> list[tuple[str, bool]]:
    """(check, passed) for one pod spec: non-root, read-only root filesystem, no capabilities, RuntimeDefault
    seccomp, no privilege escalation, nothing of the host; trainer pods carry no service-account token."""
    psc = pod.get("securityContext") or {}
    out = [
        ("hostNetwork/hostPID/hostIPC off", not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))),
        ("no hostPath volume", not any("hostPath" in v for v in pod.get("volumes") or [])),
        ("pod runAsUser is not root", psc.get("runAsUser", 1) != 0),
    ]
    if trainer:
        out.append(("automountServiceAccountToken: false", pod.get("automountServiceAccountToken") is False))
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        name = c.get("name")
        out += [
            (f"{name}: runAsNonRoot", bool(sc.get("runAsNonRoot", psc.get("runAsNonRoot")))),
            (f"{name}: runAsUser is not root", sc.get("runAsUser", psc.get("runAsUser", 1)) != 0),
            (f"{name}: readOnlyRootFilesystem", sc.get("readOnlyRootFilesystem") is True),
            (f"{name}: allowPrivilegeEscalation: false", sc.get("allowPrivilegeEscalation") is False),
            (f"{name}: not privileged", sc.get("privileged") is not True),
            (f"{name}: capabilities drop ALL, add none", caps.get("drop") == ["ALL"] and not caps.get("add")),
            (
                f"{name}: seccompProfile RuntimeDefault",
                (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
            ),
        ]
    return out


def _spec_variants() -> Iterator[tuple[str, Experiment]]:
    """Every shipped spec, and its multi-node (RayJob, JobSet) and multi-seed variants where the spec allows them."""
    for path in SPECS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        yield path.stem, build_experiment(copy.deepcopy(doc), str(path))
        for name, change in (
            ("nodes2-rayjob", {"nodes": 2}),
            ("nodes2-jobset", {"nodes": 2, "engine": "jobset"}),
            ("seeds", {"seeds": [1, 2]}),
        ):
            d = copy.deepcopy(doc)
            s = d["spec"]
            if "nodes" in change:
                s.setdefault("resources", {})["nodes"] = change["nodes"]
            if "engine" in change:
                s.setdefault("backends", {}).setdefault("kubernetes", {})["multinode_engine"] = change["engine"]
            if "seeds" in change:
                s.setdefault("algorithm", {}).pop("seed", None)
                s["algorithm"]["seeds"] = change["seeds"]
            try:
                yield f"{path.stem}-{name}", build_experiment(d, str(path))
            except SpecError:
                continue  # e.g. a CPU spec runs on one node


def test_every_rendered_trainer_pod_is_locked_down(reliability: Record) -> None:
    objs: list[tuple[str, dict[str, Any]]] = []
    for name, exp in _spec_variants():
        objs += [(name, o) for o in render_kubernetes(exp)]
    goldens = sorted((ROOT / "tests" / "golden").rglob("kubernetes*.yaml")) + sorted(
        (ROOT / "tests" / "golden" / "kubernetes").glob("*.yaml")
    )
    for path in dict.fromkeys(goldens):
        objs += [
            (str(path.relative_to(ROOT)), d) for d in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if d
        ]
    kinds = {o["kind"] for _, o in objs}
    assert {"Job", "RayJob", "JobSet"} <= kinds, kinds
    checks = [
        (where, o["kind"], check, ok)
        for where, o in objs
        for pod in _pod_specs(o)
        for check, ok in pod_security_checks(pod, trainer=True)
    ]
    failed = [f"{where} {kind}: {check}" for where, kind, check, ok in checks if not ok]
    reliability(
        AREA,
        "pod securityContext checks (trainer Job, RayJob head/workers, JobSet pods)",
        injected=len(checks),
        survived=len(checks) - len(failed),
        lost=len(failed),
        lost_what="checks failed",
    )
    assert not failed, "\n".join(sorted(set(failed))[:40])
    # Secrets reach the pods only by reference.
    for _, o in objs:
        for pod in _pod_specs(o):
            for c in pod["containers"]:
                for e in c.get("env") or []:
                    if e["name"] in ("MLFLOW_TRACKING_URI", "LONGHAUL_USER_SIM_API_KEY") and "valueFrom" not in e:
                        assert e["name"] == "MLFLOW_TRACKING_URI" and "@" not in e["value"], e


@pytest.mark.k8s
def test_operator_deployment_is_locked_down(tmp_path: Path, reliability: Record) -> None:
    checks = []
    for sets in ([], ["--set", "watch.clusterWide=true"], ["--set", "serviceAccount.create=false"]):
        (dep,) = [d for d in helm_docs(tmp_path, *sets) if d["kind"] == "Deployment"]
        pod = dep["spec"]["template"]["spec"]
        checks += pod_security_checks(pod, trainer=False)
        checks.append(
            (
                "operator pod: seccompProfile RuntimeDefault at pod level",
                (pod.get("securityContext") or {}).get("seccompProfile", {}).get("type") == "RuntimeDefault",
            )
        )
    # The values schema keeps these from being switched off.
    for bad in (
        "securityContext.readOnlyRootFilesystem=false",
        "securityContext.allowPrivilegeEscalation=true",
        "securityContext.privileged=true",
        "podSecurityContext.runAsNonRoot=false",
        "securityContext.capabilities.drop={NET_RAW}",
        "securityContext.capabilities.add={SYS_ADMIN}",
        "podSecurityContext.seccompProfile.type=Unconfined",
    ):
        proc = helm(tmp_path, "template", "lh", str(CHART), "--set", bad, check=False)
        checks.append((f"values schema refuses {bad}", proc.returncode != 0 and "schema" in proc.stderr))
    failed = [c for c, ok in checks if not ok]
    reliability(
        AREA,
        "pod securityContext checks (operator Deployment from the chart, values that would weaken it)",
        injected=len(checks),
        survived=len(checks) - len(failed),
        lost=len(failed),
        lost_what="checks failed",
    )
    assert not failed, failed


# ---------------------------------------------------------------------------------------------------------
# 4. RBAC allow/deny matrix

#: Every Kubernetes API call the operator makes, and kopf's own (verbs on (apiGroup, resource)):
#: - operator/longhaul_operator.py: `api.get` of the Experiment (get); kopf's watch of Experiments (list, watch),
#:   its finalizer/annotation patches (patch) and progress in `status.kopf` (patch on the status subresource);
#:   `kopf.info/warn` post core/v1 Events (create); kopf's watch of Jobs for `on.event` (list, watch).
#: - longhaul/k8s/reconcile.py through longhaul/k8s/api.py: `create` of ConfigMaps and stage workloads (create;
#:   `get` after 409 AlreadyExists), `list` of ConfigMaps and workloads by label (list), `patch_status` (patch on
#:   experiments/status). RayJobs and JobSets are only listed (the periodic re-sync), never watched. `delete` of
#:   stage workloads (Jobs, RayJobs, JobSets), only to stop a run for a spec edit under the new-run policy.
#: - cluster-wide mode only: kopf watches CustomResourceDefinitions to notice CRDs installed later (list, watch).
#:   Namespaced mode cannot grant cluster-scoped reads; kopf then falls back to the namespaces it is given.
OPERATOR_NEEDS = {
    ("longhaul.dev", "experiments"): {"get", "list", "watch", "patch"},
    ("longhaul.dev", "experiments/status"): {"patch"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
    ("", "configmaps"): {"get", "list", "create"},
    ("", "events"): {"create"},
}
ENGINE_NEEDS = {
    "rayjob": {("ray.io", "rayjobs"): {"get", "list", "create", "delete"}},
    "jobset": {("jobset.x-k8s.io", "jobsets"): {"get", "list", "create", "delete"}},
}
CLUSTER_NEEDS = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
#: With `kueue: true` the reconciler lists a queued stage's Kueue Workload (its admission message).
KUEUE_NEEDS = {("kueue.x-k8s.io", "workloads"): {"list"}}

MATRIX_RESOURCES = [
    ("", "pods"),
    ("", "pods/exec"),
    ("", "pods/log"),
    ("", "pods/attach"),
    ("", "pods/portforward"),
    ("", "secrets"),
    ("", "configmaps"),
    ("", "serviceaccounts"),
    ("", "serviceaccounts/token"),
    ("", "services"),
    ("", "endpoints"),
    ("", "nodes"),
    ("", "nodes/proxy"),
    ("", "namespaces"),
    ("", "persistentvolumeclaims"),
    ("", "persistentvolumes"),
    ("", "events"),
    ("", "users"),
    ("", "groups"),
    ("events.k8s.io", "events"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("apps", "deployments"),
    ("apps", "daemonsets"),
    ("apps", "statefulsets"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    ("coordination.k8s.io", "leases"),
    ("certificates.k8s.io", "certificatesigningrequests"),
    ("longhaul.dev", "experiments"),
    ("longhaul.dev", "experiments/status"),
    ("ray.io", "rayjobs"),
    ("jobset.x-k8s.io", "jobsets"),
    ("kopf.dev", "kopfpeerings"),
    ("kopf.dev", "clusterkopfpeerings"),
    ("kueue.x-k8s.io", "workloads"),
    ("kueue.x-k8s.io", "localqueues"),
    ("kueue.x-k8s.io", "clusterqueues"),
]
MATRIX_VERBS = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "approve",
    "sign",
]


def allowed_triples(roles: list[dict[str, Any]]) -> tuple[set[tuple[str, str, str]], list[str]]:
    """(apiGroup, resource, verb) the rules allow, and everything that would widen them beyond a list (wildcards,
    nonResourceURLs, aggregation)."""
    allowed: set[tuple[str, str, str]] = set()
    wide: list[str] = []
    for role in roles:
        if role.get("aggregationRule"):
            wide.append(f"{role['metadata']['name']}: aggregationRule")
        for rule in role.get("rules") or []:
            if rule.get("nonResourceURLs"):
                wide.append(f"nonResourceURLs {rule['nonResourceURLs']}")
            for field in ("apiGroups", "resources", "verbs"):
                if "*" in (rule.get(field) or []) or any("*" in x for x in rule.get(field) or []):
                    wide.append(f"wildcard in {field}: {rule}")
            allowed |= {
                (g, r, v)
                for g in rule.get("apiGroups", [])
                for r in rule.get("resources", [])
                for v in rule.get("verbs", [])
            }
    return allowed, wide


@pytest.mark.k8s
def test_rbac_is_exactly_what_the_operator_needs(tmp_path: Path, reliability: Record) -> None:
    cells = mismatches = 0
    problems: list[str] = []
    configs = [
        (cluster, engines, False) for cluster in (False, True) for engines in ([], ["rayjob"], ["rayjob", "jobset"])
    ]
    configs += [(False, ["rayjob", "jobset"], True), (True, [], True)]
    for cluster, engines, kueue in configs:
        sets = [
            "--set",
            f"watch.clusterWide={str(cluster).lower()}",
            "--set",
            "watch.namespaces={team-a}",
            "--set",
            f"kueue={str(kueue).lower()}",
        ]
        if engines:
            sets += ["--set", "multinodeEngines={" + ",".join(engines) + "}"]
        docs = helm_docs(tmp_path, *sets)
        roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
        bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        assert [r["kind"] for r in roles] == (["ClusterRole"] if cluster else ["Role", "Role"]), roles
        assert {b["roleRef"]["name"] for b in bindings} == {r["metadata"]["name"] for r in roles}
        for b in bindings:
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": "lh-longhaul", "namespace": "longhaul"}]
        needs: dict[tuple[str, str], set[str]] = {k: set(v) for k, v in OPERATOR_NEEDS.items()}
        for e in engines:
            needs.update(ENGINE_NEEDS[e])
        if cluster:
            needs.update(CLUSTER_NEEDS)
        if kueue:
            needs.update(KUEUE_NEEDS)
        need = {(g, r, v) for (g, r), vs in needs.items() for v in vs}
        for role in roles:  # each namespace's Role on its own grants exactly the need
            allowed, wide = allowed_triples([role])
            problems += wide
            if allowed != need:
                problems.append(
                    f"{role['kind']} {role['metadata'].get('namespace', '')} cluster={cluster} "
                    f"engines={engines} kueue={kueue}: extra {sorted(allowed - need)}, missing {sorted(need - allowed)}"
                )
            for g, r in MATRIX_RESOURCES:
                for v in MATRIX_VERBS:
                    cells += 1
                    if ((g, r, v) in allowed) != ((g, r, v) in need):
                        mismatches += 1
    reliability(
        AREA,
        f"RBAC allow/deny matrix ({len(MATRIX_RESOURCES)} resources × {len(MATRIX_VERBS)} verbs × "
        f"{len(configs)} chart configurations × roles)",
        injected=cells,
        survived=cells - mismatches,
        lost=mismatches,
        lost_what="cells allowed but not needed, or needed but denied",
    )
    assert not problems and not mismatches, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# 5. Planted secrets

SECRET = "lh-planted-SECRET-7f3a9c"
#: Where a user or a site keeps credentials: in the environment (Slurm, local) or in Kubernetes Secrets.
SECRET_ENV = {
    "MLFLOW_TRACKING_URI": f"http://lhuser:{SECRET}@mlflow.example:5000",
    "MLFLOW_TRACKING_PASSWORD": SECRET,
    "HF_TOKEN": SECRET,
    "LONGHAUL_USER_SIM_API_KEY": SECRET,
    "LONGHAUL_POLICY_API_KEY": SECRET,
    "AWS_SECRET_ACCESS_KEY": SECRET,
}


def _secret_spec(tmp_path: Path) -> Path:
    """A spec whose tracking URI and simulator key live in Kubernetes Secrets (by reference)."""
    doc = _variant("external-sim")
    doc["spec"]["tracking"] = {"uri_secret": {"name": "mlflow", "key": "tracking-uri"}, "experiment": "exp"}
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _output(res: Any) -> str:
    text = res.output or ""
    try:
        text += res.stderr or ""
    except ValueError:  # stderr mixed into output
        pass
    return text


def test_planted_secret_never_reaches_a_rendered_artefact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reliability: Record
) -> None:
    from typer.testing import CliRunner

    from longhaul.cli import app

    spec = _secret_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    artefacts: dict[str, str] = {}
    for backend in BACKENDS:
        res = runner.invoke(app, ["render", str(spec), "--backend", backend], env=SECRET_ENV)
        assert res.exit_code == 0, _output(res)
        artefacts[f"longhaul render --backend {backend}"] = _output(res)
        out = tmp_path / f"rendered-{backend}"
        res = runner.invoke(app, ["render", str(spec), "--backend", backend, "--out", str(out)], env=SECRET_ENV)
        assert res.exit_code == 0, _output(res)
        artefacts.update({str(f.relative_to(tmp_path)): f.read_text() for f in out.rglob("*") if f.is_file()})
    for backend in ("slurm", "kubernetes", "local"):
        res = runner.invoke(
            app, ["submit", str(spec), "--backend", backend, "--dry-run", "--ignore-memory-plan"], env=SECRET_ENV
        )
        assert res.exit_code == 0, _output(res)
        artefacts[f"longhaul submit --backend {backend} --dry-run"] = _output(res)
    res = runner.invoke(app, ["validate", str(spec)], env=SECRET_ENV)
    artefacts["longhaul validate"] = _output(res)
    for path in sorted((ROOT / "tests" / "golden").rglob("*")):
        if path.is_file():
            artefacts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8", errors="replace")
    leaks = [name for name, text in artefacts.items() if SECRET in text]
    reliability(
        AREA,
        "planted secret × rendered artefacts (render/submit --dry-run of every backend, goldens)",
        injected=len(artefacts),
        survived=len(artefacts) - len(leaks),
        lost=len(leaks),
        lost_what="artefacts holding the secret",
    )
    assert not leaks, leaks
    # The secrets reach the job by reference only.
    objs = render_kubernetes(build_experiment(yaml.safe_load(spec.read_text()), str(spec)))
    env = {e["name"]: e for o in objs for pod in _pod_specs(o) for c in pod["containers"] for e in c["env"]}
    assert env["MLFLOW_TRACKING_URI"] == {
        "name": "MLFLOW_TRACKING_URI",
        "valueFrom": {"secretKeyRef": {"name": "mlflow", "key": "tracking-uri"}},
    }
    assert env["LONGHAUL_USER_SIM_API_KEY"] == {
        "name": "LONGHAUL_USER_SIM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "sim", "key": "api-key"}},
    }
    # A credential written into the spec itself is refused before anything is rendered.
    for field in ("tracking", "user_simulator", "sft.teacher"):
        doc = yaml.safe_load(spec.read_text())
        node = doc["spec"]
        for part in field.split("."):
            node = node.setdefault(part, {})
        key = "uri" if field == "tracking" else "url"
        node.pop("uri_secret", None)
        node[key] = f"http://lhuser:{SECRET}@mlflow.example:5000"
        with pytest.raises(SpecError, match=rf"spec\.{re.escape(field)}\.{key}: credentials in the URL") as refused:
            build_experiment(doc, "secret.yaml")
        # ... and the refusal, which ends up in terminals, CI logs and the Experiment's status, does not echo it
        assert SECRET not in str(refused.value) and "lhuser:***@mlflow.example" in str(refused.value)


@pytest.mark.k8s
def test_planted_secret_not_in_helm_output(tmp_path: Path, reliability: Record) -> None:
    outputs = {}
    for sets in ([], ["--set", "watch.clusterWide=true", "--set", "multinodeEngines={rayjob,jobset}"]):
        proc = helm(tmp_path, "template", "lh", str(CHART), "--include-crds", *sets, env=SECRET_ENV)
        outputs[" ".join(sets) or "defaults"] = proc.stdout + proc.stderr
    leaks = [k for k, v in outputs.items() if SECRET in v]
    reliability(
        AREA,
        "planted secret × helm template outputs",
        injected=len(outputs),
        survived=len(outputs) - len(leaks),
        lost=len(leaks),
        lost_what="artefacts holding the secret",
    )
    assert not leaks


def _grpo_stand_in(ctx: Any) -> None:
    """The grpo stage of the run-time secret test, in process: what veRL's MLflow logger does (a metric on the run,
    through the tracking URI with its credentials) without veRL."""
    from longhaul.tracking.runs import log_metrics

    log_metrics(ctx.tracking_uri, ctx.run_id, {"critic/score/mean": 0.5}, 1)


def _eval_stand_in(ctx: Any) -> None:
    pass


@pytest.mark.mlflow
def test_planted_secret_not_in_logs_run_directory_or_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], reliability: Record
) -> None:
    """A launcher run (local backend, stand-in vLLM servers, stages in process) against a real MLflow server whose
    URI carries credentials, with more secrets in the environment: none may reach the console, the run directory,
    the server logs, or MLflow's params, tags, metrics and artifacts (the whole store is grepped)."""
    from mlflow.tracking import MlflowClient

    from longhaul.launcher import EXIT_OK, supervisor
    from support.mlflow_server import running_mlflow_server
    from support.net import free_port

    fake = ROOT / "tests" / "unit" / "launcher" / "fake_vllm.py"
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["user_simulator"]["port"] = free_port()
    doc["spec"]["backends"].setdefault("local", {})["policy_port"] = free_port()
    doc["spec"]["user_simulator"]["startup_timeout_s"] = 60
    spec = tmp_path / "smoke.yaml"
    spec.write_text(yaml.safe_dump(doc))
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{fake}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setitem(sys.modules, "lh_security_stages", sys.modules[__name__])
    monkeypatch.setattr(
        supervisor,
        "STAGES",
        {"grpo": lambda ctx, _stage: _grpo_stand_in(ctx), "eval": lambda ctx, _stage: _eval_stand_in(ctx)},
    )
    run_dir = tmp_path / "run"
    monkeypatch.setenv(supervisor.ENV_MLFLOW_QUIET_URL, "false")  # the launcher turns it on; restored afterwards
    with running_mlflow_server(tmp_path / "mlflow") as server:
        env = {
            **os.environ,
            **SECRET_ENV,
            "MLFLOW_TRACKING_URI": server.uri.replace("://", f"://lhuser:{SECRET}@"),
            "LONGHAUL_VLLM_PYTHON": str(wrapper),
            "FAKE_VLLM_LOG": str(tmp_path / "fake.jsonl"),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        }
        env.pop(C.ENV_RUN_NAME, None)
        rc = supervisor.launch(spec, "local", run_dir, environ=env)
        console = capfd.readouterr()
        client = MlflowClient(server.uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert rc == EXIT_OK and runs, console.out[-3000:] + console.err[-3000:]
        mlflow_views = {}
        for r in runs:
            mlflow_views[f"run {r.info.run_name}: params"] = json.dumps(r.data.params)
            mlflow_views[f"run {r.info.run_name}: tags"] = json.dumps(r.data.tags)
            mlflow_views[f"run {r.info.run_name}: metric keys"] = json.dumps(sorted(r.data.metrics))
            for art in client.list_artifacts(r.info.run_id, "spec"):
                local = client.download_artifacts(r.info.run_id, art.path, str(tmp_path / "dl"))
                mlflow_views[f"run {r.info.run_name}: artifact {art.path}"] = Path(local).read_text()
    places = {
        "launcher stdout": console.out,
        "launcher stderr": console.err,
        **mlflow_views,
        "MLflow store (sqlite, whole file)": server.db_path.read_bytes().decode("latin-1"),
        "MLflow server log": server.log_path.read_text(errors="replace"),
    }
    places.update(
        {
            f"run dir: {p.relative_to(run_dir)}": p.read_bytes().decode("latin-1")
            for p in run_dir.rglob("*")
            if p.is_file()
        }
    )
    places.update(
        {
            f"artifacts: {p.relative_to(tmp_path)}": p.read_bytes().decode("latin-1")
            for p in (tmp_path / "mlflow").rglob("*")
            if p.is_file() and "artifacts" in p.parts
        }
    )
    leaks = [k for k, v in places.items() if SECRET in v]
    reliability(
        AREA,
        "planted secret × launcher run (console, run directory, server logs, MLflow store)",
        injected=len(places),
        survived=len(places) - len(leaks),
        lost=len(leaks),
        lost_what="places holding the secret",
    )
    assert f"in {server.uri.replace('://', '://lhuser:***@')}" in console.out  # still says where, redacted
    lines = {k: [ln for ln in v.splitlines() if SECRET in ln][:3] for k, v in places.items() if k in leaks}
    assert not lines, lines
