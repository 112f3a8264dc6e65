"""Run the test API server as a process and (optionally) write a kubeconfig for it.

    python tests/support/run_kube_emulator.py --port 8765 --kubeconfig /tmp/kubeconfig
    KUBECONFIG=/tmp/kubeconfig kubectl get ns

It listens on 127.0.0.1 only, prints one line `ready http://127.0.0.1:<port>` to stdout when it serves, and
stops on SIGTERM/SIGINT. Port 0 picks a free port (read it from the ready line or from --port-file).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import kmock
import yaml

from .server import K8S_VERSION, KubeEmulator


def kubeconfig(url: str, namespace: str = "default") -> str:
    """A kubeconfig for the emulator (no auth: the emulator does not check credentials)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}],
        "current-context": "emulator",
    }
    return yaml.safe_dump(doc, sort_keys=False)


async def serve(port: int, kubeconfig_path: Path | None, port_file: Path | None, version: str,
                access_log: bool = False, delays: dict[tuple[str, str], float] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KubeEmulator(k8s_version=version, access_log=access_log, delays=delays or {}) as emu, kmock.Server(emu, host="127.0.0.1", port=port) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        if kubeconfig_path:
            kubeconfig_path.write_text(kubeconfig(url))
        if port_file:
            port_file.write_text(str(srv.port))
        print(f"ready {url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="run_kube_emulator.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = a free one)")
    ap.add_argument("--kubeconfig", type=Path, help="write a kubeconfig pointing at the server here")
    ap.add_argument("--port-file", type=Path, help="write the port number here once serving")
    ap.add_argument("--k8s-version", default=K8S_VERSION, help="Kubernetes minor version for schemas and /version")
    ap.add_argument("--access-log", action="store_true", help="print one line per request (method, path, status)")
    ap.add_argument("--delay", action="append", default=[], metavar="METHOD:PLURAL=SECONDS",
                    help="answer matching requests late, after the write (fault injection), e.g. POST:jobs=2")
    args = ap.parse_args(argv)
    delays = {}
    for item in args.delay:
        key, _, seconds = item.partition("=")
        method, _, plural = key.partition(":")
        delays[(method.upper(), plural)] = float(seconds)
    try:
        asyncio.run(serve(args.port, args.kubeconfig, args.port_file, args.k8s_version, args.access_log, delays))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
