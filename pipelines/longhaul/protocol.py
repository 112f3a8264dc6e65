"""Exit codes and signals of `longhaul launch` (the protocol is described in `longhaul.launcher`'s docstring).

A leaf module below every layer: the launcher implements the protocol, and the Slurm renderer, which may not import
the launcher, writes a batch script that speaks it.
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: "A checkpoint was saved after SIGUSR1: requeue me" (EX_TEMPFAIL from sysexits.h).
EXIT_REQUEUE = 75
#: Clean stop after SIGTERM (128 + 15) / Ctrl-C (128 + 2).
EXIT_KILLED = 143
EXIT_SIGINT = 130

#: The signal that asks for "save a checkpoint, then exit with EXIT_REQUEUE".
CHECKPOINT_SIGNAL = signal.SIGUSR1

#: Seconds a child gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 20.0
