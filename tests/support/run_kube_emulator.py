#!/usr/bin/env python3
"""Start the Kubernetes test API server: `python tests/support/run_kube_emulator.py --port 8765 --kubeconfig KC`.

(`tests` is not an importable package here — a dependency ships a top-level `tests` package — so this script
puts tests/support on sys.path and runs `kube_emulator`.)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kube_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    main()
