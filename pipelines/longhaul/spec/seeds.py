"""Training seeds as an axis: how many, how large, and the annotation value that lists a seed group's seeds (pure)."""

from __future__ import annotations

import re

#: Training seeds per Experiment and the largest seed: `-s<seed>` must fit the 63-character object names.
MAX_SEEDS = 16
MAX_SEED = 9999


def parse_seed_list(text: str) -> list[int]:
    """The seeds of a `7,8` annotation value; [] when it is not such a list (distinct seeds 0 … MAX_SEED, at most
    MAX_SEEDS of them)."""
    if not re.fullmatch(r"[0-9]{1,4}(,[0-9]{1,4})*", text):
        return []
    seeds = [int(x) for x in text.split(",")]
    return seeds if len(seeds) <= MAX_SEEDS and len(set(seeds)) == len(seeds) else []
