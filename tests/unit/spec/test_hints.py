"""Wording of the loader's errors: number ranges from the schema; union tags never swallow a user's key."""

from __future__ import annotations

from longhaul.spec.hints import number_range, strip_union_tags


def test_number_ranges_come_from_the_fields_schema() -> None:
    assert number_range(("spec", "resources", "cpus_per_node")) == "a whole number from 1 to 4,096"
    assert number_range(("spec", "algorithm", "learning_rate")) == "a number above 0 and below 1"
    assert number_range(("spec", "reward", "rules", "aggregate", "clip")) == "a number above 0, up to 10"
    assert number_range(("spec", "evaluation", "checkpoints", 0)) == "a whole number from 0 to 10,000,000"
    assert number_range(("spec", "metadata")) is None and number_range(("spec", "resources", "memory")) is None


def test_union_tags_are_stripped_but_user_keys_that_look_like_them_are_kept() -> None:
    doc = {"spec": {"policy": {"strange": 1, "int_x": 2, "list[0]": 3}, "evaluation": {"checkpoints": [1, "x"]}}}
    for key in ("strange", "int_x", "list[0]"):
        assert strip_union_tags(("spec", "policy", key), doc) == ("spec", "policy", key)
    loc = ("spec", "evaluation", "checkpoints", "list[constrained-int]", 1, "int_parsing")
    assert strip_union_tags(loc[:-1], doc) == ("spec", "evaluation", "checkpoints", 1)
    assert strip_union_tags(("spec", "evaluation", "checkpoints", "literal['all','last']"), doc) == (
        "spec",
        "evaluation",
        "checkpoints",
    )
    # a missing field (not in the document) is kept: it is the field the error is about
    assert strip_union_tags(("spec", "policy", "model"), doc) == ("spec", "policy", "model")
