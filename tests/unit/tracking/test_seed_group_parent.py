"""A seed group gets one parent run even when its seeds' creates reach the store out of order (a real MLflow sqlite
store; the interleaving CI's two-parent failure needed, made deterministic).

Seed B stamps its create first but the store commits it half a second later; seed A creates in between. Without
waiting (`SEED_GROUP_SETTLE_S`) A looked, saw only its own parent and kept it, then B looked, saw A's and its own,
older, and kept its own: two parents.
"""

from __future__ import annotations

import threading
import time

from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.tracking.runs import SEED_GROUP_SETTLE_S, ensure_seed_group_run

#: How late B's create reaches the store after B stamped it: well inside the settle wait.
LATE_S = 0.5


class _Seed(MlflowClient):
    """A seed run's client: `stamp_early` stamps the create now and sends it LATE_S later; otherwise the create
    waits until the other seed has looked for a parent (so both find none) and has stamped its own."""

    def __init__(self, uri: str, looked: threading.Event, other_looked: threading.Event, stamp_early: bool) -> None:
        super().__init__(uri)
        self.looked, self.other_looked, self.stamp_early = looked, other_looked, stamp_early

    def search_runs(self, *args, **kwargs):
        found = super().search_runs(*args, **kwargs)
        self.looked.set()
        return found

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        if self.stamp_early:
            start_time = int(time.time() * 1000)
            time.sleep(LATE_S)
        else:
            self.other_looked.wait(10)
            time.sleep(0.05)  # after B's stamp
        return super().create_run(experiment_id, start_time=start_time, tags=tags, run_name=run_name)


def test_one_parent_when_an_earlier_stamped_create_commits_late(tmp_path):
    assert SEED_GROUP_SETTLE_S > LATE_S
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    eid = MlflowClient(uri).create_experiment("group", artifact_location=(tmp_path / "art").as_uri())
    a_looked, b_looked = threading.Event(), threading.Event()
    clients = {"a": _Seed(uri, a_looked, b_looked, False), "b": _Seed(uri, b_looked, a_looked, True)}
    chosen: dict[str, str] = {}

    def seed(name: str) -> None:
        chosen[name] = ensure_seed_group_run(clients[name], eid, "smoke-1234", {T.SPEC_NAME: "smoke"})

    threads = [threading.Thread(target=seed, args=(n,)) for n in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    parents = MlflowClient(uri).search_runs([eid], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    assert [p.info.run_id for p in parents] == [chosen["a"]] == [chosen["b"]], (chosen, parents)
    assert parents[0].data.tags[T.SPEC_NAME] == "smoke"
