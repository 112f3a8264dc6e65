"""Measured figures beside the plan's (`longhaul plan --json`, carried in the bundle), and a verdict per spec.

Standard library only. A phase's measured total is the plan's rows this check cannot measure (the simulator's
and the rollout engine's vLLM pools, taken as planned) plus the measured trainer process: its context and the
allocator's peak reservation during the stage. The weight sync has two steps (gather the adapters, then send
them through the bucket); the plan lists its peak step's rows and names the other in a note, so the measured
total takes the trainer's larger step beside the plan's peak step's other tenants.
"""

from __future__ import annotations

GiB = 1 << 30
#: Beyond this share of the plan's phase total, the verdict says the plan under- or overestimates.
TOLERANCE = 0.05


def _plan(figures: dict, phase: str, *keys: str) -> int | None:
    rows = figures.get(phase, {}).get("rows", [])
    picked = [r["bytes"] for r in rows if r["key"] in keys]
    return sum(picked) if picked else None


def _held(figures: dict, phase: str) -> int:
    return sum(r["bytes"] for r in figures.get(phase, {}).get("rows", []) if r["key"] == "held")


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _add(*xs: int | None) -> int | None:
    return None if any(x is None for x in xs) else sum(xs)


def context_bytes(context: dict) -> int | None:
    """The measured per-process figure: CUDA context + cuBLAS + one-rank NCCL (None when not measured)."""
    return context.get("nccl")


def build_rows(case: dict, result: dict, context: dict) -> list[dict]:
    """The comparison rows of one case: label, plan bytes, measured bytes (None where not measured)."""
    fig = case["figures"]
    train = result.get("training", {})
    sync = result.get("sync", {})
    logits = result.get("logits", {})
    ctx = context_bytes(context)
    rows = []
    if "training" in fig:
        grads = train.get("grads")
        rows += [
            (
                "training: actor params + grads + AdamW states",
                _plan(fig, "training", "params", "gradients", "optimizer"),
                _add(train.get("static"), grads),
            ),
            (
                "training: step peak above them (all-gather, activations, logits)",
                _plan(fig, "training", "gather", "activations", "logits", "reference"),
                _sub(train.get("fwd_bwd_peak_extra"), grads),
            ),
            (
                "training: log-prob logits, fused kernel",
                _plan(fig, "training", "logits"),
                (logits.get("fused") or {}).get("at_tokens"),
            ),
            (
                "training: log-prob logits, unfused (use_fused_kernels=false)",
                fig.get("unfused_logits"),
                (logits.get("unfused") or {}).get("at_tokens"),
            ),
            ("training: trainer process context (CUDA, cuBLAS, NCCL)", _plan(fig, "training", "context"), ctx),
            (
                "training: phase total, busiest GPU",
                fig["training"]["total"],
                _add(_held(fig, "training"), ctx, train.get("peak_reserved")),
            ),
        ]
    if "sync" in fig:
        steps = [sync.get("gather_reserved"), sync.get("send_reserved")]
        trainer_peak = max((x for x in steps if x is not None), default=None)
        rows += [
            ("sync: actor shards on the GPU for the export", _plan(fig, "sync", "params"), sync.get("shards_on_gpu")),
            ("sync: export peak above the shards", _plan(fig, "sync", "in_flight"), sync.get("export_peak_extra")),
            ("sync: sender's bucket step", _plan(fig, "sync", "bucket"), sync.get("bucket_peak_extra")),
            ("sync: trainer process context (CUDA, cuBLAS, NCCL)", _plan(fig, "sync", "context"), ctx),
            ("sync: phase total, busiest GPU", fig["sync"]["total"], _add(_held(fig, "sync"), ctx, trainer_peak)),
        ]
    return [{"label": label, "plan": plan, "measured": measured} for label, plan, measured in rows]


def _phase_verdict(phase: str, case: dict, rows: list[dict]) -> str | None:
    total = next((r for r in rows if r["label"] == f"{phase}: phase total, busiest GPU"), None)
    if total is None:
        return None
    capacity = case["figures"][phase]["capacity"]
    if total["measured"] is None:
        return f"{phase}: not measured"
    room = capacity - total["measured"]
    fit = f"fits ({room / GiB:.2f} GiB headroom)" if room >= 0 else f"does not fit (over by {-room / GiB:.2f} GiB)"
    diff = total["measured"] - total["plan"]
    if diff > TOLERANCE * total["plan"]:
        cmp = f"plan underestimates by {diff / GiB:.2f} GiB"
    elif diff < -TOLERANCE * total["plan"]:
        cmp = f"plan overestimates by {-diff / GiB:.2f} GiB"
    else:
        cmp = "plan within 5 %"
    return f"{phase}: {fit}; {cmp}"


