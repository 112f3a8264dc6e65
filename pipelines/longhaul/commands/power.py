"""`longhaul power`: how big a difference a planned (or finished) two-arm study can see.

The arithmetic is `longhaul.eval.stats` (`mde`, `power`, `required_design`); this module parses options, reads
the optional design file through `longhaul.bounded`, and prints.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from longhaul.eval.stats import StudyDesign

err = Console(stderr=True, highlight=False, soft_wrap=True)

_EFFECT = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*(pt|pts|points?|%)?\s*$")

EFFECT_HELP = (
    "Effect of pass^1 to plan for: '6.5', '6.5pt' or '6.5%' are percentage points; a plain number below 1 is "
    "a fraction (0.065 = 6.5 points). Default: the original ablation's headline, +6.5 points (0.175 → 0.240)."
)


def parse_effect(text: str, option: str = "--effect") -> float:
    """'6.5' / '6.5pt' / '6.5%' → 0.065; '0.065' → 0.065 (a plain number below 1 is a fraction)."""
    m = _EFFECT.fullmatch(text)
    if not m:
        raise ValueError(f"{option}: {text!r} is not a number of points ('6.5', '6.5pt') or a fraction ('0.065')")
    value, unit = float(m.group(1)), m.group(2)
    if unit or abs(value) >= 1:
        return value / 100
    return value


def _fail(message: str) -> typer.Exit:
    err.print(f"error: {message}", markup=False)
    return typer.Exit(2)


def load_design(path: Path) -> StudyDesign:
    """A `StudyDesign` JSON file, read with the bounds of `bounded.SMALL_JSON`; errors name the file and field."""
    from longhaul import bounded
    from longhaul.eval.stats import StudyDesign

    try:
        text = bounded.read_text(path, bounded.SMALL_JSON)
    except bounded.InputError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(
            f"{path}:{exc.lineno}: not JSON ({exc.msg}); expected an object like "
            f"{StudyDesign(50, 4, 1, 0.175, 0.16).to_json().replace(chr(10), ' ')}"
        ) from None
    except RecursionError:
        raise _fail(f"{path}: nested too deeply; expected a flat JSON object") from None
    try:
        bounded.check_data(data, str(path), bounded.SMALL_JSON)
        return StudyDesign.from_dict(data)
    except bounded.InputError as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:
        raise _fail(f"{path}: {exc}") from None


def _pts(x: float) -> str:
    return f"{x * 100:.1f}"


def register(app: typer.Typer) -> None:
    @app.command()
    def power(
        tasks: Annotated[int | None, typer.Option("--tasks", help="Tasks both arms run (default 50).")] = None,
        samples: Annotated[
            int | None, typer.Option("--samples", help="Samples (trials) per task per seed (default 4).")
        ] = None,
        seeds: Annotated[int | None, typer.Option("--seeds", help="Training seeds per arm (default 1).")] = None,
        baseline: Annotated[
            float | None, typer.Option("--baseline", help="pass^1 of the baseline arm (default 0.175, the original's).")
        ] = None,
        flip_rate: Annotated[
            float | None,
            typer.Option(
                "--flip-rate",
                help="Probability that two runs of one configuration disagree on one "
                "sample of a task (default 0.16, from τ²-bench issue #540; see longhaul.eval.stats).",
            ),
        ] = None,
        within_flip_rate: Annotated[
            float | None,
            typer.Option(
                "--within-flip-rate",
                help="The same between two samples of one seed (default: equal "
                "to --flip-rate, i.e. seeds add no task-specific variance).",
            ),
        ] = None,
        effect: Annotated[str, typer.Option("--effect", help=EFFECT_HELP)] = "6.5",
        effect_sd: Annotated[
            str,
            typer.Option(
                "--effect-sd",
                help="Spread (SD) of the effect across tasks, same units as --effect "
                "(default 0: the same effect on every task). Only more tasks reduce this part.",
            ),
        ] = "0",
        alpha: Annotated[
            float | None, typer.Option("--alpha", help="Two-sided significance level (default 0.05).")
        ] = None,
        target: Annotated[float | None, typer.Option("--power", help="Target power (default 0.8).")] = None,
        from_comparison: Annotated[
            Path | None,
            typer.Option(
                "--from-comparison",
                help="JSON file with tasks, samples, seeds, baseline, flip_rate "
                "(and optionally within_flip_rate) — `StudyDesign.to_json()`; options given here win.",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    ) -> None:
        """Minimum detectable effect, power, and the seeds/samples a target effect needs, for a paired
        two-arm comparison of pass^1 (both arms on the same tasks)."""
        from longhaul.eval import stats

        base = load_design(from_comparison) if from_comparison is not None else None

        def pick(given: Any, field: str, default: Any) -> Any:
            if given is not None:
                return given
            return getattr(base, field) if base is not None else default

        t = pick(tasks, "tasks", 50)
        n = pick(samples, "samples", 4)
        s = pick(seeds, "seeds", 1)
        b = pick(baseline, "baseline", stats.DEFAULT_BASELINE)
        f = pick(flip_rate, "flip_rate", stats.DEFAULT_FLIP_RATE)
        fw = (
            within_flip_rate
            if within_flip_rate is not None
            else (base.within_flip_rate if base is not None and flip_rate is None else None)
        )
        a = alpha if alpha is not None else stats.ALPHA
        pw = target if target is not None else stats.POWER
        try:
            delta = parse_effect(effect)
            sd = abs(parse_effect(effect_sd, "--effect-sd"))
            common = dict(within_flip_rate=fw, effect_sd=sd)
            v0 = stats.difference_variance(0.0, t, n, s, b, f, **common)
            m = stats.mde(t, n, s, b, f, a, pw, **common)
            p = stats.power(delta, t, n, s, b, f, a, **common)
            need = stats.required_design(delta, t, n, s, b, f, a, pw, **common)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        z = NormalDist().inv_cdf(1 - a / 2)
        noise_sd = math.sqrt(v0 / t)
        doc = {
            "design": {
                "tasks": t,
                "samples": n,
                "seeds": s,
                "baseline": b,
                "flip_rate": f,
                "within_flip_rate": f if fw is None else fw,
            },
            "alpha": a,
            "target_power": pw,
            "effect_sd": sd,
            "noise_sd": noise_sd,
            "must_differ_by": z * noise_sd,
            "mde": m if math.isfinite(m) else None,
            "effect": delta,
            "power": p,
            "needs": {
                "seeds": need.seeds,
                "samples": need.samples,
                "power_limit": need.power_limit,
                "bounded_by_tasks": need.bounded_by_tasks,
                "text": need.describe(),
            },
        }
        if as_json:
            typer.echo(json.dumps(doc, indent=2))
            return
        fw_shown = f if fw is None else fw
        lines = [
            f"design       {t} tasks × {n} sample{'s' if n != 1 else ''} per task × {s} seed{'s' if s != 1 else ''} "
            "per arm, paired (both arms on the same tasks)",
            f"assumed      baseline pass^1 {b:.3f}; flip rate {f:.3f} between runs, {fw_shown:.3f} within a seed; "
            + ("the same effect on every task" if sd == 0 else f"effect SD across tasks {_pts(sd)} points"),
            f"noise        SD of the difference {_pts(noise_sd)} points: the arms must differ by "
            f"{_pts(z * noise_sd)} points to be told apart (two-sided α = {a:g})",
            f"MDE          {'not reachable' if not math.isfinite(m) else _pts(m) + ' points'} at {pw:.0%} power",
            f"power        {p:.0%} for {delta * 100:+.1f} points",
            f"needs        {need.describe()}",
        ]
        typer.echo("\n".join(lines))
