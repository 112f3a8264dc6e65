"""MLflow tracking adapter: URI rules and trainer environment, provenance, runs, evaluation children, relay, compare.

The pure analysis these modules call (tag schema, metric keys, checkpoint selection, the ablation table and its
statistics, the watchdog) is `longhaul.analysis`. Importing this package does not import MLflow: `config` is light;
the MLflow adapter lives in `longhaul.tracking.client` (shared basics), `.runs`, `.seed_group`,
`.alerts`, `.relay` and `.compare`.
"""

from longhaul.tracking.config import (
    TrackingConfigError,
    require_trainer_env,
    resolve_tracking_uri,
    tracking_env,
)

__all__ = [
    "TrackingConfigError",
    "require_trainer_env",
    "resolve_tracking_uri",
    "tracking_env",
]
