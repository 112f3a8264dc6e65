"""`longhaul history`'s table (pure formatting of an Experiment's status.history); the command against a cluster
is exercised in tests/e2e/k8s/test_gitops_e2e.py."""

from __future__ import annotations

from longhaul.commands.submit import history_table


def test_history_table_aligns_and_shortens() -> None:
    exp = {
        "metadata": {"name": "x", "namespace": "ns"},
        "status": {
            "history": [
                {
                    "runName": "x-aaaaaaaa",
                    "specHash": "a" * 64,
                    "gitCommit": "c" * 40,
                    "phase": "Succeeded",
                    "mlflowRunId": "r1",
                    "startTime": "2026-01-01T00:00:00Z",
                    "completionTime": "2026-01-01T01:00:00Z",
                },
                {"runName": "x-bbbbbbbb", "specHash": "b" * 64, "phase": "Pending"},
            ]
        },
    }
    lines = history_table(exp).splitlines()
    assert lines[0].split() == [
        "RUN",
        "SPEC",
        "HASH",
        "GIT",
        "COMMIT",
        "PHASE",
        "MLFLOW",
        "RUN",
        "STARTED",
        "COMPLETED",
    ]
    assert lines[1].split() == [
        "x-aaaaaaaa",
        "a" * 12,
        "c" * 12,
        "Succeeded",
        "r1",
        "2026-01-01T00:00:00Z",
        "2026-01-01T01:00:00Z",
    ]
    assert lines[2].split() == ["x-bbbbbbbb", "b" * 12, "-", "Pending", "-", "-", "-"]
    assert lines[0].index("PHASE") == lines[1].index("Succeeded") == lines[2].index("Pending")


def test_history_table_without_runs_says_so() -> None:
    assert history_table({"metadata": {"name": "x", "namespace": "ns"}}) == "ns/x: no runs recorded yet"
