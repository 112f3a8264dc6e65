"""`longhaul tiny build`: make (or reuse) the tiny local policy and user-simulator models."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    tiny = typer.Typer(help="Tiny local models for the CPU smoke run (no model hub needed).", no_args_is_help=True)
    app.add_typer(tiny, name="tiny")

    @tiny.command("build")
    def build(
        out_dir: Annotated[
            Path | None, typer.Option("--out", help="Output directory (holds tiny-policy/ and tiny-user/).")
        ] = None,
        steps: Annotated[
            int | None,
            typer.Option(
                "--steps", min=1, help="Most warm-start steps of the policy (it stops once its criteria hold)."
            ),
        ] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="Seed of initialisation and data order.")] = None,
        check_prompts: Annotated[
            int | None,
            typer.Option(
                "--check-prompts",
                min=0,
                help="Held-out first turns generated to count well-formed tool calls (0 = skip).",
            ),
        ] = None,
        user_steps: Annotated[
            int | None, typer.Option("--user-steps", min=1, help="Warm-start steps of the user simulator.")
        ] = None,
        check_user_tasks: Annotated[
            int | None,
            typer.Option(
                "--check-user-tasks",
                min=0,
                help="Held-out tasks the user simulator's greedy replies are checked on (0 = skip).",
            ),
        ] = None,
        step0_spec: Annotated[
            str | None,
            typer.Option(
                "--step0-spec",
                help="Spec whose step-0 evaluation the policy's warm start must land in the band of, estimated "
                "in-process ('' = no such criterion).",
            ),
        ] = None,
        force: Annotated[bool, typer.Option("--force", help="Rebuild even when the cache key matches.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")] = False,
    ) -> None:
        """Build the tokenizer, chat template and tiny Qwen2 models, warm-start the policy on gold-action
        conversations and the user simulator on scripted conversations, and cache the result (a rerun with the
        same inputs reuses it)."""
        # deferred: the tiny build's HTTP clients and the spec's models (~0.3 s); torch loads in its child process
        from longhaul.tiny.build import DEFAULT_OUT_DIR, TinyBuildConfig, TinyBuildError, ensure_tiny_models

        t0 = time.monotonic()

        def log(msg: str) -> None:
            err.print(f"[{time.monotonic() - t0:6.1f}s] {msg}")

        # Unset options take the recipe's defaults (`TinyBuildConfig`, `DEFAULT_OUT_DIR`): one place for each.
        given = {
            "steps": steps,
            "seed": seed,
            "check_prompts": check_prompts,
            "user_steps": user_steps,
            "check_user_tasks": check_user_tasks,
            "step0_spec": step0_spec,
        }
        config = TinyBuildConfig(**{k: v for k, v in given.items() if v is not None})
        try:
            report = ensure_tiny_models(out_dir or DEFAULT_OUT_DIR, config, force=force, log=log)
        except TinyBuildError as exc:
            err.print(f"error: {exc}")
            raise typer.Exit(1) from None
        if as_json:
            out.print(json.dumps(asdict(report), indent=2))
        else:
            state = "reused" if report.cached else "built"
            out.print(f"{state} {report.policy_dir} and {report.user_dir} (key {report.key})")
