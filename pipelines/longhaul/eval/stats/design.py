"""A study's design as a file: what `longhaul compare` measured and `longhaul power --from-comparison` plans from
(pure). One object feeds both, so compare's MDE and `power`'s on the same file are the same number."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from longhaul.eval.stats import planning
from longhaul.eval.stats.arms import ArmComparison, SeedNoise
from longhaul.eval.stats.defaults import ALPHA, DEFAULT_FLIP_RATE, DEFAULT_SEED_SD, POWER
from longhaul.eval.stats.outcomes import (
    Outcomes,
    cell_values,
    common_tasks,
    flip_rate,
    rate,
    within_seed_flip_rate,
)


@dataclass(frozen=True)
class StudyDesign:
    """The numbers `longhaul power` plans from: the design of an existing comparison (tasks, samples per task,
    seeds per arm), what it measured (baseline pass^1, between-run flip rate, optionally the within-seed flip
    rate and the whole-seed SD) and how many verdicts share the multiplicity correction (`comparisons`). JSON:
    `{"tasks": 50, "samples": 4, "seeds": 3, "baseline": 0.175, "flip_rate": 0.16, "within_flip_rate": 0.15,
    "seed_sd": 0.021, "comparisons": 3}`; the last three may be null/absent (within = between, the default seed
    SD, one comparison)."""

    tasks: int
    samples: int
    seeds: int
    baseline: float
    flip_rate: float
    within_flip_rate: float | None = None
    seed_sd: float | None = None
    comparisons: int = 1

    FIELDS = ("tasks", "samples", "seeds", "baseline", "flip_rate", "within_flip_rate", "seed_sd", "comparisons")
    REQUIRED = FIELDS[:5]

    def to_json(self) -> str:
        """The file `longhaul compare` writes (`design.json`)."""
        return json.dumps({f: getattr(self, f) for f in self.FIELDS}, indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StudyDesign:
        """Validated: raises ValueError naming the field, the value received and what is expected."""
        if not isinstance(d, Mapping):
            raise ValueError(f"expected a JSON object with keys {', '.join(cls.FIELDS)} (got {type(d).__name__})")
        unknown = sorted(set(d) - set(cls.FIELDS))
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}; valid: {', '.join(cls.FIELDS)}")
        missing = [f for f in cls.REQUIRED if f not in d]
        if missing:
            raise ValueError(f"field {missing[0]!r} is missing; required: {', '.join(cls.REQUIRED)}")
        vals: dict[str, Any] = {}
        for f in ("tasks", "samples", "seeds", "comparisons"):
            v = d.get(f, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"field {f!r}: expected a whole number ≥ 1 (got {v!r})")
            vals[f] = v
        for f in ("baseline", "flip_rate", "within_flip_rate", "seed_sd"):
            v = d.get(f)
            if v is None and f not in cls.REQUIRED:
                vals[f] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise ValueError(f"field {f!r}: expected a number in [0, 1] (got {v!r})")
            vals[f] = float(v)
        out = cls(**vals)
        try:
            planning.check_design(**out.planning())
        except ValueError as exc:
            raise ValueError(f"field {str(exc).split(' ', 1)[0]!r}: {exc}") from None
        return out

    def planning(self) -> dict[str, Any]:
        """Keyword arguments of `power`, `mde` and `required_design` for this design (the default seed SD when
        none was measured; the multiplicity stays out: see `alpha`)."""
        return {
            "tasks": self.tasks,
            "samples": self.samples,
            "seeds": self.seeds,
            "baseline": self.baseline,
            "flip_rate": self.flip_rate,
            "within_flip_rate": self.within_flip_rate,
            "seed_sd": DEFAULT_SEED_SD if self.seed_sd is None else self.seed_sd,
        }

    def alpha(self, alpha: float = ALPHA) -> float:
        """The level each verdict of the family is tested at in the worst case: α/M (Holm, `comparisons` = M)."""
        return alpha / self.comparisons

    def mde(self, alpha: float = ALPHA, power: float = POWER, effect_sd: float = 0.0) -> float:
        """The MDE of the verdict's rule for this design (math.inf: none)."""
        return planning.mde(alpha=self.alpha(alpha), power=power, effect_sd=effect_sd, **self.planning())

    @classmethod
    def from_outcomes(cls, o: Outcomes) -> StudyDesign:
        """The design and measured noise of one arm (use the baseline arm): pass^1, the between-seed flip rate
        (the within-seed one when there is one seed), the within-seed flip rate, and the whole-seed SD
        (`SeedNoise`) with ≥ 2 seeds. Kept inside what the planning model allows (`difference_variance`): the
        baseline within [0.01, 0.99], the flip rates at most 2·b·(1−b) (seed-wide shifts or a small arm can
        measure more), the within-seed one at most the between-seed one and the seed SD at most 0.5. ValueError
        when nothing measures a flip rate (one seed, one sample per task)."""
        if len(o.seeds) < 2 and o.samples < 2:
            raise ValueError("one seed with one sample per task measures no flip rate; run ≥ 2 samples or seeds")
        return cls._measured(o, DEFAULT_FLIP_RATE)

    @classmethod
    def for_comparison(cls, a: Outcomes, b: Outcomes, result: ArmComparison, comparisons: int = 1) -> StudyDesign:
        """The design of one comparison (B against the baseline arm A, on their common tasks): A's measured noise
        (`from_outcomes`; `DEFAULT_FLIP_RATE` when A has one seed and one sample), the seeds and samples both arms
        have, the whole-seed SD the comparison measured (None: assumed), and the size of the family its verdict
        is corrected in."""
        a, b = common_tasks(a, b)
        return replace(
            cls._measured(a, DEFAULT_FLIP_RATE),
            samples=min(a.samples, b.samples),
            seeds=min(len(a.seeds), len(b.seeds)),
            seed_sd=result.seed_sd if result.seed_sd_measured else None,
            comparisons=comparisons,
        )

    @classmethod
    def _measured(cls, o: Outcomes, fallback: float) -> StudyDesign:
        within = within_seed_flip_rate(o)
        between = flip_rate(o)
        f = between if between is not None else within if within is not None else fallback
        b = min(max(rate(o, 1), 0.01), 0.99)
        f = min(f, 2 * b * (1 - b))
        noise = SeedNoise.pooled([cell_values(o)])
        return cls(
            len(o.tasks),
            o.samples,
            len(o.seeds),
            b,
            f,
            None if within is None else min(within, f),
            None if noise is None else min(math.sqrt(noise.variance), 0.5),
        )
