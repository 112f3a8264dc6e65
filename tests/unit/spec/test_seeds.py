"""Training seeds as an axis: one Experiment, one run per seed, deterministic names `<run>-s<seed>`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longhaul import constants as C
from longhaul.render.kubernetes import configmap_name, stage_job_name
from longhaul.spec import (
    SpecError,
    load_spec,
    parse_spec_text,
    resolved_yaml,
    run_name,
    seed_group,
    seed_runs,
)
from longhaul.spec.naming import group_of

ROOT = Path(__file__).resolve().parents[3]


def _smoke_with(**algorithm: object) -> str:
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["algorithm"].pop("seed", None)
    doc["spec"]["algorithm"].update(algorithm)
    return yaml.safe_dump(doc, sort_keys=False)


def test_seed_runs_are_named_after_the_group_and_survive_a_round_trip() -> None:
    group = parse_spec_text(_smoke_with(seeds=[3, 11]), file="s.yaml")
    runs = seed_runs(group)
    assert [run_name(r) for r in runs] == [f"{run_name(group)}-s3", f"{run_name(group)}-s11"]
    assert [r.spec.algorithm.seed for r in runs] == [3, 11]
    for r in runs:
        assert r.spec.algorithm.seeds is None and seed_group(r) == run_name(group)
        # What a job mounts and re-validates names the same run.
        back = parse_spec_text(resolved_yaml(r), file="mounted.yaml")
        assert run_name(back) == run_name(r) and back.spec.algorithm.seed == r.spec.algorithm.seed
        # Seed runs differ only in the seed: the rest of the spec is the group's.
        assert r.spec.model_dump(exclude={"algorithm"}) == group.spec.model_dump(exclude={"algorithm"})
    # Kubernetes children carry the seed and stay within 63 characters.
    names = {stage_job_name(r, "grpo") for r in runs} | {configmap_name(r) for r in runs}
    assert len(names) == 4 and all(len(n) <= 63 and "-s3-" in n or "-s11-" in n for n in names)


def test_a_spec_without_seeds_is_its_own_single_run() -> None:
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    assert seed_runs(exp) == [exp] and seed_group(exp) is None
    assert not run_name(exp).endswith(f"-s{exp.spec.algorithm.seed}")


def test_a_resolved_group_spec_reads_back_with_its_default_seed() -> None:
    group = parse_spec_text(_smoke_with(seeds=[1, 2]), file="g.yaml")
    back = parse_spec_text(resolved_yaml(group), file="resolved.yaml")  # holds seed: 42 beside seeds
    assert back.spec.algorithm.seed == 42 and run_name(back) == run_name(group)


def test_different_seed_lists_are_different_groups() -> None:
    a = parse_spec_text(_smoke_with(seeds=[1, 2]), file="a.yaml")
    b = parse_spec_text(_smoke_with(seeds=[1, 2, 3]), file="b.yaml")
    assert run_name(a) != run_name(b)
    assert run_name(seed_runs(a)[0]) != run_name(seed_runs(b)[0])


@pytest.mark.parametrize(
    ("algorithm", "annotations", "field", "fragment"),
    [
        ({"seeds": [1, 1]}, {}, "spec.algorithm.seeds", "distinct"),
        ({"seeds": [1, 2], "seed": 4}, {}, "spec.algorithm.seeds", "not both"),
        ({"seeds": []}, {}, "spec.algorithm.seeds", "at least 1"),
        ({"seeds": [10_000]}, {}, "spec.algorithm.seeds[0]", "too large"),
        ({"seeds": list(range(17))}, {}, "spec.algorithm.seeds", "at most 16"),
        ({"seeds": [1, 2]}, {C.ANNOTATION_SEED_GROUP: "smoke-0123abcd"}, "spec.algorithm.seeds", "remove"),
        ({"seed": 1}, {C.ANNOTATION_SEED_GROUP: "other-0123abcd"}, "metadata.annotations", "set by longhaul"),
    ],
)
def test_bad_seed_specs_name_the_field(algorithm: dict, annotations: dict, field: str, fragment: str) -> None:
    doc = yaml.safe_load(_smoke_with(**algorithm))
    doc["metadata"]["annotations"] = annotations
    with pytest.raises(SpecError) as info:
        parse_spec_text(yaml.safe_dump(doc, sort_keys=False), file="bad.yaml")
    problems = {p.path: p.message for p in info.value.problems}
    assert field in problems, problems
    assert fragment in problems[field], problems


def test_a_long_name_with_seeds_is_refused_with_the_room_left() -> None:
    doc = yaml.safe_load(_smoke_with(seeds=[1, 2345]))
    doc["metadata"]["name"] = "x" * 54
    text = yaml.safe_dump(doc)
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, file="long.yaml")
    (p,) = [p for p in info.value.problems if p.path == "metadata.name"]
    assert "at most 48 characters" in p.message
    assert text.splitlines()[p.line - 1].strip() == "name: " + "x" * 54


def _seed_run_doc(lr: float | None = None) -> dict:
    """The resolved spec of seed run 0 of smoke with seeds [7, 8], as a job re-reads it; `lr` edits it by hand."""
    group = parse_spec_text(_smoke_with(seeds=[7, 8]), file="g.yaml")
    doc = yaml.safe_load(resolved_yaml(seed_runs(group)[0]))
    if lr is not None:
        doc["spec"]["algorithm"]["learning_rate"] = lr
    return doc


def test_a_seed_runs_name_derives_from_its_own_spec_not_from_the_annotation() -> None:
    """Issue 30, class 2: the group's run name is rebuilt from the seed run's spec and the group's seeds; the
    annotation is only checked against it. A hand-edited seed-run spec cannot keep the group's name (its run
    directory, MLflow run and checkpoints)."""
    from longhaul.spec.models import Experiment

    doc = _seed_run_doc()
    exp = parse_spec_text(yaml.safe_dump(doc), file="seed.yaml")
    group_name = doc["metadata"]["annotations"][C.ANNOTATION_SEED_GROUP]
    assert doc["metadata"]["annotations"][C.ANNOTATION_SEED_GROUP_SEEDS] == "7,8"
    assert seed_group(exp) == group_name and run_name(exp) == f"{group_name}-s7"

    edited = _seed_run_doc(lr=0.5)
    with pytest.raises(SpecError) as info:
        parse_spec_text(yaml.safe_dump(edited), file="edited.yaml")
    (p,) = info.value.problems
    assert p.path == f"metadata.annotations.{C.ANNOTATION_SEED_GROUP}" and "remove both annotations" in p.message
    assert p.line is not None  # where the annotation is written
    # Built without the loader, the edited spec still gets the name its own spec derives (the group it would be a
    # seed run of), never the annotated one.
    direct = Experiment.model_validate(edited)
    rebuilt = group_of(direct, [7, 8])
    assert rebuilt is not None and seed_group(direct) == run_name(rebuilt) != group_name
    assert run_name(direct) == f"{run_name(rebuilt)}-s7"


@pytest.mark.parametrize(
    "annotations",
    [
        {C.ANNOTATION_SEED_GROUP: "smoke-0123abcd"},  # the group's name alone, by hand
        {C.ANNOTATION_SEED_GROUP_SEEDS: "7,8"},  # the seeds alone
        {C.ANNOTATION_SEED_GROUP: "smoke-0123abcd", C.ANNOTATION_SEED_GROUP_SEEDS: "7;8"},
        {C.ANNOTATION_SEED_GROUP: "smoke-0123abcd", C.ANNOTATION_SEED_GROUP_SEEDS: "8,9"},  # not this run's seed
        {C.ANNOTATION_SEED_GROUP: "smoke-0123abcd", C.ANNOTATION_SEED_GROUP_SEEDS: "7,8"},  # another group's name
    ],
)
def test_hand_written_seed_group_annotations_are_refused(annotations: dict) -> None:
    doc = yaml.safe_load(_smoke_with(seed=7))
    doc["metadata"]["annotations"] = annotations
    with pytest.raises(SpecError) as info:
        parse_spec_text(yaml.safe_dump(doc), file="pinned.yaml")
    assert all(p.path.startswith("metadata.annotations") for p in info.value.problems), info.value
