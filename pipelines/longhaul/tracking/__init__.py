"""MLflow tracking: URI rules and trainer environment, provenance, runs, evaluation children, watchdog, compare.

Importing this package does not import MLflow: `config` and `watchdog` are light; the MLflow adapter lives in
`longhaul.tracking.runs`, `.alerts` and `.compare`.
"""

from longhaul.tracking.config import (
    TrackingConfigError,
    require_trainer_env,
    resolve_tracking_uri,
    tracking_env,
)
from longhaul.tracking.watchdog import Alert, WatchdogThresholds, compute_alerts, should_stop

__all__ = [
    "Alert",
    "TrackingConfigError",
    "WatchdogThresholds",
    "compute_alerts",
    "require_trainer_env",
    "resolve_tracking_uri",
    "should_stop",
    "tracking_env",
]
