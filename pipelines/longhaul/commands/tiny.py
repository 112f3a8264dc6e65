"""`longhaul tiny build`: make (or reuse) the tiny local policy and user-simulator models."""

from __future__ import annotations

import json
import time
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
            Path, typer.Option("--out", help="Output directory (holds tiny-policy/ and tiny-user/).")
        ] = Path(".cache/longhaul/models"),
        steps: Annotated[int, typer.Option("--steps", min=0, help="Warm-start steps of the policy.")] = 400,
        seed: Annotated[int, typer.Option("--seed", help="Seed of initialisation and data order.")] = 7,
        check_prompts: Annotated[
            int,
            typer.Option(
                "--check-prompts",
                min=0,
                help="Held-out first turns generated to count well-formed tool calls (0 = skip).",
            ),
        ] = 10,
        force: Annotated[bool, typer.Option("--force", help="Rebuild even when the cache key matches.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")] = False,
    ) -> None:
        """Build the tokenizer, chat template and tiny Qwen2 models, warm-start the policy on gold-action
        conversations, and cache the result (a rerun with the same inputs reuses it)."""
        from dataclasses import asdict

        from longhaul.tiny.build import TinyBuildConfig, ensure_tiny_models

        t0 = time.monotonic()

        def log(msg: str) -> None:
            err.print(f"[{time.monotonic() - t0:6.1f}s] {msg}")

        report = ensure_tiny_models(
            out_dir, TinyBuildConfig(steps=steps, seed=seed, check_prompts=check_prompts), force=force, log=log
        )
        if as_json:
            out.print(json.dumps(asdict(report), indent=2))
        else:
            state = "reused" if report.cached else "built"
            out.print(f"{state} {report.policy_dir} and {report.user_dir} (key {report.key})")
