"""longhaul's one-GPU check of the memory plan: the actor's real allocations beside `longhaul plan`'s figures.

Needs only CUDA torch and transformers (no vLLM, veRL, Ray, PEFT, pydantic, longhaul, network). It reads the
bundle that `prepare.py` wrote beside it (cases.json: each shipped GPU spec's plan and rendered actor settings;
verl_torch_functional.py: veRL 0.9.1's torch-only fused log-prob kernel, copied from the installed veRL;
longhaul_fused_head.py: longhaul's rule for veRL's FSDP2 wrap selection with that kernel, copied from
pipelines/longhaul/verlcpu/fused_head.py — the file longhaul's veRL plugin applies in every veRL worker).

On a GPU machine, step by step:
  1. In longhaul's checkout (its venv installed):   make gpu-check-bundle OUT=build/gpu-check
     The bundle is a folder of a few hundred KiB (the limit is 64 MiB); prepare prints its size.
  2. Copy the folder over:                          scp -r build/gpu-check GPU_HOST:gpu-check
  3. On the GPU machine, check the toolchain, and that the GPU is otherwise idle (the context stage reads the
     driver's free memory):
         nvidia-smi
         python3 -c "import torch, transformers; print(torch.__version__, torch.cuda.is_available())"
     A self-test there first takes about 20 s:   python3 gpu-check/check.py --dry --out /tmp/dry.json
  4. Run it (2-4 minutes on an H100; --budget-s stops starting new cases after that many seconds):
         python3 gpu-check/check.py --out gpu_check_result.json
  5. Bring back gpu_check_result.json and the printed table; the verdict lines answer "does each shipped spec's
     training and weight-sync phase fit its GPU, and by how much is the plan off".
`--dry` runs every stage a CPU can run (tiny shapes of the same families, the same FSDP2/LoRA/kernel code) in
under 30 s and reports the CUDA-only figures as "skipped: needs CUDA": CI runs it through prepare.

Per case (shipped specs first, then the planner sweep at smaller Qwen2.5 shapes), with the spec's rendered
settings: the actor on the meta device, LoRA, gradient checkpointing, FSDP2 on a fake process group of the spec's
world size (check_model.py), then (check_stages.py) the weight-sync export, two training iterations at the
longest micro-batch, fused vs unfused log-prob logits; once per run, the per-process CUDA/cuBLAS/NCCL context.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The sibling modules, also under `python -I` (isolated mode leaves the script's folder off sys.path); no
# __pycache__ is written into the bundle, which may be read-only or copied back as it was.
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True

import torch  # noqa: E402
from check_model import (  # noqa: E402
    bind_ppo_forward,
    build_actor,
    count_parameters,
    head_in_root,
    init_fake_world,
    lora_shapes_check,
    probe_fused_wiring,
    shard_actor,
)
from check_report import GiB, build_rows, format_case, verdict  # noqa: E402
from check_shapes import published_config, tiny_config  # noqa: E402
from check_stages import stage_context, stage_logits, stage_sync, stage_training  # noqa: E402

FUSED_FILE = "verl_torch_functional.py"
HEAD_RULE_FILE = "longhaul_fused_head.py"
#: --dry: 2 x 320 tokens per micro-batch is two chunks of the fused kernel's 512 rows.
DRY_SEQ = 320
#: The unfused logits are measured at up to this many tokens and scaled (they grow linearly).
UNFUSED_CAP = 8192
#: Settings that change what is measured; cases equal on these share one measurement.
MEASURED_KEYS = (
    "model_id", "lora_rank", "lora_alpha", "target_modules", "world", "strategy", "model_dtype", "param_dtype",
    "reduce_dtype", "reshard_after_forward", "gradient_checkpointing", "use_fused_kernels", "fused_chunk_size",
    "attn_implementation", "use_remove_padding", "micro_batch", "seq_len", "load_format", "lora_merge",
)  # fmt: skip


def load_bundled(bundle: Path, name: str):
    """A module copied into the bundle, under a name of its own (no `verl` or `longhaul` package is imported):
    veRL's fused kernel (FUSED_FILE) and longhaul's lm_head wrap rule (HEAD_RULE_FILE)."""
    spec = importlib.util.spec_from_file_location(f"bundled_{Path(name).stem}", bundle / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def choose_attention(settings: dict, device: torch.device) -> tuple[str, bool, str | None]:
    """(attention implementation, packed rows?, note). flash-attn's varlen path on veRL's packed layout when the
    spec asks for it and flash-attn is installed; otherwise SDPA on (micro, seq) rows, whose flash/efficient
    backends also keep attention memory linear in the sequence."""
    want = settings["attn_implementation"]
    if want == "flash_attention_2" and device.type == "cuda" and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2", bool(settings["use_remove_padding"]), None
    note = None
    if want != "sdpa":
        note = f"the spec asks for {want}; ran sdpa ({'no flash_attn here' if device.type == 'cuda' else 'CPU'})"
    return "sdpa", False, note


def run_case(case: dict, fused, head_rule, device: torch.device, dry: bool) -> dict:
    """Build the case's actor, sharded as a veRL worker shards it with longhaul's lm_head fix (`head_rule`), and
    run the stages; every figure in bytes (None off CUDA)."""
    s = case["settings"]
    cfg = tiny_config(s["model_id"]) if dry else published_config(s["model_id"])
    if cfg is None:
        return {"skipped": f"no published shape for {s['model_id']} in check_shapes.py"}
    if s["strategy"] != "fsdp2":
        return {"skipped": f"strategy {s['strategy']} is not mirrored (FSDP2 only)"}
    attention, packed, note = choose_attention(s, device)
    micro, seq = s["micro_batch"], (DRY_SEQ if dry else s["seq_len"])
    result: dict = {"ran": {"micro": micro, "seq": seq, "attention": attention}, "notes": [n for n in [note] if n]}
    if s["use_fused_kernels"]:
        result["wiring"] = probe_fused_wiring(tiny_config(s["model_id"]), s, fused, device, head_rule)
    model = build_actor(cfg, s, attention)
    bind_ppo_forward(model)
    shard_actor(model, s, device, head_rule)
    if s["use_fused_kernels"] and head_in_root(model) and not getattr(model.config, "tie_word_embeddings", False):
        result["notes"].append("untied lm_head in the root FSDP unit (longhaul's fix for veRL's fused kernel)")
    _stage(result, "sync", stage_sync, model, s, device, dry)
    _stage(result, "training", stage_training, model, fused, s, micro, seq, packed, device)
    del model
    _release(device)
    cap = micro * seq if dry else UNFUSED_CAP
    _stage(result, "logits", stage_logits, fused, cfg["hidden_size"], cfg["vocab_size"], micro * seq, s, device, cap)
    return result


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _stage(result: dict, name: str, fn, *args) -> None:
    """Run one stage; a failure (an OOM included) is recorded in its place and the next stage still runs: one
    GPU run should bring back every figure it can."""
    try:
        result[name] = fn(*args)
    except Exception as exc:  # reported, and the exit status says so
        kind = "out of memory" if "out of memory" in str(exc).lower() else type(exc).__name__
        result[name] = {"error": f"{kind}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        result.setdefault("notes", []).append(f"{name} stage failed: {result[name]['error']}")
        _release(next(a for a in args if isinstance(a, torch.device)))


def shape_check(case: dict, cache: dict) -> dict | None:
    """The published shape with the case's LoRA, counted on the meta device (no memory, also in --dry), beside
    the parameter counts the plan's header states."""
    s = case["settings"]
    cfg = published_config(s["model_id"])
    if cfg is None:
        return None
    key = (s["model_id"], s["lora_rank"], str(s["target_modules"]))
    if key not in cache:
        cache[key] = count_parameters(build_actor(cfg, s, "sdpa"))
    return lora_shapes_check(*cache[key], case.get("plan_shape"))


