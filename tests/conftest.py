"""How the end-to-end phase shares two workers (`scripts/test-all.sh`: pytest-xdist, `--dist loadgroup`).

Most of an end-to-end test's time is single-threaded start-up (Python imports of torch, vLLM and veRL in every
server, Ray actor and trainer process), so two tests side by side use the 2-core machine far better than one.
Each test file is one unit of work (its module fixtures run once); files that share a machine-wide resource share
a lane and run one after another on one worker; the heaviest units start first so that the two workers finish
together. Without `--dist loadgroup` (a plain `pytest`, the unit phase) nothing here changes anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent

#: (path under tests/, lane), in the order the units start. Paths sharing a lane run on one worker, in this order.
#: Slurm: every job queues on the one-node cluster (and the two-node partition shares its host), so its tests
#: serialise anyway; images: the builds share image tags and podman's store; k8s: one kubeconfig and the
#: emulator's CRDs. The rest are independent: free ports, private run directories, their own servers.
SCHEDULE: tuple[tuple[str, str], ...] = (
    ("e2e/slurm/test_smoke_on_slurm.py", "slurm"),
    ("e2e/slurm/test_multinode_on_slurm.py", "slurm"),
    ("e2e/slurm/", "slurm"),
    ("reliability/test_slurm_faults.py", "slurm"),
    ("reliability/test_launcher_faults.py", "launcher-faults"),
    ("e2e/mlflow/test_smoke_on_server.py", "lora-seeds"),
    ("e2e/demo/", "demo"),
    ("e2e/verl/", "verl-faults"),
    ("e2e/images/", "images"),
    ("e2e/k8s/", "k8s"),
)


def _placement(item: pytest.Item) -> tuple[int, str]:
    """(rank in SCHEDULE, lane) of a test; unlisted files rank last and are a lane of their own."""
    rel = Path(str(item.path)).resolve().relative_to(_TESTS).as_posix()
    for rank, (prefix, lane) in enumerate(SCHEDULE):
        if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix)):
            return rank, lane
    return len(SCHEDULE), rel


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`: put every test in its lane and order the lanes heaviest first."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    placed = {id(item): _placement(item) for item in items}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(placed[id(item)][1]))
    items.sort(key=lambda item: placed[id(item)][0])  # stable: a file keeps its order