def verdict(case: dict, result: dict, rows: list[dict]) -> str:
    """One line per spec: does each planned phase fit the spec's GPU, and how far off is the plan."""
    if result.get("skipped") or result.get("error"):
        return f"not measured ({result.get('skipped') or result.get('error')})"
    parts = [v for v in (_phase_verdict(p, case, rows) for p in ("training", "sync")) if v]
    wiring = result.get("wiring") or {}
    if wiring.get("ok") is False:
        parts.append("blocker: the fused log-prob wiring fails under FSDP2, longhaul's lm_head fix included")
    shape = result.get("shape") or {}
    if "params" in shape and not shape.get("ok", True):
        parts.append("shape differs from the plan's parameter counts")
    return "; ".join(parts) if parts else "nothing measured"


def _count(n: float | None) -> str:
    if not n:
        return "-"
    return next(f"{n / d:.3g} {u}" for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if n >= d or d == 1)


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _wiring_state(wiring: dict) -> str:
    """The wiring probe in words: as a veRL worker runs it with longhaul's fix, and with veRL's wrapping alone."""

    def state(w: dict) -> str:
        return "ok" if w["ok"] else f"FAILS: {w['message']}"

    fixed = f"with longhaul's fix{' (lm_head in the root unit)' if wiring.get('head_in_root') else ''} {state(wiring)}"
    alone = wiring.get("verl_alone")
    return fixed if alone is None else f"{fixed}; veRL's wrapping alone {state(alone)}"


def format_case(case: dict, result: dict, rows: list[dict], dry: bool) -> list[str]:
    """The printed block of one case: settings, shape check, wiring probe, the rows, the verdict."""
    s = case["settings"]
    head = (
        f"{case['name']}{'' if case['shipped'] else ' (sweep)'}: {s['model_id']}, "
        f"{'LoRA ' + str(s['lora_rank']) if s['lora_rank'] else 'full weights'}, {s['strategy']} x{s['world']}, "
        f"{s['model_dtype']} params / {s['param_dtype']} compute, checkpointing "
        f"{'on' if s['gradient_checkpointing'] else 'off'}, micro-batch {s['micro_batch']} x {s['seq_len']}"
    )
    out = [head]
    if result.get("skipped") or result.get("error"):
        out.append(f"  not measured: {result.get('skipped') or result.get('error')}")
    ran = result.get("ran") or {}
    if ran:
        out.append(
            f"  ran: micro-batch {ran['micro']} x {ran['seq']} tokens, attention {ran['attention']}"
            + (" (tiny shape)" if dry else "")
        )
    shape = result.get("shape") or {}
    if "error" in shape:
        out.append(f"  parameters: not counted ({shape['error']})")
    elif shape:
        out.append(
            f"  parameters built {_count(shape['params'])} (plan {_count(shape.get('plan_total'))}), "
            f"trainable {_count(shape['trainable'])} (plan {_count(shape.get('plan_trainable'))})"
            + f": {'match' if shape.get('ok') else 'MISMATCH'}"
        )
    wiring = result.get("wiring") or {}
    if wiring:
        out.append(f"  fused log-prob wiring (lm_head.weight under FSDP2): {_wiring_state(wiring)}")
    out.append(f"  {'figure':<66} {'plan GiB':>9} {'measured GiB':>13} {'ratio':>6}")
    for r in rows:
        if r["measured"] is None:
            meas, ratio = ("skipped: needs CUDA" if dry else "-"), "-"
        else:
            meas = _gib(r["measured"])
            ratio = f"{r['measured'] / r['plan']:.2f}" if r["plan"] else "n/a"
        out.append(f"  {r['label']:<66} {_gib(r['plan']):>9} {meas:>13} {ratio:>6}")
    for note in result.get("notes", []):
        out.append(f"  note: {note}")
    if case["shipped"]:
        out.append(f"  verdict: {'dry run, nothing measured' if dry else verdict(case, result, rows)}")
    return out
