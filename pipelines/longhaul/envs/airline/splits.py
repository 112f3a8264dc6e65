"""Task splits: `seed_40_10` (the original project's 40/10 split with its teacher-coverage subsets),
`tau2_official` (τ²'s split file in the installed package) and `explicit` lists from the spec.

Pure: the preset ids are constants (method.md section e); the τ² file is package data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longhaul.envs.airline.tasks import official_split

SEED_TRAIN = (0, 1, 2, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 21, 22, 24, 25, 27, 28, 29, 31, 32, 33, 34,
              35, 37, 38, 39, 40, 41, 42, 44, 45, 47, 48, 49)  # fmt: skip
SEED_TEST = (3, 10, 16, 20, 23, 26, 30, 36, 43, 46)
SEED_COVERED = (0, 6, 13, 15, 17, 21, 24, 33, 34, 37, 38, 40, 42, 44, 47, 48)

#: Order of subset labels, most specific first (the first that contains a task is its primary label).
SUBSET_ORDER = ("covered_seen", "uncovered_seen", "unseen", "train", "test")


@dataclass(frozen=True)
class Split:
    """Train and test task ids plus named subsets (always `train`, `test`, `unseen`; `covered_seen` and
    `uncovered_seen` when coverage is known)."""

    train: list[str]
    test: list[str]
    subsets: dict[str, list[str]] = field(default_factory=dict)
    name: str = "explicit"

    @property
    def all_ids(self) -> list[str]:
        return self.train + self.test

    def labels(self, task_id: str) -> list[str]:
        """Every subset containing the task, most specific first."""
        tid = str(task_id)
        return [s for s in SUBSET_ORDER if tid in self.subsets.get(s, ())]

    def primary(self, task_id: str) -> str:
        """The most specific subset label of a task ('none' if it is in no subset)."""
        labels = self.labels(task_id)
        return labels[0] if labels else "none"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "train": self.train, "test": self.test, "subsets": self.subsets}


def _ids(xs: Any) -> list[str]:
    return [str(x) for x in xs]


def build_seed_40_10() -> Split:
    train, test, covered = _ids(SEED_TRAIN), _ids(SEED_TEST), _ids(SEED_COVERED)
    uncovered = [t for t in train if t not in set(covered)]
    return Split(
        train,
        test,
        {"train": train, "test": test, "covered_seen": covered, "uncovered_seen": uncovered, "unseen": test},
        name="seed_40_10",
    )


def build_tau2_official(official: dict[str, list[str]] | None = None) -> Split:
    """τ²'s split file (`split_tasks.json` of the pinned data)."""
    if official is None:
        official = official_split()
    train, test = _ids(official["train"]), _ids(official["test"])
    return Split(train, test, {"train": train, "test": test, "unseen": test}, name="tau2_official")


def build_explicit(train: list[int | str], test: list[int | str], covered_seen: list[int | str] | None = None) -> Split:
    tr, te = _ids(train), _ids(test)
    subsets = {"train": tr, "test": te, "unseen": te}
    if covered_seen is not None:
        cov = _ids(covered_seen)
        subsets["covered_seen"] = cov
        subsets["uncovered_seen"] = [t for t in tr if t not in set(cov)]
    return Split(tr, te, subsets, name="explicit")


PRESETS = ("seed_40_10", "tau2_official", "explicit")


def build_split(split_spec: Any = None, *, known_ids: list[str] | None = None) -> Split:
    """A `Split` from `spec.environment.split` (a `SplitSpec`, a preset name, or None for the default preset).

    With `known_ids` every id is checked against the tasks that exist.
    """
    if split_spec is None:
        split = build_seed_40_10()
    elif isinstance(split_spec, str):
        if split_spec == "seed_40_10":
            split = build_seed_40_10()
        elif split_spec == "tau2_official":
            split = build_tau2_official()
        else:
            raise ValueError(
                f"unknown split preset {split_spec!r}; valid: seed_40_10, tau2_official "
                "(explicit lists need a spec: environment.split.preset: explicit)"
            )
    else:
        preset = str(getattr(split_spec.preset, "value", split_spec.preset))
        if preset == "explicit":
            split = build_explicit(split_spec.train, split_spec.test, split_spec.covered_seen)
        else:
            split = build_split(preset)
    if known_ids is not None:
        known = set(known_ids)
        bad = [t for t in split.all_ids if t not in known]
        if bad:
            raise ValueError(f"split {split.name}: unknown task ids {bad}; valid ids: {sorted(known, key=_num)}")
    return split


def _num(x: str) -> tuple[int, str]:
    return (int(x), x) if x.isdigit() else (1 << 30, x)
