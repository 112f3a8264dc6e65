"""A seed group ends with one parent run and every seed run under it, whatever order the seeds' writes reach the
store in (a real MLflow sqlite store, through `start_or_resume_run`, the path every backend's job takes).

Two interleavings CI met are replayed step by step, then many random ones run concurrently. Both replays broke the
previous election, which waited a fixed 2 s and then kept the oldest parent it saw: a create stamped earlier but
committed later made a second parent (first replay), and a seed that found a parent at once kept it although that
parent was deleted a moment later by the seed whose older one arrived late (second replay; stop 41's CI).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.spec import parse_spec_text, run_name, seed_runs
from longhaul.tracking.runs import start_or_resume_run

REPO = Path(__file__).resolve().parents[3]
SEEDS = [3, 4, 5, 6]


def _group():
    doc = yaml.safe_load((REPO / "specs" / "smoke.yaml").read_text())
    doc["spec"]["algorithm"].pop("seed")
    doc["spec"]["algorithm"]["seeds"] = SEEDS
    doc["metadata"]["name"] = "seed-group-test"
    group = parse_spec_text(yaml.safe_dump(doc), file="seeds.yaml")
    return group, {r.spec.algorithm.seed: r for r in seed_runs(group)}


def _is_parent_query(args, kwargs) -> bool:
    query = args[1] if len(args) > 1 else kwargs.get("filter_string", "")
    return f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'" in query


class _LateSeed(MlflowClient):
    """A seed whose first look for a parent found none (it looked before any create was committed) and whose
    parent create was stamped at `stamp_ms`, before the others started (its clock ran first; the store committed
    it last)."""

    def __init__(self, uri: str, stamp_ms: int) -> None:
        super().__init__(uri)
        self.stamp_ms, self.looked = stamp_ms, False

    def search_runs(self, *args, **kwargs):
        if _is_parent_query(args, kwargs) and not self.looked:
            self.looked = True
            return []
        return super().search_runs(*args, **kwargs)

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        if (tags or {}).get(T.KIND) == T.KIND_SEED_GROUP:
            start_time = self.stamp_ms
        return super().create_run(experiment_id, start_time=start_time, tags=tags, run_name=run_name)


class _JitterySeed(MlflowClient):
    """A seed on a loaded server: each call waits a random moment before it reaches the store, and a create is
    stamped before that wait (as MLflow's client stamps it before the request travels)."""

    def __init__(self, uri: str, rng: random.Random) -> None:
        super().__init__(uri)
        self.rng = rng

    def _lag(self) -> None:
        time.sleep(self.rng.choice([0.0, 0.0, 0.01, 0.05, 0.2]))

    def search_runs(self, *args, **kwargs):
        self._lag()
        return super().search_runs(*args, **kwargs)

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        start_time = start_time or int(time.time() * 1000)
        self._lag()
        return super().create_run(experiment_id, start_time=start_time, tags=tags, run_name=run_name)

    def set_tag(self, *args, **kwargs):
        self._lag()
        return super().set_tag(*args, **kwargs)


def _start(client: MlflowClient, run, tmp_path: Path):
    seed = run.spec.algorithm.seed
    return start_or_resume_run(
        run, client, tmp_path / f"s{seed}", "slurm", environ={"LONGHAUL_JOB_ID": f"9_{seed}"}
    ).run_id


def _assert_one_parent_over_all(uri: str, group, children: dict[int, str]) -> str:
    client = MlflowClient(uri)
    eid = client.get_run(children[SEEDS[0]]).info.experiment_id
    parents = client.search_runs([eid], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    assert [p.info.run_name for p in parents] == [run_name(group)], parents
    parent = parents[0].info.run_id
    under = {seed: client.get_run(rid).data.tags.get(T.PARENT_RUN_ID) for seed, rid in children.items()}
    assert under == dict.fromkeys(children, parent)
    assert parents[0].data.tags[T.SPEC_NAME] == "seed-group-test"
    return parent


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_a_create_stamped_earlier_and_committed_later_leaves_one_parent(store, tmp_path):
    """Seed 4 looked first and stamped first, but its parent reached the store after seed 3 had made its own and
    nested under it: 4's older parent stays, 3's goes, and 3's run moves under 4's."""
    group, runs = _group()
    stamp = int(time.time() * 1000) - 1
    children = {3: _start(MlflowClient(store), runs[3], tmp_path)}
    children[4] = _start(_LateSeed(store, stamp), runs[4], tmp_path)
    parent = _assert_one_parent_over_all(store, group, children)
    assert MlflowClient(store).get_run(parent).info.start_time == stamp


def test_a_seed_that_found_a_parent_follows_it_when_that_parent_loses(store, tmp_path):
    """Seeds 3 and 5 nest under 3's parent at once; then seed 4's older parent arrives and 3's is deleted: both
    move under 4's, and a requeued seed 5 resumes its run under it."""
    group, runs = _group()
    stamp = int(time.time() * 1000) - 1
    children = {3: _start(MlflowClient(store), runs[3], tmp_path)}
    children[5] = _start(MlflowClient(store), runs[5], tmp_path)
    first = MlflowClient(store).get_run(children[5]).data.tags[T.PARENT_RUN_ID]
    children[4] = _start(_LateSeed(store, stamp), runs[4], tmp_path)
    parent = _assert_one_parent_over_all(store, group, children)
    assert MlflowClient(store).get_run(parent).info.start_time == stamp
    assert parent != first and MlflowClient(store).get_run(first).info.lifecycle_stage == "deleted"
    assert _start(MlflowClient(store), runs[5], tmp_path) == children[5]
    _assert_one_parent_over_all(store, group, children)


@pytest.mark.parametrize("trial", range(8))
def test_seeds_starting_together_on_a_jittery_store_end_under_one_parent(trial, tmp_path):
    group, runs = _group()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # the schema, created once before the seeds race
    barrier = threading.Barrier(len(SEEDS))
    children: dict[int, str] = {}
    errors: list[BaseException] = []

    def seed(s: int) -> None:
        try:
            client = _JitterySeed(uri, random.Random(trial * 100 + s))
            barrier.wait()
            children[s] = _start(client, runs[s], tmp_path)
        except BaseException as exc:  # surfaced below, with the seed
            errors.append(exc)

    threads = [threading.Thread(target=seed, args=(s,)) for s in SEEDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    _assert_one_parent_over_all(uri, group, children)
