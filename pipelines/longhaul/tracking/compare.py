"""`longhaul compare` I/O: read training runs and their evaluation children, write and log the report (built by
`longhaul.analysis.report`) and its figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from longhaul import bounded
from longhaul.analysis import tags as T
from longhaul.analysis.ablation import EvalPoint, RunRecord, build_comparison_note
from longhaul.analysis.figures import build_comparison_figure, build_progression_figure
from longhaul.analysis.report import ComparisonReport, build_comparison_report, comparison_run_name
from longhaul.analysis.study import Arm, SeedEval, Statistics, choose_point, group_arms, seed_of
from longhaul.eval.metrics import TrialRecord
from longhaul.spec import experiment_family, load_spec
from longhaul.tracking.client import TrackingError, client_for, quote_filter
from longhaul.tracking.runs import ensure_experiment, finish_run

TABLE_MD, TABLE_CSV = "ablation.md", "ablation.csv"
STATS_MD, STATS_JSON, DESIGN_JSON = "statistics.md", "statistics.json", "design.json"
COMPARISON_PNG, PROGRESSION_PNG = "comparison.png", "progression.png"


@dataclass(frozen=True)
class ComparisonOutput:
    records: tuple[RunRecord, ...]
    markdown: str
    files: tuple[Path, ...]
    run_id: str | None
    statistics: Statistics | None = None


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
            records.append(
                RunRecord(
                    experiment=name,
                    run_id=tr.info.run_id,
                    run_name=tr.info.run_name,
                    tags=dict(tr.data.tags),
                    points=tuple(sorted(by_parent.get(tr.info.run_id, []), key=lambda p: p.step)),
                )
            )
    return records


def fetch_trials(client: MlflowClient, eval_run_id: str, scratch: Path) -> tuple[TrialRecord, ...] | None:
    """The per-trial records of one evaluation run (its `eval/*.jsonl` artefact), read with the results bounds;
    None when the evaluation logged no results file (only its summary)."""
    found = [a.path for a in client.list_artifacts(eval_run_id, T.EVAL_ARTIFACT_DIR) if a.path.endswith(".jsonl")]
    if not found:
        return None
    if len(found) != 1:
        raise TrackingError(
            f"evaluation run {eval_run_id}: expected one results JSONL under "
            f"{T.EVAL_ARTIFACT_DIR}/, found {found or 'none'}"
        )
    local = client.download_artifacts(eval_run_id, found[0], str(scratch / eval_run_id))
    return tuple(TrialRecord.from_dict(d) for d in bounded.read_json_records(local, bounded.RESULTS))


def fetch_arms(client: MlflowClient, records: Sequence[RunRecord], scratch: Path) -> tuple[list[Arm], list[str]]:
    """Arms (seed groups, or single runs) with each seed's trial records at its chosen checkpoint, and what was
    left out (an evaluation without a per-trial results file has no outcomes to pool)."""
    arms, left_out = [], []
    for key, runs in group_arms(records):
        seeds = []
        for index, r in enumerate(runs):
            chosen = choose_point(r)
            if chosen is None or not chosen[0].run_id:
                continue
            point, how = chosen
            trials = fetch_trials(client, point.run_id, scratch)
            if trials is None:
                left_out.append(
                    f"{r.run_name} step {point.step}: left out — its evaluation run {point.run_id} "
                    f"logged no per-trial results ({T.EVAL_ARTIFACT_DIR}/*.jsonl)"
                )
                continue
            seeds.append(SeedEval(seed_of(r, index), r.run_name, point.step, how, trials))
        if seeds:
            arms.append(Arm(key, runs[0].label, runs[0].method, tuple(seeds)))
    return arms, left_out


def fetch_null_floor() -> dict[str, float] | None:
    """Per-task outcome of the do-nothing agent on the airline tasks (None without the τ² data package)."""
    try:
        # deferred: the τ² data package is optional (no floor without it)
        from longhaul.envs.airline.env import null_agent_outcomes
    except ImportError:
        return None
    return null_agent_outcomes()


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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arms, left_out = fetch_arms(client, records, out / ".results")
    report = build_comparison_report(records, arms, fetch_null_floor(), problems=left_out)
    files = _write_report(out, records, report)
    run_id = _log_comparison(client, records, report, files) if log else None
    return ComparisonOutput(tuple(records), report.markdown, files, run_id, report.statistics)


def _write_report(out: Path, records: Sequence[RunRecord], report: ComparisonReport) -> tuple[Path, ...]:
    """The report's files in `out`: the table, the figures, the statistics (and the design, when there is one)."""
    files = (
        out / TABLE_MD,
        out / TABLE_CSV,
        out / COMPARISON_PNG,
        out / PROGRESSION_PNG,
        out / STATS_MD,
        out / STATS_JSON,
    )
    files[0].write_text(report.table, encoding="utf-8")
    files[1].write_text(report.csv, encoding="utf-8")
    build_comparison_figure(records).savefig(files[2])
    build_progression_figure(records).savefig(files[3])
    files[4].write_text(report.statistics_md.lstrip("\n"), encoding="utf-8")
    files[5].write_text(report.statistics.to_json(), encoding="utf-8")
    if report.statistics.design is not None:
        files = (*files, out / DESIGN_JSON)
        files[-1].write_text(report.statistics.design.to_json(), encoding="utf-8")
    return files


def _log_comparison(
    client: MlflowClient, records: Sequence[RunRecord], report: ComparisonReport, files: Sequence[Path]
) -> str:
    """The comparison run of these records (found by name, else created), its note and artefacts; its id."""
    ids = sorted(r.run_id for r in records)
    eid = ensure_experiment(client, T.COMPARISON_EXPERIMENT)
    name = comparison_run_name(ids)
    existing = client.search_runs([eid], f"attributes.run_name = {quote_filter(name)}", max_results=1)
    if existing:
        run_id = existing[0].info.run_id
    else:
        run_id = client.create_run(
            eid,
            run_name=name,
            tags={
                T.KIND: T.KIND_COMPARE,
                T.COMPARED_RUNS: ",".join(ids)[:5000],
            },
        ).info.run_id
    # The description MLflow's UI shows on the run page: the table readable without downloading artefacts.
    # Set on every comparison, so re-evaluated checkpoints replace an older table in the same run.
    client.set_tag(
        run_id,
        T.NOTE,
        build_comparison_note(
            sorted({r.run_name for r in records}), report.table, report.statistics_md, files=[f.name for f in files]
        ),
    )
    for f in files:
        client.log_artifact(run_id, str(f))
    finish_run(client, run_id)
    return run_id
