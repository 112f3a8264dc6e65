"""A memory plan as text (pure): the one-line summary and the aligned per-phase tables of `longhaul plan`."""

from __future__ import annotations

from longhaul.memory.plan_values import MemoryPlan, Phase, gib, verdict


def summarize_memory_plan(plan: MemoryPlan) -> str:
    """One line for `longhaul status` and the Experiment status: per phase the fullest column's total against
    its capacity and the verdict, e.g. `rollout 72.75/80.00 GiB fits · training 77.1/80.00 GiB tight`."""
    parts = []
    for p in plan.phases:
        if not p.applies:
            continue
        total = max(p.totals(), default=0)
        parts.append(f"{p.name} {gib(total)}/{gib(p.capacity)} GiB {verdict(total, p.capacity)}")
    overall = "DOES NOT FIT" if plan.blocking else "fits"
    return f"{overall}: " + " · ".join(parts)


def render_memory_plan(plan: MemoryPlan) -> str:
    """The plan as aligned text (columns of identical GPUs are merged)."""
    lines = [plan.title]
    width = max(len(k) for k, _ in (*plan.header, *plan.engines)) if plan.header else 10
    lines += [f"{k.ljust(width)}  {v}" for k, v in plan.header]
    if plan.engines:
        lines.append("")
        lines.append("vLLM engines (per GPU, GiB)")
        lines += [f"  {k.ljust(width)}  {v}" for k, v in plan.engines]
    for p in plan.phases:
        lines.append("")
        if not p.applies:
            lines.append(f"{p.title}: does not apply ({p.reason})")
            continue
        lines += _phase_table(p)
    for i in plan.issues:
        lines.append(("DOES NOT FIT " if i.blocking else "warning ") + i.render())
    return "\n".join(lines) + "\n"


def _phase_table(p: Phase) -> list[str]:
    groups: list[tuple[str, int]] = []  # (label, first column index) of runs of identical columns
    signature = [tuple(r.values[i] for r in p.rows) for i in range(len(p.columns))]
    start = 0
    for i in range(1, len(p.columns) + 1):
        if i == len(p.columns) or signature[i] != signature[start]:
            if p.columns[start] == "host":
                label = "host"
            else:
                label = p.columns[start] if i - 1 == start else f"GPUs {start}-{i - 1}"
            groups.append((label, start))
            start = i
    label_width = max([len(r.label) for r in p.rows] + [len(p.title), 14]) + 2
    col = max(10, *(len(g) + 2 for g, _ in groups))
    out = [p.title.ljust(label_width) + "".join(g.rjust(col) for g, _ in groups)]
    for r in p.rows:
        out.append(("  " + r.label).ljust(label_width) + "".join(gib(r.values[i]).rjust(col) for _, i in groups))
    totals = p.totals()
    out.append("  total".ljust(label_width) + "".join(gib(totals[i]).rjust(col) for _, i in groups))
    out.append(
        ("  capacity" + (" (resources.memory)" if p.columns == ("host",) else "")).ljust(label_width)
        + "".join(gib(p.capacity).rjust(col) for _ in groups)
    )
    out.append("  headroom".ljust(label_width) + "".join(gib(p.capacity - totals[i]).rjust(col) for _, i in groups))
    out.append("  verdict".ljust(label_width) + "".join(verdict(totals[i], p.capacity).rjust(col) for _, i in groups))
    if p.host is not None:
        out.append(
            f"  host RAM of the node in this phase: {gib(p.host)} GiB "
            "(offloaded shards, sleeping weights, reference, weights gathered for the sync)"
        )
    out += [f"  note: {n}" for n in p.notes]
    return out
