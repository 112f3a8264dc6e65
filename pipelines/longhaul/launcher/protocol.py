"""The launcher's signal and exit-code protocol, by the name rendered batch scripts cite (their comments say
`Protocol: longhaul.launcher.protocol`; the golden scripts pin that text). The values live in `longhaul.protocol`,
below every layer, because the Slurm renderer needs them too and may not import the launcher."""

from longhaul.protocol import (
    CHECKPOINT_SIGNAL,
    EXIT_FAILED,
    EXIT_KILLED,
    EXIT_OK,
    EXIT_REQUEUE,
    EXIT_SIGINT,
    EXIT_USAGE,
    STOP_GRACE_S,
)

__all__ = [
    "CHECKPOINT_SIGNAL",
    "EXIT_FAILED",
    "EXIT_KILLED",
    "EXIT_OK",
    "EXIT_REQUEUE",
    "EXIT_SIGINT",
    "EXIT_USAGE",
    "STOP_GRACE_S",
]
