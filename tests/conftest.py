"""How the end-to-end phase shares two workers (`scripts/test-all.sh`: pytest-xdist, `--dist loadgroup`).

Each test file is one unit of work (its module fixtures run once), and every file is in a lane: files in one lane
run one after another on one worker. The tests that run a whole pipeline (veRL's trainer with its Ray cluster,
vLLM servers, Slurm jobs of them) share one lane, started first: two of them side by side on the 2-core, 24 GiB
machine overloaded it (seen in CI: Ray's memory monitor killed a trainer's actors, and a local Ray timed out at
start-up beside the two-node Slurm job). Everything else — Kubernetes, images, MLflow, Slurm mechanics with a
stand-in launcher, the hostile-input and fault tests — runs on the other worker beside them; files sharing a
machine-wide resource (podman's image store, the emulator's kubeconfig, the Slurm cluster's stand-in jobs) share
a lane there too. `--dist loadgroup` turns this on (xdist's scope scheduler with the lane as the scope); without
it (a plain `pytest`, the unit phase with `--dist loadfile`) nothing here changes anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent

#: The lane of every test that runs a pipeline (trainer, Ray, vLLM servers): one at a time.
PIPELINES = "pipelines"

#: (path under tests/, lane), in the order the units start. Paths sharing a lane run on one worker, in this order.
#: Slurm: the stand-in launcher's jobs and the cluster's fault tests; images: the builds share image tags and
#: podman's store; k8s: one kubeconfig and the emulator's CRDs. The rest are independent: free ports, private run
#: directories, their own servers.
SCHEDULE: tuple[tuple[str, str], ...] = (
    ("reliability/test_launcher_faults.py", PIPELINES),
    ("e2e/slurm/test_smoke_on_slurm.py", PIPELINES),
    ("e2e/demo/", PIPELINES),
    ("e2e/verl/", PIPELINES),
    ("e2e/slurm/", "slurm"),
    ("reliability/test_slurm_faults.py", "slurm"),
    ("e2e/images/", "images"),
    ("e2e/k8s/", "k8s"),
)


#: Files without a lane that take a minute or more on CI's machine (each file is still a unit of its own): they start
#: before the other files without a lane, longest first, so the run ends on short files and neither worker waits
#: for the other.
#: In collection order (unit, e2e, reliability) the reliability files came last: in one CI run the pipeline worker
#: went idle at 1977 s while the other ran the operator faults (178 s), security and tracking faults until 2083 s.
LONG_FIRST: tuple[str, ...] = (
    "reliability/test_operator_faults.py",
    "reliability/test_security.py",
    "reliability/test_tracking_faults.py",
    "unit/tiny/",
    "unit/memory/",
    "unit/verlcpu/",
    "e2e/mlflow/",
    "unit/agentloop/test_qwen3_thinking.py",
    "e2e/serving/",
    "reliability/test_endpoint_faults.py",
)


def _matches(rel: str, prefix: str) -> bool:
    return rel == prefix or (prefix.endswith("/") and rel.startswith(prefix))


def _where(rel: str) -> tuple[int, str]:
    """(rank, lane) of a test file given by its path under tests/: SCHEDULE's files by their place there; the others
    are a lane of their own, ranked after them, the `LONG_FIRST` ones first, in that order."""
    for rank, (prefix, lane) in enumerate(SCHEDULE):
        if _matches(rel, prefix):
            return rank, lane
    first = next((i for i, prefix in enumerate(LONG_FIRST) if _matches(rel, prefix)), len(LONG_FIRST))
    return len(SCHEDULE) + first, rel


def _rank(item: pytest.Item) -> int:
    return _where(Path(str(item.path)).resolve().relative_to(_TESTS).as_posix())[0]


def _lanes_on(config: pytest.Config) -> bool:
    """Whether this run schedules by lane (`--dist loadgroup`): xdist's workers, which collect, run with `dist`
    reset to "no" and `loadgroup` set; the controller the reverse."""
    return bool(getattr(config.option, "loadgroup", False)) or config.getoption("dist", "no") == "loadgroup"


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001 - xdist's Producer
    """Under `--dist loadgroup`: xdist's scope scheduler with a lane as the scope. (xdist's own loadgroup marks
    node ids, which pytest 9 no longer lets a plugin rename: the groups were silently ignored.)"""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _where(nodeid.split("::", 1)[0].removeprefix("tests/"))[1]

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`: order the lanes heaviest first (stable: a file keeps its order)."""
    if _lanes_on(config):
        items.sort(key=_rank)


#: Seconds of test time (setup, call, teardown) per (worker, lane), collected on the controller: where the
#: critical path is. Printed under --dist loadgroup (CI's run).
_BUSY: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # xdist's WorkerController, on the controller only
    if node is None:
        return
    worker = node.gateway.id
    lane = _where(report.nodeid.split("::", 1)[0].removeprefix("tests/"))[1]
    if lane not in {name for _, name in SCHEDULE}:  # a file of its own: counted under its folder
        lane = "/".join(lane.split("/")[:2]).removesuffix(".py")
    key = (worker, lane)
    _BUSY[key] = _BUSY.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    """Each worker's busy seconds by lane: the longest worker is the test phase's critical path."""
    if not _BUSY:
        return
    tr = terminalreporter
    tr.section("busy seconds per worker and lane")
    for worker in sorted({w for w, _ in _BUSY}):
        lanes = sorted(((s, lane) for (w, lane), s in _BUSY.items() if w == worker), reverse=True)
        total = sum(s for s, _ in lanes)
        tr.write_line(f"{worker}: {total:7.0f} s  " + ", ".join(f"{lane} {s:.0f}" for s, lane in lanes))
