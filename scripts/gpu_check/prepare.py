"""Write the bundle of longhaul's one-GPU memory check (run here, in longhaul's venv; check.py runs on the GPU).

    .venv/bin/python scripts/gpu_check/prepare.py --out build/gpu-check      (or: make gpu-check-bundle OUT=...)

For every spec in specs/ whose plan has GPU phases, it records what `longhaul plan SPEC --json` prints (the plan's
per-phase rows, the busiest GPU's column, each row tagged with what the check measures for it) and the actor
settings `longhaul render SPEC --backend verl` renders, completed with veRL's own defaults for the keys longhaul
does not render (read from the installed veRL's generated trainer config). Only the public CLI output is used,
never longhaul's modules. A sweep adds smaller Qwen2.5 shapes planned with one shipped spec's settings (a
config.json per shape written from check_shapes.py, passed to `longhaul plan` as spec.policy.model.path), and
each spec is planned once more with spec.policy.use_fused_kernels off, for the planner's unfused-logits figure.

The bundle: cases.json, the check's scripts (check*.py), veRL's torch-only fused log-prob kernel module
copied from the installed veRL (verl/utils/experimental/torch_functional.py, as verl_torch_functional.py), and
longhaul's FSDP2 wrap rule for that kernel, the module longhaul's veRL plugin applies in every veRL worker
(pipelines/longhaul/verlcpu/fused_head.py, as longhaul_fused_head.py; it imports nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LIMIT = 64 << 20
FUSED_FILE = "verl_torch_functional.py"
HEAD_RULE_FILE = "longhaul_fused_head.py"
HEAD_RULE_SOURCE = ROOT / "pipelines" / "longhaul" / "verlcpu" / "fused_head.py"
SCRIPTS = ("check.py", "check_model.py", "check_report.py", "check_shapes.py", "check_stages.py")
#: Plan row labels (their beginnings) → what the check measures for them; every other row is "held": another
#: tenant's memory (simulator, rollout engine), taken as planned.
ROW_KEYS = (
    ("trainer process", "context"),
    ("actor parameters", "params"),
    ("actor gradients", "gradients"),
    ("actor adamw", "optimizer"),
    ("fsdp all-gather", "gather"),
    ("activations", "activations"),
    ("logits", "logits"),
    ("reference", "reference"),
    ("adapter tensor in flight", "in_flight"),
    ("weight-sync bucket", "bucket"),
)
#: veRL's own defaults where neither longhaul's render nor the generated config says: HFModelConfig's
#: attn_implementation (verl/workers/config/model.py) and FusedLinearForPPO's chunk_size (its __init__ default).
VERL_CODE_DEFAULTS = {"attn_implementation": "flash_attention_2", "fused_chunk_size": 512}


def _shapes():
    spec = importlib.util.spec_from_file_location("gpu_check_shapes", HERE / "check_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _longhaul(args: list[str], command: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def fetch_plan(spec: Path, command: list[str]) -> dict:
    """`longhaul plan SPEC --json` (exit 1, a phase that does not fit, still prints the plan)."""
    rc, out, err = _longhaul(["plan", str(spec), "--json"], command)
    if rc not in (0, 1):
        raise SystemExit(f"longhaul plan {spec} failed (exit {rc}): {err.strip() or out.strip()}")
    return json.loads(out)


def fetch_overrides(spec: Path, command: list[str]) -> dict:
    """`longhaul render SPEC --backend verl` parsed into {dotted key: value} (Hydra's `+` prefix dropped)."""
    rc, out, err = _longhaul(["render", str(spec), "--backend", "verl"], command)
    if rc != 0:
        raise SystemExit(f"longhaul render {spec} --backend verl failed (exit {rc}): {err.strip()}")
    overrides = {}
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("~") or "=" not in line:
            continue
        key, _, raw = line.lstrip("+").partition("=")
        try:
            overrides[key] = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            overrides[key] = raw
    return overrides


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def verl_files() -> tuple[Path, dict, str]:
    """(the fused kernel module's path, veRL's generated trainer config flattened, veRL's version) from the
    installed veRL, located without importing it."""
    found = importlib.util.find_spec("verl")
    if found is None or not found.submodule_search_locations:
        raise SystemExit("veRL is not installed in this interpreter: run prepare with longhaul's venv (make install)")
    root = Path(next(iter(found.submodule_search_locations)))
    kernel = root / "utils" / "experimental" / "torch_functional.py"
    if "class FusedLinearForPPOFunction" not in kernel.read_text():
        raise SystemExit(f"{kernel} has no FusedLinearForPPOFunction: not the veRL 0.9 layout this check mirrors")
    config = yaml.safe_load((root / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text())
    return kernel, _flatten(config), importlib.metadata.version("verl")


def build_settings(overrides: dict, defaults: dict) -> dict:
    """The actor settings the check needs: rendered overrides first, then veRL's defaults."""

    def get(key: str, fallback=None):
        return overrides.get(key, defaults.get(key, fallback))

    a, m, r = "actor_rollout_ref.actor.", "actor_rollout_ref.model.", "actor_rollout_ref.rollout."
    mixed = get(a + "fsdp_config.mixed_precision") or {}
    return {
        "model_id": get(m + "path"),
        "lora_rank": int(get(m + "lora_rank", 0)),
        "lora_alpha": float(get(m + "lora_alpha", 16)),
        "target_modules": get(m + "target_modules", "all-linear"),
        "lora_merge": bool(get(m + "lora.merge", False)),
        "world": int(get("trainer.nnodes", 1)) * int(get("trainer.n_gpus_per_node", 1)),
        "strategy": get(a + "strategy", get(a + "fsdp_config.strategy")),
        "model_dtype": get(a + "fsdp_config.model_dtype", "fp32"),
        # FSDPEngine._build_fsdp_module: mixed_precision None → bf16 params, fp32 reduce
        "param_dtype": mixed.get("param_dtype", "bf16"),
        "reduce_dtype": mixed.get("reduce_dtype", "fp32"),
        "reshard_after_forward": bool(get(a + "fsdp_config.reshard_after_forward", True)),
        "param_offload": bool(get(a + "fsdp_config.param_offload", False)),
        "optimizer_offload": bool(get(a + "fsdp_config.optimizer_offload", False)),
        "gradient_checkpointing": bool(get(m + "enable_gradient_checkpointing", False)),
        "use_fused_kernels": bool(get(m + "use_fused_kernels", False)),
        "fused_backend": get(m + "fused_kernel_options.impl_backend", "torch"),
        "fused_chunk_size": VERL_CODE_DEFAULTS["fused_chunk_size"],
        "attn_implementation": get(
            m + "override_config.attn_implementation", VERL_CODE_DEFAULTS["attn_implementation"]
        ),
        "use_remove_padding": bool(get(m + "use_remove_padding", True)),
        "micro_batch": int(get(a + "ppo_micro_batch_size_per_gpu")),
        "seq_len": int(get("data.max_prompt_length")) + int(get("data.max_response_length")),
        "load_format": str(get(r + "load_format", "dummy")),
        "layered_summon": bool(get(r + "layered_summon", False)),
        "bucket_mb": int(get(r + "checkpoint_engine.update_weights_bucket_megabytes", 2048)),
    }


def is_gpu_plan(plan: dict) -> bool:
    """A plan whose GPU-only phases (rollout, weight sync, evaluation) apply: the spec's resources are GPUs."""
    return any(p["applies"] for p in plan["phases"] if p["name"] != "training")


def _row_key(label: str) -> str:
    low = label.lower()
    return next((key for prefix, key in ROW_KEYS if low.startswith(prefix)), "held")


def plan_figures(plan: dict) -> dict:
    """Per GPU phase the check measures (training, sync): capacity, the busiest GPU's total and its rows."""
    figures = {}
    for phase in plan["phases"]:
        if phase["name"] not in ("training", "sync") or not phase["applies"]:
            continue
        col = max(range(len(phase["columns"])), key=lambda i: phase["total_bytes"][i])
        figures[phase["name"]] = {
            "column": phase["columns"][col],
            "capacity": phase["capacity_bytes"],
            "total": phase["total_bytes"][col],
            "rows": [
                {"label": row["label"], "key": _row_key(row["label"]), "bytes": row["bytes"][col]}
                for row in phase["rows"]
                if row["counted"]
            ],
        }
    return figures


def _count(text: str | None) -> float | None:
    if not text:
        return None
    number, unit = text.split()
    return float(number) * {"K": 1e3, "M": 1e6, "B": 1e9}[unit]


def plan_shape(plan: dict) -> dict:
    """The parameter counts the plan's header states ("7.62 B parameters", "40.4 M trainable of 7.66 B")."""
    header = plan.get("header", {})
    params = re.search(r"([\d.]+ [KMB]) parameters", header.get("policy", ""))
    actor = re.search(r"([\d.]+ [KMB]) trainable of ([\d.]+ [KMB])", header.get("actor", ""))
    return {
        "params": _count(params and params.group(1)),
        "trainable": _count(actor and actor.group(1)),
        "total": _count(actor and actor.group(2)) or _count(params and params.group(1)),
    }


def make_case(name: str, spec: str, shipped: bool, plan: dict, settings: dict) -> dict:
    """One entry of cases.json."""
    return {
        "name": name,
        "spec": spec,
        "shipped": shipped,
        "title": plan["title"],
        "settings": settings,
        "plan_shape": plan_shape(plan),
        "figures": plan_figures(plan),
        "plan": plan,
    }


def sweep_cases(base: dict, spec_file: Path, command: list[str], tmp: Path) -> list[dict]:
    """The base spec re-planned at each sweep shape (its config.json given as spec.policy.model.path)."""
    shapes = _shapes()
    doc = yaml.safe_load(spec_file.read_text())
    cases = []
    for model_id in shapes.SWEEP:
        folder = tmp / model_id.replace("/", "--")
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(shapes.published_config(model_id), indent=1))
        doc["spec"]["policy"]["model"] = {"name": model_id, "path": str(folder)}
        variant = tmp / f"{spec_file.stem}--{folder.name}.yaml"
        variant.write_text(yaml.safe_dump(doc, sort_keys=False))
        plan = fetch_plan(variant, command)
        settings = {**base["settings"], "model_id": model_id}
        size = model_id.split("-")[1].lower()
        cases.append(make_case(f"{spec_file.stem}@qwen2.5-{size}", base["spec"], False, plan, settings))
    return cases


def unfused_logits(spec_file: Path, command: list[str], tmp: Path) -> int | None:
    """The plan's logits row (busiest GPU, training phase) for the spec with spec.policy.use_fused_kernels off:
    the planner's figure beside the check's unfused measurement."""
    doc = yaml.safe_load(spec_file.read_text())
    doc["spec"]["policy"]["use_fused_kernels"] = False
    variant = tmp / f"{spec_file.stem}--unfused.yaml"
    variant.write_text(yaml.safe_dump(doc, sort_keys=False))
    rows = plan_figures(fetch_plan(variant, command)).get("training", {}).get("rows", [])
    return next((r["bytes"] for r in rows if r["key"] == "logits"), None)


def _command(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    beside = Path(sys.executable).with_name("longhaul")
    found = str(beside) if beside.exists() else shutil.which("longhaul")
    if not found:
        raise SystemExit("no `longhaul` command beside this interpreter or on PATH: run with longhaul's venv")
    return [found]


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def check_out(out: Path) -> None:
    """Refuse a folder that holds anything but an earlier bundle (prepare overwrites the bundle's files)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "cases.json").exists())):
        raise SystemExit(f"{out} exists and is not a gpu-check bundle: choose an empty or new folder")


def write_bundle(out: Path, cases: list[dict], kernel: Path, verl_version: str) -> int:
    """Write the bundle folder; return its size in bytes (refuses a folder that is not an earlier bundle)."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in SCRIPTS:
        shutil.copyfile(HERE / name, out / name)
    shutil.copyfile(kernel, out / FUSED_FILE)
    shutil.copyfile(HEAD_RULE_SOURCE, out / HEAD_RULE_FILE)
    meta = {
        "format": 1,
        "verl_version": verl_version,
        "fused_kernel_source": "verl/utils/experimental/torch_functional.py",
        "fused_kernel_sha256": hashlib.sha256(kernel.read_bytes()).hexdigest(),
        "fused_head_source": str(HEAD_RULE_SOURCE.relative_to(ROOT)),
        "fused_head_sha256": hashlib.sha256(HEAD_RULE_SOURCE.read_bytes()).hexdigest(),
        "longhaul_commit": _commit(),
        "cases": cases,
    }
    (out / "cases.json").write_text(json.dumps(meta, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if size > LIMIT:
        raise SystemExit(f"bundle {out} is {size / 2**20:.1f} MiB, over the 64 MiB a GPU machine takes")
    return size


def main(argv: list[str] | None = None) -> int:
    """Plan and render the specs through longhaul's CLI and write the bundle."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the bundle folder to write")
    ap.add_argument("--specs", nargs="*", type=Path, default=None, help="spec files (default: specs/*.yaml)")
    ap.add_argument("--sweep-spec", default="prm_lite_lata", help="the shipped spec the shape sweep re-plans")
    ap.add_argument("--no-sweep", action="store_true", help="only the shipped specs")
    ap.add_argument("--longhaul", default=None, help="the longhaul command (default: beside this interpreter)")
    args = ap.parse_args(argv)
    check_out(args.out)
    command = _command(args.longhaul)
    specs = args.specs or sorted((ROOT / "specs").glob("*.yaml"))
    kernel, defaults, verl_version = verl_files()
    with ThreadPoolExecutor(max_workers=4) as pool:  # each CLI call is a second of interpreter start-up
        plans = list(pool.map(lambda s: fetch_plan(s, command), specs))
        gpu = [(s, p) for s, p in zip(specs, plans, strict=True) if is_gpu_plan(p)]
        overrides = list(pool.map(lambda sp: fetch_overrides(sp[0], command), gpu))
    cases = []
    for (spec, plan), ov in zip(gpu, overrides, strict=True):
        rel = str(spec.resolve().relative_to(ROOT)) if spec.resolve().is_relative_to(ROOT) else str(spec)
        cases.append(make_case(spec.stem, rel, True, plan, build_settings(ov, defaults)))
    skipped = [s.stem for s in specs if s.stem not in {c["name"] for c in cases}]
    base = next((c for c in cases if c["name"] == args.sweep_spec), None)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=4) as pool:
        folders = [Path(tmp) / str(i) for i in range(len(gpu))]
        for folder in folders:
            folder.mkdir()
        unfused = pool.map(lambda a: unfused_logits(a[0][0], command, a[1]), zip(gpu, folders, strict=True))
        for case, logits in zip(cases, list(unfused), strict=True):
            case["figures"]["unfused_logits"] = logits
        if not args.no_sweep and base is not None:
            cases += sweep_cases(base, ROOT / base["spec"], command, Path(tmp))
    size = write_bundle(args.out, cases, kernel, verl_version)
    shipped = [c["name"] for c in cases if c["shipped"]]
    print(f"GPU specs: {', '.join(shipped)}" + (f" (not GPU specs: {', '.join(skipped)})" if skipped else ""))
    print(f"sweep: {', '.join(c['name'] for c in cases if not c['shipped']) or 'none'}")
    print(f"bundle {args.out}: {len(list(args.out.iterdir()))} files, {size / 1024:.1f} KiB (limit 64 MiB)")
    print(f"run on a GPU machine: python3 {args.out.name}/check.py   (self-test here: check.py --dry)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