def main(argv: list[str] | None = None) -> int:
    """Run the check over the bundle's cases, print the table and verdicts, write the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=HERE, help="the folder prepare.py wrote (default: this one)")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes: every stage a CPU can run")
    ap.add_argument("--out", type=Path, default=Path("gpu_check_result.json"), help="the JSON result")
    ap.add_argument("--only", nargs="*", default=None, help="case names to run (default: all)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new case after this many seconds")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    bundle = json.loads((args.bundle / "cases.json").read_text())
    cases = [c for c in bundle["cases"] if args.only is None or c["name"] in args.only]
    if not cases:
        print(f"no case selected; the bundle has: {', '.join(c['name'] for c in bundle['cases'])}", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print("no CUDA device here: run on a GPU machine, or --dry for the CPU self-test", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.dry else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    fused = load_bundled(args.bundle, FUSED_FILE)
    head_rule = load_bundled(args.bundle, HEAD_RULE_FILE)
    import transformers

    report: dict = {"dry": args.dry, "torch": torch.__version__, "transformers": transformers.__version__}
    keys = ("verl_version", "fused_kernel_sha256", "fused_head_sha256", "longhaul_commit")
    report["bundle"] = {k: bundle.get(k) for k in keys}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        report["device"] = {"name": props.name, "total": total, "used_at_start": total - free}
    dev = report.get("device")
    where = f"{dev['name']} ({dev['total'] / GiB:.2f} GiB)" if dev else "cpu (dry run, tiny shapes)"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    kernel = f"veRL's fused kernel from veRL {report['bundle']['verl_version']}"
    print(f"== longhaul one-GPU memory check: {where}; {versions}; {kernel}", flush=True)
    try:
        report["context"] = ctx = stage_context(device)
    except Exception as exc:  # the cases still run; the exit status says so
        report["context"] = ctx = {"error": f"{type(exc).__name__}: {exc}"}
    print(_context_line(ctx) + "\n", flush=True)
    init_fake_world(max(c["settings"]["world"] for c in cases))
    measured: dict = {}
    counted: dict = {}
    report["cases"] = []
    for case in sorted(cases, key=lambda c: not c["shipped"]):
        key = [case["settings"].get(k) for k in MEASURED_KEYS]
        if args.dry:  # the sweep's shapes are one tiny shape in a dry run
            key[0] = tiny_config(key[0])
        key = json.dumps(key)
        if key not in measured:
            if time.monotonic() - t_start > args.budget_s:
                measured[key] = {"skipped": f"time budget ({args.budget_s:.0f} s) spent"}
            else:
                try:
                    measured[key] = run_case(case, fused, head_rule, device, args.dry)
                except Exception as exc:  # the other cases still run; the exit status says so
                    measured[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                    _release(device)
        result = dict(measured[key])  # cases may share a measurement; the plan beside it is each case's own
        try:
            result["shape"] = shape_check(case, counted)
        except Exception as exc:  # a figure of its own; the rest of the case stands
            result["shape"] = {"error": f"{type(exc).__name__}: {exc}"}
        rows = build_rows(case, result, ctx)
        line = None if args.dry or not case["shipped"] else verdict(case, result, rows)
        report["cases"].append({"name": case["name"], "shipped": case["shipped"], "rows": rows, "verdict": line,
                                "result": result})  # fmt: skip
        report["seconds"] = round(time.monotonic() - t_start, 1)
        # written after every case: a run cut short still brings back what it measured
        args.out.write_text(json.dumps(report, indent=1, default=str))
        print("\n".join(format_case(case, result, rows, args.dry)) + "\n", flush=True)
    failed = [c["name"] for c in report["cases"] if _failed(c["result"])] + (["context"] if "error" in ctx else [])
    print(
        f"{report['seconds']} s; result written to {args.out}"
        + (f"; failures in: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def _context_line(ctx: dict) -> str:
    if "skipped" in ctx:
        return f"per-process context: {ctx['skipped']}"
    steps = {"cuda": "CUDA context", "cublas": "with cuBLAS", "nccl": "with a 1-rank NCCL communicator"}
    measured = ", ".join(f"{steps[k]} {v / GiB:.2f} GiB" for k, v in ctx.items() if k in steps)
    return f"per-process context, measured from outside: {measured}" + (f"; {ctx['error']}" if "error" in ctx else "")


def _failed(result: dict) -> bool:
    return "error" in result or any(isinstance(v, dict) and "error" in v for v in result.values())


if __name__ == "__main__":
    sys.exit(main())
