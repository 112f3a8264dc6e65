"""Watchdog I/O: read a training run's histories from MLflow, record alerts as tags/metrics/artifact.

`fetch_watchdog_report` is what `longhaul status` calls; the launcher calls `check_training_run` after each
logged step (or every few) and stops training when it returns `stop=True`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.analysis.watchdog import (
    Alert,
    History,
    WatchdogThresholds,
    compute_alerts,
    should_stop,
    watched_metric_keys,
)
from longhaul.tracking.client import client_for, now_ms
from longhaul.tracking.runs import log_batch


@dataclass(frozen=True)
class WatchdogReport:
    run_id: str
    alerts: tuple[Alert, ...]
    stop: bool


def fetch_histories(
    client: MlflowClient, run_id: str, thresholds: WatchdogThresholds | None = None
) -> dict[str, History]:
    """Histories of the metrics the watchdog reads, as `{key: [(step, value), ...]}`."""
    available = list(client.get_run(run_id).data.metrics)
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in watched_metric_keys(available, thresholds)
    }


def log_alerts(
    client: MlflowClient, run_id: str, alerts: list[Alert] | tuple[Alert, ...], *, stop: bool = False
) -> None:
    """Record alerts: `longhaul.alert.<code>` tags, `watchdog/<code>` metrics, `longhaul.alerts`, the JSON list."""
    now = now_ms()
    tags = {f"{T.ALERT_PREFIX}{a.code}": a.message for a in alerts}
    tags[T.ALERTS] = ",".join(sorted({a.code for a in alerts})) or "none"
    if stop:
        tags[T.EARLY_STOP] = "collapse: " + ", ".join(a.code for a in alerts if a.collapse)
    metrics = [Metric(f"watchdog/{a.code}", float(a.value), now, a.step) for a in alerts]
    log_batch(client, run_id, metrics=metrics, tags=tags)
    if alerts:
        client.log_dict(run_id, [a.to_dict() for a in alerts], T.WATCHDOG_ARTIFACT)


def check_training_run(
    tracking_uri: str | MlflowClient,
    run_id: str,
    *,
    early_stop_on_collapse: bool = False,
    thresholds: WatchdogThresholds | None = None,
    record: bool = True,
) -> WatchdogReport:
    """Run the watchdog on a training run; record alerts in MLflow (unless `record=False`); say whether to stop."""
    client = client_for(tracking_uri)
    alerts = compute_alerts(fetch_histories(client, run_id, thresholds), thresholds)
    stop = should_stop(alerts, early_stop_on_collapse)
    if record:
        log_alerts(client, run_id, alerts, stop=stop)
    return WatchdogReport(run_id, tuple(alerts), stop)


def fetch_watchdog_report(
    tracking_uri: str | MlflowClient, run_id: str, *, early_stop_on_collapse: bool = False
) -> WatchdogReport:
    """Read-only watchdog verdict for `longhaul status` (computes; writes nothing). See `format_alerts`."""
    return check_training_run(tracking_uri, run_id, early_stop_on_collapse=early_stop_on_collapse, record=False)


def format_alerts(report: WatchdogReport) -> list[str]:
    """One line per alert for `longhaul status` (empty when all is well)."""
    lines = [f"{'COLLAPSE' if a.collapse else 'WARNING'} {a.code} at step {a.step}: {a.message}" for a in report.alerts]
    if report.stop:
        lines.append("early stop requested (spec.tracking.early_stop_on_collapse)")
    return lines


class CollapseWatch:
    """Rate-limited watchdog for a running trainer: call `poll()` from the supervisor's wait loop.

    Every `every_s` seconds it reads the run's histories, records alerts in MLflow when the set of alert codes
    changed, and returns the report; `report.stop` tells the caller to stop training (only when
    `early_stop_on_collapse` is on). Between checks `poll()` returns None.
    """

    def __init__(
        self,
        tracking_uri: str | MlflowClient,
        run_id: str,
        *,
        early_stop_on_collapse: bool,
        every_s: float = 300.0,
        thresholds: WatchdogThresholds | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client_for(tracking_uri)
        self.run_id = run_id
        self.early_stop = early_stop_on_collapse
        self.every_s = every_s
        self.thresholds = thresholds
        self.clock = clock
        self._last: float | None = None
        self._codes: frozenset[str] = frozenset()

    def poll(self) -> WatchdogReport | None:
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return None
        self._last = now
        report = check_training_run(
            self.client, self.run_id, early_stop_on_collapse=self.early_stop, thresholds=self.thresholds, record=False
        )
        codes = frozenset(a.code for a in report.alerts)
        if codes != self._codes or report.stop:
            log_alerts(self.client, self.run_id, report.alerts, stop=report.stop)
            self._codes = codes
        return report
