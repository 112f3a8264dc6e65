"""The one-GPU memory check end to end through its command lines: `scripts/gpu_check/prepare.py` writes the bundle
from longhaul's CLI output, then the bundle's `check.py --dry` runs as it would on a GPU machine that has torch
and transformers but no longhaul, veRL, vLLM, Ray, PEFT or pydantic: `python -I` from a folder outside the
repository, with those packages made unimportable (a `None` entry in sys.modules is how Python spells "not
installed" to both `import` and `importlib.util.find_spec`).

What the dry run proves on this CPU: the bundle is self-contained; each shipped GPU spec's plan figures reach the
table unchanged; the actor is built from the published shape family, LoRA'd, sharded with FSDP2 on a fake 2-rank
group and run through the export, two-step sync, a training step with veRL's copied fused kernel, and the logits
stage; the untied 7B/8B actors are sharded with longhaul's fix for veRL's fused-kernel wiring (an untied lm_head
in the root FSDP unit), applied from the bundle's byte-for-byte copy of the module longhaul's veRL plugin uses,
and the wiring probe shows veRL's wrapping alone failing where the fix passes. What it cannot prove: any CUDA
figure (reported as "skipped: needs CUDA").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PREPARE = ROOT / "scripts" / "gpu_check" / "prepare.py"
LONGHAUL = Path(sys.executable).with_name("longhaul")
GiB = 1 << 30
BLOCKED = ("longhaul", "verl", "vllm", "ray", "pydantic", "peft")
#: Runs a script as __main__ with BLOCKED unimportable, then records which of them were imported anyway.
RUNNER = """
import json, runpy, sys
blocked = {blocked!r}
for name in blocked:
    sys.modules[name] = None
sys.argv = sys.argv[1:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    code = exc.code
leaked = sorted(m for m, v in sys.modules.items() if m.split(".")[0] in blocked and v is not None)
open({record!r}, "w").write(json.dumps(leaked))
sys.exit(code)
"""


def _plan(spec: Path) -> dict:
    proc = subprocess.run([str(LONGHAUL), "plan", str(spec), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    """`longhaul plan --json` of every shipped spec, straight from the CLI."""
    specs = sorted((ROOT / "specs").glob("*.yaml"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip([s.stem for s in specs], pool.map(_plan, specs), strict=True))


@pytest.fixture(scope="module")
def gpu_specs(plans: dict[str, dict]) -> list[str]:
    """The specs whose plan has GPU phases (rollout, weight sync, evaluation apply)."""
    names = [n for n, p in plans.items() if any(ph["applies"] for ph in p["phases"] if ph["name"] != "training")]
    assert {"prm_lite_lata", "qwen3_8b"} <= set(names) and "smoke" not in names
    return names


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The bundle as `make gpu-check-bundle` writes it."""
    out = tmp_path_factory.mktemp("gpu-check") / "bundle"
    proc = subprocess.run([sys.executable, str(PREPARE), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def _run_isolated(bundle: Path, cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str], float]:
    record = cwd / "imported.json"
    code = RUNNER.format(blocked=BLOCKED, record=str(record))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, str(bundle / "check.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    return proc, json.loads(record.read_text()) if record.exists() else ["<no record>"], time.monotonic() - t0


@pytest.fixture(scope="module")
def dry(bundle: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory):
    """`check.py --dry` run from the bundle, isolated; its stdout, JSON result, leaked imports and seconds."""
    cwd = tmp_path_factory.mktemp("gpu-host")
    proc, leaked, seconds = _run_isolated(bundle[0], cwd, "--dry", "--out", "result.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads((cwd / "result.json").read_text()), leaked, seconds


#: LoRA r=16, r x (in + out) per projection, on the tiny actors' 2 layers: q and o 64 <-> 64, k and v 64 -> 32
#: (2 KV heads x 16), gate, up and down 64 <-> 160.
_TINY_TRAINABLE = 2 * 16 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 160))


#: The tiny untied Qwen2.5 actor: embeddings and head 1024 x 64 each, 2 layers, final norm.
_TINY_UNTIED_PARAMS = 2 * 1024 * 64 + 2 * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 160 + 2 * 64) + 64


def _busiest(phase: dict) -> int:
    return max(phase["total_bytes"])


def test_bundle_is_self_contained_and_small(bundle: tuple[Path, str], gpu_specs: list[str]) -> None:
    out, stdout = bundle
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        ["cases.json", "check.py", "check_model.py", "check_report.py", "check_shapes.py", "check_stages.py",
         "longhaul_fused_head.py", "verl_torch_functional.py"]
    )  # fmt: skip
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size <= 64 << 20
    assert f"{size / 1024:.1f} KiB (limit 64 MiB)" in stdout
    # veRL's kernel is the installed veRL's file, byte for byte, copied at prepare time
    verl = Path(next(iter(importlib.util.find_spec("verl").submodule_search_locations)))
    installed = (verl / "utils" / "experimental" / "torch_functional.py").read_bytes()
    assert (out / "verl_torch_functional.py").read_bytes() == installed
    meta = json.loads((out / "cases.json").read_text())
    assert meta["fused_kernel_sha256"] == hashlib.sha256(installed).hexdigest()
    # longhaul's lm_head wrap rule is the module its veRL plugin applies in every worker, byte for byte
    rule = (ROOT / "pipelines" / "longhaul" / "verlcpu" / "fused_head.py").read_bytes()
    assert (out / "longhaul_fused_head.py").read_bytes() == rule
    assert meta["fused_head_sha256"] == hashlib.sha256(rule).hexdigest()
    assert meta["verl_version"] == "0.9.1"
    shipped = [c for c in meta["cases"] if c["shipped"]]
    assert sorted(c["name"] for c in shipped) == sorted(gpu_specs)
    assert {c["settings"]["model_id"] for c in meta["cases"] if not c["shipped"]} == {
        "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct"
    }  # fmt: skip


