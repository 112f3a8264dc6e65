"""`longhaul power`: how big a difference a planned (or finished) two-arm study's verdict can see.

The arithmetic is `longhaul.eval.stats` (`mde`, `power`, `required_design` for the rule of `longhaul compare`'s
verdict); this module parses options, reads the optional design file through `longhaul.bounded`, and prints.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from longhaul import bounded

if TYPE_CHECKING:
    from longhaul.eval.stats import StudyDesign

err = Console(stderr=True, highlight=False, soft_wrap=True)

_EFFECT = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*(pt|pts|points?|%)?\s*$")

EFFECT_HELP = (
    "Effect of pass^1 to plan for: '6.5', '6.5pt' or '6.5%' are percentage points; a plain number below 1 is "
    "a fraction (0.065 = 6.5 points). Default: the original ablation's headline, +6.5 points (0.175 → 0.240)."
)
SEED_SD_HELP = (
    "SD of a whole training seed's shift of pass^1 (every task of a run up or down together), points or a fraction "
    "like --effect. Default: the file's measured value, else 2.4 points (an assumed modest seed effect; "
    "longhaul.eval.stats.defaults says why)."
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
    from longhaul.eval.stats import StudyDesign  # deferred: scipy and numpy via eval.stats (~0.3 s)

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
            f"{StudyDesign(50, 4, 3, 0.175, 0.16).to_json().replace(chr(10), ' ')}"
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


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _report(design: StudyDesign, doc: dict[str, Any], seed_sd_source: str) -> str:
    """The human-readable form of `doc` (the --json document)."""
    d, t, n, s = doc["design"], design.tasks, design.samples, design.seeds
    m = design.comparisons
    level = f"α = {doc['alpha']:g}" if m == 1 else f"α/{m} = {doc['alpha_per_comparison']:.3g} (Holm over {m})"
    if s < 2:
        rule = "one seed per arm: no verdict — a single seed cannot tell a better method from a luckier training run"
        mde = "none with one seed per arm"
    else:
        rule = (
            f"'better' when the t-test over tasks and seeds (seed variance measured from the seeds, {2 * (s - 1)} "
            f"df) and the exact sign-flip test over tasks both give p < {level}"
        )
        mde = "not reachable" if doc["mde"] is None else f"{_pts(doc['mde'])} points at {doc['target_power']:.0%} power"
    spread = "the same effect on every task" if doc["effect_sd"] == 0 else f"effect SD {_pts(doc['effect_sd'])} points"
    lines = [
        f"design       {t} tasks × {_plural(n, 'sample')} per task × {_plural(s, 'seed')} per arm, paired (both arms "
        "on the same tasks)",
        f"assumed      baseline pass^1 {d['baseline']:.3f}; flip rate {d['flip_rate']:.3f} between runs, "
        f"{d['within_flip_rate']:.3f} within a seed; seed SD {_pts(d['seed_sd'])} points ({seed_sd_source}); " + spread,
        f"rule         {rule}",
        f"noise        SD of the difference {_pts(doc['noise_sd'])} points (tasks {_pts(doc['noise_sd_tasks'])}, "
        f"whole seeds {_pts(doc['noise_sd_seeds'])})",
        f"MDE          {mde}",
        f"power        {doc['power']:.0%} for {doc['effect'] * 100:+.1f} points",
        f"needs        {doc['needs']['text']}",
    ]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `longhaul power` to the app."""

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
                "sample of a task (default 0.16, from τ²-bench issue #540; see longhaul.eval.stats.defaults).",
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
        seed_sd: Annotated[str | None, typer.Option("--seed-sd", help=SEED_SD_HELP)] = None,
        comparisons: Annotated[
            int | None,
            typer.Option(
                "--comparisons",
                help="Verdicts corrected together (Holm), e.g. 3 for overall, train and test: power is computed "
                "at α/M, the level Holm guarantees each (default: the file's, else 1).",
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
                help="JSON file with tasks, samples, seeds, baseline, flip_rate (and optionally within_flip_rate, "
                "seed_sd, comparisons) — `longhaul compare`'s design.json; options given here win.",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    ) -> None:
        """Minimum detectable effect, power, and the seeds/samples a target effect needs, for the verdict of a
        paired two-arm comparison of pass^1 (both arms on the same tasks) with training-seed noise."""
        base = load_design(from_comparison) if from_comparison is not None else None
        given = dict(tasks=tasks, samples=samples, seeds=seeds, baseline=baseline, flip_rate=flip_rate)
        try:
            sd_given = None if seed_sd is None else abs(parse_effect(seed_sd, "--seed-sd"))
            design = _design(base, given, within_flip_rate, sd_given, comparisons)
            doc = build_power_document(
                design, parse_effect(effect), abs(parse_effect(effect_sd, "--effect-sd")), alpha, target
            )
        except ValueError as exc:
            raise _fail(str(exc)) from None
        if as_json:
            typer.echo(json.dumps(doc, indent=2, allow_nan=False))
            return
        source = "given" if sd_given is not None else "measured" if design.seed_sd is not None else _DEFAULT_SOURCE
        typer.echo(_report(design, doc, source))


_DEFAULT_SOURCE = "default: an assumed modest seed effect"


def _design(
    base: StudyDesign | None,
    given: dict[str, Any],
    within_flip_rate: float | None,
    seed_sd: float | None,
    comparisons: int | None,
) -> StudyDesign:
    """The design to plan for: each option given, else the design file's value, else the default."""
    from longhaul.eval import stats  # deferred: scipy and numpy via eval.stats (~0.3 s)

    defaults = {
        "tasks": 50,
        "samples": 4,
        "seeds": 1,
        "baseline": stats.DEFAULT_BASELINE,
        "flip_rate": stats.DEFAULT_FLIP_RATE,
        "within_flip_rate": None,
        "seed_sd": None,
        "comparisons": 1,
    }
    options = {**given, "within_flip_rate": within_flip_rate, "seed_sd": seed_sd, "comparisons": comparisons}
    values = {
        name: options[name] if options[name] is not None else getattr(base, name) if base else default
        for name, default in defaults.items()
    }
    if within_flip_rate is None and given["flip_rate"] is not None:
        values["within_flip_rate"] = None  # a new between-run flip rate does not keep the file's within-seed one
    return stats.StudyDesign(**values)


def build_power_document(
    design: StudyDesign, effect: float, effect_sd: float, alpha: float | None, target: float | None
) -> dict[str, Any]:
    """The numbers `longhaul power` prints (its --json document); ValueError naming a bad argument."""
    from longhaul.eval import stats  # deferred: scipy and numpy via eval.stats (~0.3 s)

    if design.comparisons < 1:
        raise ValueError(f"--comparisons must be ≥ 1 (got {design.comparisons})")
    a = alpha if alpha is not None else stats.ALPHA
    pw = target if target is not None else stats.POWER
    if not 0 < a < 1:
        raise ValueError(f"--alpha must be in (0, 1) (got {a!r})")
    args = design.planning()
    v_tasks = stats.difference_variance(0.0, **{k: v for k, v in args.items() if k != "seed_sd"}, effect_sd=effect_sd)
    v_tasks /= design.tasks
    v_seeds = 2 * args["seed_sd"] ** 2 / design.seeds
    m = stats.mde(alpha=design.alpha(a), power=pw, effect_sd=effect_sd, **args)
    p = stats.power(effect, alpha=design.alpha(a), effect_sd=effect_sd, **args)
    need = stats.required_design(effect, alpha=design.alpha(a), power=pw, effect_sd=effect_sd, **args)
    return {
        "design": {f: getattr(design, f) for f in ("tasks", "samples", "seeds", "baseline", "flip_rate")}
        | {
            "within_flip_rate": design.flip_rate if design.within_flip_rate is None else design.within_flip_rate,
            "seed_sd": args["seed_sd"],
            "comparisons": design.comparisons,
        },
        "alpha": a,
        "alpha_per_comparison": design.alpha(a),
        "target_power": pw,
        "effect_sd": effect_sd,
        "noise_sd": math.sqrt(v_tasks + v_seeds),
        "noise_sd_tasks": math.sqrt(v_tasks),
        "noise_sd_seeds": math.sqrt(v_seeds),
        "verdict_possible": design.seeds >= 2,
        "mde": stats.finite_or_none(m),
        "effect": effect,
        "power": p,
        "needs": {
            "seeds": need.seeds,
            "samples": need.samples,
            "power_limit": need.power_limit,
            "bounded_by_tasks": need.bounded_by_tasks,
            "text": need.describe(),
        },
    }
