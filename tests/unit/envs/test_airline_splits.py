"""Split presets (method.md e) and explicit lists from the spec."""

from __future__ import annotations

import pytest

from longhaul.envs.airline.splits import build_split
from longhaul.envs.airline.tasks import load_tasks, official_split
from longhaul.spec.environment import SplitSpec

KNOWN = list(load_tasks())


def test_seed_40_10_sizes_and_partition():
    s = build_split("seed_40_10", known_ids=KNOWN)
    sizes = {k: len(v) for k, v in s.subsets.items()}
    assert sizes == {"train": 40, "test": 10, "covered_seen": 16, "uncovered_seen": 24, "unseen": 10}
    assert set(s.train) | set(s.test) == set(KNOWN) and not set(s.train) & set(s.test)
    assert set(s.subsets["covered_seen"]) | set(s.subsets["uncovered_seen"]) == set(s.train)
    assert s.test == ["3", "10", "16", "20", "23", "26", "30", "36", "43", "46"]
    assert s.primary("0") == "covered_seen" and s.primary("1") == "uncovered_seen" and s.primary("3") == "unseen"
    assert s.labels("3") == ["unseen", "test"]


def test_tau2_official_comes_from_the_package_file():
    s = build_split("tau2_official", known_ids=KNOWN)
    off = official_split()
    assert s.train == off["train"] and s.test == off["test"]
    assert (len(s.train), len(s.test)) == (30, 20)
    assert "covered_seen" not in s.subsets


def test_spec_default_and_explicit_lists():
    assert build_split(SplitSpec()).name == "seed_40_10"
    s = build_split(SplitSpec(preset="explicit", train=[0, 1, 2], test=[3], covered_seen=[0]), known_ids=KNOWN)
    assert s.train == ["0", "1", "2"] and s.test == ["3"]
    assert s.subsets["uncovered_seen"] == ["1", "2"]
    s2 = build_split(SplitSpec(preset="explicit", train=[0], test=[3]))
    assert "covered_seen" not in s2.subsets


def test_unknown_ids_and_presets_are_refused():
    with pytest.raises(ValueError, match="less than or equal to 49"):  # the spec knows the domain's ids (issue 30)
        SplitSpec(preset="explicit", train=[0, 99], test=[3])
    with pytest.raises(ValueError, match=r"unknown task ids \['2'\]"):  # and the split checks the tasks that exist
        build_split(SplitSpec(preset="explicit", train=[0, 2], test=[3]), known_ids=["0", "1", "3"])
    with pytest.raises(ValueError, match="valid: seed_40_10, tau2_official"):
        build_split("seed_40")
