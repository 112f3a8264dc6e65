"""`longhaul sft …`: the SFT warm-start stage (collect, build-dataset, export, run) and `inspect`."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from longhaul import bounded
from longhaul import constants as C
from longhaul.commands import check_run_dir, fail_on_spec_error, plain_console
from longhaul.layout import Paths

err = plain_console(stderr=True)

SpecOpt = Annotated[Path, typer.Option("--spec", help="Experiment YAML.")]
RunDirOpt = Annotated[
    Path, typer.Option("--run-dir", help="Run directory (outputs go to RUN_DIR/sft).", callback=check_run_dir)
]


def _load(spec: Path):
    from longhaul.spec import SpecError, load_spec  # deferred: the spec's pydantic models (~0.2 s)

    try:
        return load_spec(spec)
    except SpecError as exc:
        fail_on_spec_error(exc)


def register(app: typer.Typer) -> None:
    """Add `longhaul sft` and its commands to `app`."""
    sft = typer.Typer(
        help="SFT warm start: teacher trajectories, Render-Twice-Diff datasets, veRL SFT.", no_args_is_help=True
    )
    app.add_typer(sft, name="sft")
    sft.command("collect")(collect)
    sft.command("build-dataset")(build_dataset)
    sft.command("export")(export)
    sft.command("run")(run)
    sft.command("inspect")(inspect)


def collect(
    spec: SpecOpt,
    run_dir: RunDirOpt,
    out: Annotated[Path | None, typer.Option("--out", help="Trajectories JSONL (default RUN_DIR/sft/…).")] = None,
    teacher_url: Annotated[str | None, typer.Option("--teacher-url", help="Teacher base URL (…/v1).")] = None,
    simulator_url: Annotated[str | None, typer.Option("--simulator-url", help="Simulator base URL.")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 8,
) -> None:
    """Best-of-N teacher episodes on the TRAINING tasks; keep graded successes (JSONL + coverage.json)."""
    import asyncio  # deferred: asyncio (~15 ms), which `longhaul --help` does not need

    from longhaul.sft.collect import collect_trajectories  # deferred: the spec's pydantic models (~0.2 s)

    exp = _load(spec)
    if exp.spec.sft is None:
        err.print(f"{spec}: spec.sft is missing; the SFT stage needs a `sft:` section")
        raise typer.Exit(2)
    sim_url = simulator_url or exp.spec.user_simulator.url or os.environ.get(C.ENV_SIMULATOR_BASE_URL)
    t_url = teacher_url or exp.spec.sft.teacher.url or sim_url
    if not sim_url or not t_url:
        err.print(
            "no simulator URL: pass --simulator-url, set spec.user_simulator.url, or run under the "
            f"launcher ({C.ENV_SIMULATOR_BASE_URL})"
        )
        raise typer.Exit(2)
    # With no teacher URL the simulator's server answers for the teacher too (same served model).
    t_model = (
        exp.spec.sft.teacher.model.name
        if (teacher_url or exp.spec.sft.teacher.url)
        else os.environ.get(C.ENV_SIMULATOR_MODEL, exp.spec.user_simulator.model.name)
    )
    target = out or Path(Paths.under(str(run_dir)).sft.trajectories)
    done = {"n": 0}

    def progress(a, outcome: float) -> None:
        done["n"] += 1
        err.print(
            f"  task {a.task_id:>3} attempt {a.attempt:>2} T={a.temperature:.1f} -> "
            f"{'success' if outcome == 1.0 else 'fail'} ({done['n']})"
        )

    report = asyncio.run(
        collect_trajectories(
            exp,
            teacher_url=t_url,
            simulator_url=sim_url,
            out_path=target,
            teacher_model=t_model,
            simulator_model=os.environ.get(C.ENV_SIMULATOR_MODEL),
            concurrency=concurrency,
            on_attempt=progress,
        )
    )
    print(f"{report.successes}/{report.attempts} successful episodes -> {target}; covered_seen: {report.covered}")


def build_dataset(
    trajectories: Annotated[Path, typer.Argument(help="Trajectories JSONL.")],
    spec: SpecOpt,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Model directory (tokenizer + chat template).")],
    out: Annotated[Path, typer.Option("--out", help="Output parquet.")],
) -> None:
    """Render-Twice-Diff rows (labels = assistant turns only) → parquet; drops are counted, never truncated."""
    # deferred: the spec's pydantic models via chat.thinking (~0.2 s)
    from longhaul.chat.thinking import chat_template_kwargs, chat_template_override
    from longhaul.envs.airline.splits import build_split
    from longhaul.sft.dataset import TestTaskInDataError, build_sft_rows, load_trajectories, write_dataset

    exp = _load(spec)
    cfg = exp.spec.sft
    if cfg is None:
        err.print(f"{spec}: spec.sft is missing")
        raise typer.Exit(2)
    from transformers import AutoTokenizer  # deferred: transformers (~1 s), after the spec is found valid

    tok = AutoTokenizer.from_pretrained(tokenizer)
    try:
        rows, dropped, stats = build_sft_rows(
            tok,
            load_trajectories(trajectories),
            max_length=cfg.max_length,
            min_label_tokens=cfg.min_label_tokens,
            test_task_ids=build_split(exp.spec.environment.split).test,
            chat_template=chat_template_override(exp.spec.policy),
            template_kwargs=chat_template_kwargs(exp.spec.policy),
        )
    except (TestTaskInDataError, ValueError) as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(1) from exc
    for rec, d in dropped:
        err.print(f"  dropped task {rec.get('task_id')} attempt {rec.get('attempt')}: {d.reason} ({d.detail})")
    write_dataset(rows, out, stats, tokenizer=tokenizer)
    print(json.dumps(stats.to_dict()))
    if not rows:
        err.print("error: no sample survived; nothing to train on")
        raise typer.Exit(1)


def export(
    checkpoints: Annotated[Path, typer.Option("--checkpoints", help="veRL SFT checkpoint directory.")],
    base_model: Annotated[str, typer.Option("--base-model", help="The model SFT started from.")],
    out: Annotated[Path, typer.Option("--out", help="Output Hugging Face model directory.")],
) -> None:
    """The last SFT checkpoint → a plain Hugging Face model (LoRA merged): the GRPO stage's initial policy."""
    from longhaul.sft.export import export_sft_model  # deferred: the checkpoints package (~15 ms), not for --help

    step = export_sft_model(checkpoints, base_model, out)
    print(f"exported global_step_{step} -> {out}")


