"""The parent run of a multi-seed Experiment: one per group, however many seeds create it at once.

Seed runs start concurrently on Kubernetes and Slurm (a job array's tasks start together), and MLflow has no
create-if-absent: several seeds can find no parent and each create one. Nothing here waits for a fixed time —
a loaded one-worker server can commit a create seconds after it was stamped, and a wait sized to the last
failure is the next one's cause. Instead two rules hold whatever the timing:

* **One parent survives.** Parents are ordered by (start time, run id). Whoever creates a parent searches again
  after its create is committed and deletes every visible parent but the oldest. Of any two creators, the one
  whose search comes later sees both parents (each was committed before its owner's search), so the newer of
  every pair is deleted, and the oldest is never deleted (no one deletes the oldest parent it sees).
* **Every seed run ends under the survivor.** A seed run's parent tag is written, then its parent is read back;
  if that parent was deleted, the seed elects again and writes again. Whoever deletes a parent first deletes it,
  then moves its children to the survivor. A write that read back "not deleted" came before the deletion, so the
  deleter's search after the deletion finds it; a write that read back "deleted" is redone by its writer.

`tests/unit/tracking/test_seed_group_parent.py` replays the interleavings that broke fixed waits on a real store.
"""

from __future__ import annotations

from collections.abc import Mapping

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.tracking.client import TrackingError, quote_filter, terminate

#: Tags a seed group's parent run copies from its first seed run: what the runs table and `compare` group by.
GROUP_TAGS = (
    T.SPEC_NAME,
    T.FAMILY,
    T.ADVANTAGE,
    T.PROCESS_REWARD,
    T.CREDIT,
    T.POLICY_MODEL,
    T.STAGES,
    T.SELECT_ON,
    T.GIT_COMMIT,
)

#: Elections one seed run may need before its parent stays: each extra one follows a deleted parent, and a group
#: never has more parents than seeds; the bound only turns a store that keeps deleting into a clear error.
_MAX_ROUNDS = 32


def _parents(client: MlflowClient, experiment_id: str, group: str) -> list[Run]:
    """The group's active parent runs, oldest first (start time, then run id: the same order for every seed)."""
    query = f"attributes.run_name = {quote_filter(group)} and tags.`{T.KIND}` = {quote_filter(T.KIND_SEED_GROUP)}"
    found = client.search_runs([experiment_id], query, max_results=1000)
    return sorted(found, key=lambda r: (r.info.start_time, r.info.run_id))


def _create_parent(client: MlflowClient, experiment_id: str, group: str, provenance: Mapping[str, str]) -> str:
    tags = {k: provenance[k] for k in GROUP_TAGS if k in provenance}
    run_id = client.create_run(
        experiment_id,
        run_name=group,
        tags={
            **tags,
            T.KIND: T.KIND_SEED_GROUP,
            T.RUN_NAME: group,
            T.NOTE: f"Training seeds of `{group}`: one child run per seed (`{group}-s<seed>`), each with "
            "its evaluation runs.",
        },
    ).info.run_id
    # The parent only groups its children (one training run per seed, their evaluations under them); it is
    # FINISHED at creation because no single seed run knows when the last one ends.
    terminate(client, run_id, "FINISHED")
    return run_id


def elect_parent(client: MlflowClient, experiment_id: str, group: str, provenance: Mapping[str, str]) -> str:
    """Id of the group's parent run (run name = the group's run name), created when none is visible.

    Every newer parent this seed sees is deleted and its seed runs are moved to the oldest. The id returned can
    still lose to an older parent whose create was not yet visible: `nest` reads it back after writing it.
    """
    for _ in range(_MAX_ROUNDS):
        found = _parents(client, experiment_id, group)
        if not found:
            _create_parent(client, experiment_id, group, provenance)
            found = _parents(client, experiment_id, group)  # after our create is committed: see the module doc
        if not found:
            continue  # ours was deleted by a seed that saw an older one, since deleted by hand: elect again
        survivor, *newer = (r.info.run_id for r in found)
        for loser in newer:
            _retire(client, experiment_id, group, provenance, loser, survivor)
        return survivor
    raise TrackingError(f"MLflow experiment {experiment_id}: the parent runs of seed group {group!r} keep vanishing")


def nest(
    client: MlflowClient,
    experiment_id: str,
    group: str,
    provenance: Mapping[str, str],
    seed_run_id: str,
    parent_id: str,
) -> str:
    """Make `seed_run_id` a child of `parent_id`, or of the parent elected instead when that one was deleted;
    the id of the parent it stays under."""
    for _ in range(_MAX_ROUNDS):
        if client.get_run(seed_run_id).data.tags.get(T.PARENT_RUN_ID) != parent_id:
            client.set_tag(seed_run_id, T.PARENT_RUN_ID, parent_id)
        if client.get_run(parent_id).info.lifecycle_stage != "deleted":
            return parent_id
        parent_id = elect_parent(client, experiment_id, group, provenance)
    raise TrackingError(
        f"MLflow run {seed_run_id}: the parent runs of seed group {group!r} keep vanishing; check who deletes them"
    )


def _retire(
    client: MlflowClient, experiment_id: str, group: str, provenance: Mapping[str, str], loser: str, survivor: str
) -> None:
    """Delete a newer parent, then move its seed runs under the survivor (in that order: see the module doc)."""
    client.delete_run(loser)
    children = client.search_runs(
        [experiment_id], f"tags.`{T.PARENT_RUN_ID}` = {quote_filter(loser)}", max_results=1000
    )
    for child in children:
        nest(client, experiment_id, group, provenance, child.info.run_id, survivor)
