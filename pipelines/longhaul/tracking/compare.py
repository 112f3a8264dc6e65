"""`longhaul compare` I/O: read training runs and their evaluation children, write and log the table/figures."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from longhaul.tracking import tags as T
from longhaul.tracking.ablation import EvalPoint, RunRecord, build_rows, render_csv, render_markdown
from longhaul.tracking.figures import build_comparison_figure, build_progression_figure
from longhaul.tracking.runs import TrackingError, client_for, ensure_experiment, finish_run, quote_filter

TABLE_MD, TABLE_CSV = "ablation.md", "ablation.csv"
COMPARISON_PNG, PROGRESSION_PNG = "comparison.png", "progression.png"


@dataclass(frozen=True)
class ComparisonOutput:
    records: tuple[RunRecord, ...]
    markdown: str
    files: tuple[Path, ...]
    run_id: str | None


def resolve_experiments(client: MlflowClient, names: Sequence[str]) -> list[tuple[str, str]]:
    """`[(experiment name, id)]` for the given names; a spec family `lata` also matches `longhaul/lata`, and a
    spec YAML path matches its family. No names = every experiment holding longhaul training runs."""
    if not names:
        found = []
        for e in client.search_experiments(max_results=1000):
            if e.name == T.COMPARISON_EXPERIMENT:
                continue
            if client.search_runs([e.experiment_id], f"tags.`{T.KIND}` = {quote_filter(T.KIND_TRAIN)}", max_results=1):
                found.append((e.name, e.experiment_id))
        return found
    out, missing = [], []
    for name in names:
        candidates = [name, f"longhaul/{name}"]
        if name.endswith((".yaml", ".yml")) and Path(name).is_file():
            from longhaul.spec import experiment_family, load_spec

            candidates.insert(0, experiment_family(load_spec(name)))
        for c in candidates:
            e = client.get_experiment_by_name(c)
            if e is not None:
                out.append((e.name, e.experiment_id))
                break
        else:
            missing.append(name)
    if missing:
        have = sorted(e.name for e in client.search_experiments(max_results=1000))
        raise TrackingError(
            f"no MLflow experiment named {', '.join(repr(m) for m in missing)} in {client.tracking_uri} "
            f"(also tried 'longhaul/<name>'); experiments there: {', '.join(have) or 'none'}"
        )
    return out


def fetch_records(client: MlflowClient, experiments: Sequence[tuple[str, str]]) -> list[RunRecord]:
    """Every training run in these experiments with the `eval/…` metrics of each evaluated checkpoint."""
    records = []
    for name, eid in experiments:
        trains = client.search_runs([eid], f"tags.`{T.KIND}` = {quote_filter(T.KIND_TRAIN)}", max_results=1000)
        evals = client.search_runs([eid], f"tags.`{T.KIND}` = {quote_filter(T.KIND_EVAL)}", max_results=5000)
        by_parent: dict[str, list[EvalPoint]] = {}
        for ev in evals:
            parent = ev.data.tags.get(T.PARENT_RUN_ID)
            step = ev.data.tags.get(T.CHECKPOINT_STEP, "")
            if parent and step.isdigit():
                metrics = {k: v for k, v in ev.data.metrics.items() if k.startswith("eval/")}
                by_parent.setdefault(parent, []).append(EvalPoint(int(step), metrics, ev.info.run_id))
        for tr in trains:
            records.append(RunRecord(
                experiment=name, run_id=tr.info.run_id, run_name=tr.info.run_name,
                tags=dict(tr.data.tags), points=tuple(sorted(by_parent.get(tr.info.run_id, []), key=lambda p: p.step)),
            ))
    return records


def write_comparison(
    tracking_uri: str | MlflowClient,
    experiments: Sequence[str],
    out_dir: str | Path,
    *,
    log: bool = True,
) -> ComparisonOutput:
    """Write ablation.md/.csv, comparison.png and progression.png to `out_dir` and log them to a run named
    `compare-<8 hex of the compared run ids>` in the experiment `longhaul/comparisons` (same inputs, same run)."""
    client = client_for(tracking_uri)
    records = fetch_records(client, resolve_experiments(client, experiments))
    if not any(r.points for r in records):
        raise TrackingError(
            f"nothing to compare in {client.tracking_uri}: {len(records)} training run(s), none with evaluated "
            "checkpoints (evaluation runs are logged by `longhaul eval` / the eval stage)"
        )
    cols, rows = build_rows(records)
    markdown = render_markdown(cols, rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = (out / TABLE_MD, out / TABLE_CSV, out / COMPARISON_PNG, out / PROGRESSION_PNG)
    files[0].write_text(markdown, encoding="utf-8")
    files[1].write_text(render_csv(cols, rows), encoding="utf-8")
    build_comparison_figure(records).savefig(files[2])
    build_progression_figure(records).savefig(files[3])

    run_id = None
    if log:
        ids = sorted(r.run_id for r in records)
        digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:8]
        eid = ensure_experiment(client, T.COMPARISON_EXPERIMENT)
        name = f"compare-{digest}"
        existing = client.search_runs([eid], f"attributes.run_name = {quote_filter(name)}", max_results=1)
        if existing:
            run_id = existing[0].info.run_id
        else:
            run_id = client.create_run(eid, run_name=name, tags={
                T.KIND: T.KIND_COMPARE,
                T.COMPARED_RUNS: ",".join(ids)[:5000],
                "mlflow.note.content": "Ablation over: " + ", ".join(sorted({r.run_name for r in records})),
            }).info.run_id
        for f in files:
            client.log_artifact(run_id, str(f))
        finish_run(client, run_id)
    return ComparisonOutput(tuple(records), markdown, files, run_id)