def run(spec: SpecOpt, run_dir: RunDirOpt) -> None:
    """Run the whole SFT stage: collect (unless spec.sft.dataset), build-dataset, train (torchrun), export."""
    from longhaul.sft.overrides import render_sft_steps  # deferred: the renderers and spec models (~0.3 s)

    exp = _load(spec)
    try:
        steps = render_sft_steps(exp, dataclasses.replace(Paths.under(str(run_dir)), spec_file=str(spec)))
    except ValueError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    # Each step as the launcher runs a stage (`longhaul.launcher.stages`): its own process group and log,
    # this command's stop and checkpoint signals forwarded to it.
    from longhaul.launcher.stages import run_steps  # deferred: the launcher's stages (~0.3 s)

    rc = run_steps(
        "sft",
        [(s.name, s.argv) for s in steps],
        dict(os.environ),
        run_dir.absolute(),
        sys.stdout,
        lambda msg: err.print(f"[sft] {msg}", markup=False),
    )
    if rc != 0:
        raise typer.Exit(rc)


def inspect(
    dataset: Annotated[Path, typer.Argument(help="Dataset parquet written by build-dataset.")],
    index: Annotated[int, typer.Option("--index", "-i", help="Row to show.")] = 0,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="Tokenizer dir (default: the one recorded at build time).")
    ] = None,
    plain: Annotated[bool, typer.Option("--plain", help="No colours: labelled spans between ⟦ and ⟧.")] = False,
    max_chars: Annotated[
        int, typer.Option("--max-chars", help="Cut the shown prompt to its last N characters (0 = whole).")
    ] = 1500,
) -> None:
    """Show one sample with masked (dim) and trained (green) spans, and dataset statistics."""
    # deferred: the dataset and masking modules (~10 ms); `longhaul --help` loads no command's dependencies
    from longhaul.sft.dataset import read_dataset, read_stats
    from longhaul.sft.inspect import build_dataset_summary, build_segments

    rows = _read_rows(dataset, read_dataset)
    try:
        stats = read_stats(dataset)
    except ValueError as exc:  # bounded.InputError or bad JSON: one line naming the file
        err.print(f"error: {exc}")
        raise typer.Exit(2) from None
    if not isinstance(stats, dict):
        err.print(f"error: {dataset}: its stats file is not a JSON object; build the dataset again")
        raise typer.Exit(2)
    console = Console(highlight=False, soft_wrap=True, markup=False, no_color=plain, force_terminal=not plain and None)
    summary = build_dataset_summary(rows, stats)
    table = Table(title=f"{dataset}", show_header=False)
    for k, v in summary.items():
        table.add_row(k, json.dumps(v) if isinstance(v, dict | list) else str(v))
    console.print(table)
    if not rows:
        return
    if not 0 <= index < len(rows):
        err.print(f"--index {index} out of range: the dataset has {len(rows)} rows (0 … {len(rows) - 1})")
        raise typer.Exit(2)
    tok_dir = tokenizer or stats.get("tokenizer")
    if not tok_dir:
        err.print("no tokenizer recorded in the dataset stats; pass --tokenizer DIR")
        raise typer.Exit(2)
    from transformers import AutoTokenizer  # deferred: transformers (~1 s), once the dataset is found readable

    tok = AutoTokenizer.from_pretrained(tok_dir)
    row = rows[index]
    segments = build_segments(tok, row["input_ids"], row["loss_mask"])
    if max_chars and segments and not segments[0][1]:
        head = segments[0][0]
        if len(head) > max_chars:
            segments[0] = (f"…[{len(head) - max_chars} prompt characters not shown]…" + head[-max_chars:], False)
    text = Text()
    for chunk, trained in segments:
        if plain:
            text.append(f"⟦{chunk}⟧" if trained else chunk)
        else:
            text.append(chunk, style="bold green" if trained else "dim")
    console.print(
        f"row {index}: task {row['task_id']} attempt {row['attempt']}, {row['num_tokens']} tokens, "
        f"{row['num_label_tokens']} trained" + ("" if plain else " (green = trained, dim = masked)")
    )
    console.print(text)


def _read_rows(dataset: Path, read_dataset: Any) -> list[dict[str, Any]]:
    """The rows of a dataset parquet, or exit 2 with one line: not a regular file (a FIFO would block the reader),
    missing, not parquet, or without the columns `build-dataset` writes."""
    from longhaul.sft.dataset import COLUMNS  # deferred: the dataset and masking modules (~10 ms)

    fix = "give a parquet written by `longhaul sft build-dataset`"
    try:
        bounded.open_regular(dataset, bounded.Limits("an SFT dataset parquet", max_bytes=0)).close()
        rows = read_dataset(dataset)
    except bounded.InputError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(2) from None
    except (OSError, ValueError) as exc:  # missing, a directory, not parquet (pyarrow's ArrowInvalid)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        err.print(f"error: {dataset}: cannot read it as a dataset ({first}); {fix}")
        raise typer.Exit(2) from None
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        err.print(f"error: {dataset}: no column {', '.join(missing)}; {fix}")
        raise typer.Exit(2)
    return rows
