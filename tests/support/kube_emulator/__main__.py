"""Run the test API server as a process and (optionally) write a kubeconfig for it.

    python tests/support/run_kube_emulator.py --port 8765 --kubeconfig /tmp/kubeconfig
    KUBECONFIG=/tmp/kubeconfig kubectl get ns

It listens on 127.0.0.1 only, prints one line `ready http://127.0.0.1:<port>` to stdout when it serves, and
stops on SIGTERM/SIGINT. Port 0 picks a free port (read it from the ready line or from --port-file).

Fault injection (see faults.py and the README): `--delay POST:jobs=2` (answer late, after the write),
`--fault POST:jobs=500x2` (error answers, hung or reset requests, 410 on watches), `--drop-watches 5` (cut every
watch stream after 5 s); at run time through `PUT /emulator/faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import kmock
import yaml

from .faults import Faults, parse_rule
from .server import K8S_VERSION, KubeEmulator


def kubeconfig(url: str, namespace: str = "default") -> str:
    """A kubeconfig for the emulator (no auth: the emulator does not check credentials)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}
        ],
        "current-context": "emulator",
    }
    return yaml.safe_dump(doc, sort_keys=False)


async def serve(
    port: int,
    kubeconfig_path: Path | None,
    port_file: Path | None,
    version: str,
    access_log: bool = False,
    delays: dict[tuple[str, str], float] | None = None,
    faults: Faults | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emulator = KubeEmulator(k8s_version=version, access_log=access_log, delays=delays or {}, faults=faults or Faults())
    async with emulator as emu, kmock.Server(emu, host="127.0.0.1", port=port) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        if kubeconfig_path:
            kubeconfig_path.write_text(kubeconfig(url))
        if port_file:
            port_file.write_text(str(srv.port))
        print(f"ready {url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="run_kube_emulator.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = a free one)")
    ap.add_argument("--kubeconfig", type=Path, help="write a kubeconfig pointing at the server here")
    ap.add_argument("--port-file", type=Path, help="write the port number here once serving")
    ap.add_argument("--k8s-version", default=K8S_VERSION, help="Kubernetes minor version for schemas and /version")
    ap.add_argument("--access-log", action="store_true", help="print one line per request (method, path, status)")
    ap.add_argument(
        "--delay",
        action="append",
        default=[],
        metavar="METHOD:PLURAL=SECONDS",
        help="answer matching requests late, after the write (fault injection), e.g. POST:jobs=2",
    )
    ap.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="METHOD:PLURAL=FAULT[xCOUNT]",
        help="fault injection: answer matching requests with an HTTP status (409, 410, 429, 500, 503…), "
        "'timeout' (hold, then close without answering) or 'reset' (close at once), the first COUNT "
        "times or always, e.g. POST:jobs=500x2, WATCH:jobs=410x1, PATCH:experiments/status=409",
    )
    ap.add_argument(
        "--drop-watches",
        type=float,
        metavar="SECONDS",
        help="fault injection: cut every watch stream SECONDS after it opened (a broken connection)",
    )
    ap.add_argument(
        "--retry-after",
        type=int,
        default=1,
        metavar="SECONDS",
        help="the Retry-After header of injected 429 answers (default 1)",
    )
    ap.add_argument(
        "--fault-hold",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a 'timeout' fault holds a request before closing the connection (default 30)",
    )
    ap.add_argument(
        "--fault-exempt-agent",
        action="append",
        default=[],
        metavar="PREFIX",
        help="never fault requests whose User-Agent starts with PREFIX (e.g. kubectl: the test's tools)",
    )
    args = ap.parse_args(argv)
    try:
        rules = [parse_rule(r) for r in args.fault]
    except ValueError as exc:
        ap.error(str(exc))
    faults = Faults(
        rules=rules,
        drop_watches_s=args.drop_watches,
        retry_after_s=args.retry_after,
        hold_s=args.fault_hold,
        exempt_agents=tuple(args.fault_exempt_agent),
    )
    delays = {}
    for item in args.delay:
        key, _, seconds = item.partition("=")
        method, _, plural = key.partition(":")
        delays[(method.upper(), plural)] = float(seconds)
    try:
        asyncio.run(
            serve(args.port, args.kubeconfig, args.port_file, args.k8s_version, args.access_log, delays, faults)
        )
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