def test_bundle_carries_the_rendered_actor_settings(bundle: tuple[Path, str]) -> None:
    meta = json.loads((bundle[0] / "cases.json").read_text())
    case = next(c for c in meta["cases"] if c["name"] == "prm_lite_lata")
    render = subprocess.run(
        [str(LONGHAUL), "render", "specs/prm_lite_lata.yaml", "--backend", "verl"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout  # fmt: skip
    s = case["settings"]
    for line in (
        f"actor_rollout_ref.model.path='{s['model_id']}'",
        f"actor_rollout_ref.model.lora_rank={s['lora_rank']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s['micro_batch']}",
        f"actor_rollout_ref.actor.strategy={s['strategy']}",
        f"trainer.n_gpus_per_node={s['world']}",
    ):
        assert line in render.splitlines()
    # the plan's header states the same actor the check builds
    assert f"micro-batch {s['micro_batch']} × {s['seq_len']:,} tokens" in case["plan"]["header"]["actor"]
    assert f"FSDP over {s['world']} rank(s)" in case["plan"]["header"]["actor"]
    # veRL's defaults for what longhaul does not render (fsdp_config.model_dtype, mixed precision)
    assert (s["model_dtype"], s["param_dtype"], s["reduce_dtype"]) == ("fp32", "bf16", "fp32")


def test_dry_run_prints_each_spec_beside_its_plan(dry, plans: dict[str, dict], gpu_specs: list[str]) -> None:
    stdout, result, leaked, seconds = dry
    print(f"dry run: {seconds:.1f} s")
    assert leaked == [], f"the check imported {leaked}"
    blocks = {b.split(":", 1)[0]: b for b in stdout.split("\n\n") if b and not b.startswith("==")}
    by_name = {c["name"]: c for c in result["cases"]}
    for name in gpu_specs:
        phases = {p["name"]: p for p in plans[name]["phases"]}
        block = blocks[name]
        rows = {r["label"]: r for r in by_name[name]["rows"]}
        training = [r for r in phases["training"]["rows"] if r["counted"]]
        static = sum(max(r["bytes"]) for r in training if r["label"].startswith(("actor parameters", "actor grad",
                                                                                   "actor AdamW")))  # fmt: skip
        expected = {
            "training: phase total, busiest GPU": _busiest(phases["training"]),
            "sync: phase total, busiest GPU": _busiest(phases["sync"]),
            "training: actor params + grads + AdamW states": static,
        }
        for label, plan_bytes in expected.items():
            assert rows[label]["plan"] == plan_bytes, (name, label)
            line = next(ln for ln in block.splitlines() if ln.strip().startswith(label))
            assert f"{plan_bytes / GiB:.2f}" in line and "skipped: needs CUDA" in line, line
        assert all(r["measured"] is None for r in rows.values())
        # the published shape with the spec's LoRA, counted on the meta device, is the planner's model
        assert by_name[name]["result"]["shape"]["ok"] is True
        assert ": match" in next(ln for ln in block.splitlines() if "parameters built" in ln)
        assert "fused log-prob wiring" in block and "verdict: dry run, nothing measured" in block
    assert "per-process context: skipped: needs CUDA" in stdout


def test_unfused_logits_row_is_the_plan_of_the_spec_without_fused_kernels(dry, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "specs" / "prm_lite_lata.yaml").read_text())
    doc["spec"]["policy"]["use_fused_kernels"] = False
    variant = tmp_path / "unfused.yaml"
    variant.write_text(yaml.safe_dump(doc))
    training = next(p for p in _plan(variant)["phases"] if p["name"] == "training")
    logits = next(r for r in training["rows"] if r["label"].startswith("logits"))
    rows = {r["label"]: r for r in next(c for c in dry[1]["cases"] if c["name"] == "prm_lite_lata")["rows"]}
    assert rows["training: log-prob logits, unfused (use_fused_kernels=false)"]["plan"] == max(logits["bytes"]) > 0


def test_dry_run_ran_every_cpu_stage(dry, bundle: tuple[Path, str]) -> None:
    _stdout, result, _leaked, _seconds = dry
    meta = json.loads((bundle[0] / "cases.json").read_text())
    for case in result["cases"]:
        r = case["result"]
        settings = next(c for c in meta["cases"] if c["name"] == case["name"])["settings"]
        world, trainable = settings["world"], _TINY_TRAINABLE
        # LoRA on every linear of the tiny actor: 7 projections x 2 layers, an A and a B each
        assert r["sync"]["tensors"] == 2 * 7 * 2
        assert r["sync"]["exported_bytes"] == 4 * trainable  # the full fp32 adapters reached the host
        # AdamW's two fp32 states of this rank's shard of the adapters (FSDP2 over `world` fake ranks)
        assert r["training"]["optimizer_states"] == 2 * 4 * trainable // world
        assert r["logits"]["fused"]["tokens_run"] == settings["micro_batch"] * 320
    assert all(c["result"]["shape"]["ok"] for c in result["cases"])  # the 0.5B-3B sweep shapes too
    # the untied 7B/8B families meet the DTensor lm_head in veRL's wrapping alone; with longhaul's fix (lm_head in
    # the root unit) the wiring runs and training is measured that way; the tied sweep shapes never meet it
    wiring = {c["name"]: c["result"]["wiring"] for c in result["cases"]}
    for name in ("prm_lite_lata", "qwen3_8b"):
        assert wiring[name]["ok"] is True and wiring[name]["head_in_root"] is True, wiring[name]
        assert wiring[name]["verl_alone"]["ok"] is False
        assert "mixed torch.Tensor and DTensor" in wiring[name]["verl_alone"]["message"]
        training = next(c for c in result["cases"] if c["name"] == name)["result"]["training"]
        assert training["lm_head_in_root_unit"] is True
    assert wiring["prm_lite_lata@qwen2.5-0.5b"]["ok"] is True
    assert wiring["prm_lite_lata@qwen2.5-0.5b"]["verl_alone"]["ok"] is True


def _edited_bundle(bundle: Path, tmp_path: Path, edits: dict[str, dict]) -> Path:
    """A copy of the bundle with the settings of some cases changed ({case: {setting: value}})."""
    copy = tmp_path / "bundle"
    copy.mkdir()
    for f in bundle.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    meta = json.loads((copy / "cases.json").read_text())
    for case, settings in edits.items():
        next(c for c in meta["cases"] if c["name"] == case)["settings"].update(settings)
    (copy / "cases.json").write_text(json.dumps(meta))
    return copy


@pytest.fixture(scope="module")
def edited_dry(bundle: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory):
    """`check.py --dry` on a bundle with two cases edited — `lata` with LoRA off, `qwen3_8b` with veRL's kernel
    given chunks of 0 rows —, both run by ONE isolated check (each one imports torch and transformers, ~10 s of
    CPU); its process, leaked imports and each case's result by name."""
    cwd = tmp_path_factory.mktemp("gpu-host-edited")
    copy = _edited_bundle(bundle[0], cwd, {"lata": {"lora_rank": 0}, "qwen3_8b": {"fused_chunk_size": 0}})
    proc, leaked, _ = _run_isolated(copy, cwd, "--dry", "--only", "lata", "qwen3_8b", "--out", "edited.json")
    assert (cwd / "edited.json").exists(), proc.stderr[-3000:]
    cases = json.loads((cwd / "edited.json").read_text())["cases"]
    return proc, leaked, {c["name"]: c["result"] for c in cases}


def test_dry_run_full_weights_export(edited_dry) -> None:
    """A case with LoRA off takes the full-weights export: every state-dict tensor, gathered in fp32."""
    proc, leaked, results = edited_dry
    # The run's only failure is the other edited case's (the next test): this case ran without one.
    assert proc.stdout.rstrip().endswith("; failures in: qwen3_8b"), proc.stderr[-3000:]
    assert leaked == []
    r = results["lata"]
    assert r["sync"]["exported_bytes"] == 4 * _TINY_UNTIED_PARAMS
    blocks = {b.split(":", 1)[0]: b for b in proc.stdout.split("\n\n")}
    assert "full weights" in blocks["lata"]


def test_a_failing_stage_is_reported_and_the_others_still_run(edited_dry) -> None:
    """One GPU run must bring back every figure it can: a stage that raises (here veRL's kernel, given chunks of
    0 rows) is recorded in its place, the next stages run, and the exit status is 1."""
    proc, _leaked, results = edited_dry
    assert proc.returncode == 1, proc.stderr[-3000:]
    r = results["qwen3_8b"]
    assert "error" in r["training"] and "error" in r["logits"]
    assert r["sync"]["tensors"] == 2 * 7 * 2  # the stage before still ran
    assert "training stage failed: ValueError" in proc.stdout and "failures in: qwen3_8b" in proc.stdout


def test_prepare_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    proc = subprocess.run([sys.executable, str(PREPARE), "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "is not a gpu-check bundle" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def _report_module():
    spec = importlib.util.spec_from_file_location(
        "gpu_check_report", ROOT / "scripts" / "gpu_check" / "check_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("reserved_gib", "expected"),
    [
        (40.0, "training: fits (6.40 GiB headroom); plan within 5 %"),
        (45.0, "training: fits (1.40 GiB headroom); plan underestimates by 8.01 GiB"),
        (50.0, "training: does not fit (over by 3.60 GiB); plan underestimates by 13.01 GiB"),
        (20.0, "training: fits (26.40 GiB headroom); plan overestimates by 16.99 GiB"),
    ],
)
def test_verdict_from_measured_figures(bundle: tuple[Path, str], reserved_gib: float, expected: str) -> None:
    """A phase's measured total is the plan's other tenants (the simulator's 32 GiB, the sleeping engine's 1 GiB)
    plus the measured context and the trainer's peak reservation, against the spec's 80 GiB."""
    report = _report_module()
    case = next(c for c in json.loads((bundle[0] / "cases.json").read_text())["cases"] if c["name"] == "prm_lite_lata")
    result = {
        "training": {"static": 15 * GiB, "grads": GiB // 10, "fwd_bwd_peak_extra": 20 * GiB,
                     "peak_reserved": int(reserved_gib * GiB)},
        "wiring": {"ok": True, "message": None, "head_in_root": True,
                   "verl_alone": {"ok": False, "message": "RuntimeError: aten.mm.default got mixed torch.Tensor "
                                                          "and DTensor"}},
        "shape": {"params": 7.66e9, "trainable": 40.4e6, "plan_total": 7.66e9, "plan_trainable": 40.4e6, "ok": True},
    }  # fmt: skip
    context = {"cuda": GiB // 2, "cublas": GiB // 2, "nccl": int(0.6 * GiB)}
    rows = report.build_rows(case, result, context)
    total = next(r for r in rows if r["label"] == "training: phase total, busiest GPU")
    assert total["measured"] == 33 * GiB + int(0.6 * GiB) + int(reserved_gib * GiB)
    line = report.verdict(case, result, rows)
    assert line.startswith(expected), line
    assert "sync: not measured" in line and "blocker" not in line
    printed = "\n".join(report.format_case(case, result, rows, dry=False))
    assert f"{total['measured'] / total['plan']:.2f}" in printed and f"verdict: {line}" in printed
    assert "with longhaul's fix (lm_head in the root unit) ok; veRL's wrapping alone FAILS: RuntimeError" in printed
    # a wiring that fails even with the fix is a blocker
    result["wiring"] = {"ok": False, "message": "RuntimeError: x", "head_in_root": True}
    assert "blocker: the fused log-prob wiring fails under FSDP2" in report.verdict(case, result, rows)
