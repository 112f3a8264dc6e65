#!/usr/bin/env python3
"""100 Experiments applied at once → all reconciled to Jobs by the operator, against the test API server.

    python benchmarks/bench_operator.py [--count 100] [--kubeconfig KC]

Starts the emulator (tests/support/run_kube_emulator.py) and `kopf run` as processes (or uses --kubeconfig),
applies the CRD from the chart, then one `kubectl apply -f` with N Experiments (copies of
specs/prm_lite_lata.yaml under different names), and prints the wall time until every Experiment has its
first-stage Job and its status (phase Pending, runName set). Target: ≤ 30 s for 100.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NS = "bench"

# The loopback helpers the tests use (one copy): tests/support/net.py.
sys.path.insert(0, str(ROOT / "tests"))
from support.net import free_port, wait_http  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--kubeconfig", help="use this cluster instead of starting the emulator")
    ap.add_argument("--profile", help="write a cProfile of the operator process to this file")
    args = ap.parse_args()
    kubectl = os.environ.get("KUBECTL") or str(ROOT / ".cache/bin/kubectl")
    work = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    procs: list[subprocess.Popen] = []
    try:
        if args.kubeconfig:
            kc = Path(args.kubeconfig)
            base = None
        else:
            port = free_port()
            kc = work / "kubeconfig"
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "tests/support/run_kube_emulator.py"),
                        "--port",
                        str(port),
                        "--kubeconfig",
                        str(kc),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(work / "emulator.log").open("w"),
                )
            )
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/version")
        env = {**os.environ, "KUBECONFIG": str(kc), "KUBECACHEDIR": str(work / "cache")}

        def k(*a: str, input: str | None = None) -> str:
            return subprocess.run(
                [kubectl, *a], input=input, env=env, check=True, capture_output=True, text=True
            ).stdout

        k("apply", "-f", str(ROOT / "charts/longhaul/crds/experiments.longhaul.dev.yaml"))
        k("wait", "--for=condition=Established", "crd/experiments.longhaul.dev")
        k("apply", "-f", "-", input=k("create", "namespace", NS, "--dry-run=client", "-o", "yaml"))
        probe = free_port()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    *(["-m", "cProfile", "-o", args.profile] if args.profile else []),
                    "-m",
                    "kopf",
                    "run",
                    "--standalone",
                    f"--namespace={NS}",
                    f"--liveness=http://127.0.0.1:{probe}/healthz",
                    "--log-format=json",
                    str(ROOT / "operator/longhaul_operator.py"),
                ],
                env=env,
                stdout=(work / "operator.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        wait_http(f"http://127.0.0.1:{probe}/healthz")

        base_doc = yaml.safe_load((ROOT / "specs/prm_lite_lata.yaml").read_text())
        docs = []
        for i in range(args.count):
            doc = yaml.safe_load(yaml.safe_dump(base_doc))
            doc["metadata"]["name"] = f"bench-{i:03d}"
            docs.append(doc)
        text = yaml.safe_dump_all(docs)

        t0 = time.monotonic()
        k("apply", "-n", NS, "-f", "-", input=text)
        t_apply = time.monotonic() - t0
        t_jobs = t_status = None
        # Poll cheaply (jsonpath, not whole objects): the poller shares the CPUs with what it measures.
        jobs: list[str] = []
        while time.monotonic() - t0 < 300:
            jobs = k("get", "jobs", "-n", NS, "-o", "jsonpath={.items[*].metadata.name}").split()
            if t_jobs is None and len(jobs) >= args.count:
                t_jobs = time.monotonic() - t0
            if t_jobs is not None:
                rows = k(
                    "get",
                    "experiments",
                    "-n",
                    NS,
                    "-o",
                    'jsonpath={range .items[*]}{.status.phase},{.status.runName}{"\\n"}{end}',
                ).split()
                if sum(1 for r in rows if r.startswith("Pending,") and len(r) > len("Pending,")) >= args.count:
                    t_status = time.monotonic() - t0
                    break
            time.sleep(0.5)
        if t_status is None:
            raise SystemExit(f"not all reconciled within 300 s (jobs: {len(jobs)}); logs in {work}")
        duplicates = len(jobs) - len(set(jobs))
        print(f"experiments: {args.count}  (one `kubectl apply`: {t_apply:.1f} s)")
        print(f"all first-stage Jobs created: {t_jobs:.1f} s after apply")
        print(f"all statuses written (Pending, runName): {t_status:.1f} s after apply  (target <= 30 s)")
        print(f"jobs: {len(jobs)}, duplicates: {duplicates}; cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
        names = ["emulator", "operator"] if len(procs) == 2 else ["operator"]
        cpu = ", ".join(f"{n} {cpu_seconds(p.pid):.1f} s" for n, p in zip(names, procs, strict=True))
        print(f"CPU time: {cpu}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
