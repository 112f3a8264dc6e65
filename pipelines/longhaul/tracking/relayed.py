"""What the MLflow adapter asks before it writes (no MLflow import): is this run relayed, and where does the write go.

`longhaul.tracking.runs` writes a run's records through here: while a relay (`longhaul.tracking.relay`) runs for
the run in this process, `enqueue_if_relayed` puts the operation in the relay's outbox instead of sending it, and
`queue_offline` queues one in a run directory's outbox with no relay running (the next relay of the run applies
it). The relay itself registers here when it starts and forwards the outbox with `runs.apply_operation`. Both
modules import this one and neither imports the other's caller: the relay sits above the run records it replays.

Files are the run directory's (`longhaul.layout.RelayPaths`): one JSON file per queued operation in the outbox,
the forwarding state in `state.json`, each written atomically (`longhaul.files`).
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from longhaul.files import PLAIN, atomic_write_text
from longhaul.layout import Paths, RelayPaths
from longhaul.tracking.config import ENV_TRACKING_URI

_LOCAL_SCHEMES = ("sqlite:", "file:")


def needs_relay(tracking_uri: str) -> bool:
    """True for a tracking server (anything but a local sqlite or file store)."""
    return not (tracking_uri.startswith(_LOCAL_SCHEMES) or "://" not in tracking_uri)


def relay_paths(run_dir: str | Path) -> RelayPaths:
    """The relay's files in the run directory `run_dir`."""
    return Paths.under(str(run_dir)).relay


def _without_userinfo(uri: str) -> str:
    """`uri` without `user:password@` (urllib would take it for part of the host name; /health needs no login)."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def probe_server(tracking_uri: str, timeout_s: float) -> str | None:
    """None when the server answers `GET /health` with 200 within `timeout_s`, else why not. Schemes without a
    health endpoint (databricks, …) are taken as up: the forwarding itself then tells."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(_without_userinfo(tracking_uri).rstrip("/") + "/health", timeout=timeout_s) as r:
            return None if r.status == 200 else f"/health answered HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        return f"/health answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{type(getattr(exc, 'reason', exc)).__name__}: {getattr(exc, 'reason', exc)}"


# ---------------------------------------------------------------------------------------------------------
# Files: atomic JSON, the outbox


def write_json(path: Path, data: Any) -> None:
    """`data` as compact sorted JSON, written atomically and durably (the relay's state and outbox entries)."""
    atomic_write_text(path, json.dumps(data, sort_keys=True), mode=PLAIN)


def read_json(path: Path, default: Any) -> Any:
    """The JSON document at `path`, or `default` when there is none."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


class Outbox:
    """longhaul's own MLflow operations, one JSON file each (`<seq>-<op>.json`), applied in `seq` order."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _seqs(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.dir.glob("*.json"):
            head = p.name.split("-", 1)[0]
            if head.isdigit():
                out.append((int(head), p))
        return sorted(out)

    def put(self, op: str, args: Mapping[str, Any], *, floor: int = 0) -> int:
        """Queue `op(**args)` durably; returns its sequence number (above `floor`: the last one already done)."""
        with self._lock:
            seqs = self._seqs()
            seq = max([floor, *(s for s, _ in seqs)]) + 1
            write_json(self.dir / f"{seq:010d}-{op}.json", {"seq": seq, "op": op, "args": dict(args)})
            return seq

    def pending(self) -> list[tuple[int, Path]]:
        """The queued operations not yet applied, as (sequence number, file), in order."""
        return self._seqs()


# ---------------------------------------------------------------------------------------------------------
# The registry: runs whose writes go through a relay in this process


class Relayed(Protocol):
    """What the registry needs of a running relay (`longhaul.tracking.relay.MetricsRelay`)."""

    remote_uri: str
    remote_run_id: str
    active: bool
    local_uri: str
    mirror_run_ids: list[str]

    def enqueue(self, op: str, **args: Any) -> None: ...


_ACTIVE: dict[str, Relayed] = {}
#: Relays closed in this process, by run id (`mirror_of` still answers for them).
_CLOSED: dict[str, Relayed] = {}
_ACTIVE_LOCK = threading.Lock()


def register(relay: Relayed) -> None:
    """From now on the writes of `relay.remote_run_id` in this process go to `relay`'s outbox."""
    with _ACTIVE_LOCK:
        _ACTIVE[relay.remote_run_id] = relay
        _CLOSED.pop(relay.remote_run_id, None)


def retire(relay: Relayed) -> None:
    """`relay` has stopped: writes go to the server again; `mirror_of` still finds its buffer store."""
    with _ACTIVE_LOCK:
        if _ACTIVE.get(relay.remote_run_id) is relay:
            del _ACTIVE[relay.remote_run_id]
        _CLOSED[relay.remote_run_id] = relay


def _uri_of(tracking_uri: Any) -> str:
    return str(getattr(tracking_uri, "tracking_uri", tracking_uri) or os.environ.get(ENV_TRACKING_URI, ""))


def enqueue_if_relayed(tracking_uri: Any, run_id: str, op: str, **args: Any) -> bool:
    """Queue `op` on the relay of (`tracking_uri`, `run_id`) if one is running in this process; True if queued."""
    with _ACTIVE_LOCK:
        relay = _ACTIVE.get(run_id)
    if relay is None or relay.remote_uri.rstrip("/") != _uri_of(tracking_uri).rstrip("/"):
        return False
    relay.enqueue(op, **args)
    return True


def queue_offline(run_dir: str | Path, op: str, **args: Any) -> None:
    """Queue `op` in a run directory's outbox without a running relay (the next relay of the run applies it)."""
    files = relay_paths(run_dir)
    state = read_json(Path(files.state_file), {})
    Outbox(Path(files.outbox_dir)).put(op, args, floor=int(state.get("ops_seq_done", 0)))


def mirror_of(run_id: str) -> tuple[str, list[str]] | None:
    """(buffer store URI, mirror run ids of every launch) of a run relayed in this process (also after `close`),
    or None."""
    with _ACTIVE_LOCK:
        relay = _ACTIVE.get(run_id) or _CLOSED.get(run_id)
    return None if relay is None or not relay.active else (relay.local_uri, list(relay.mirror_run_ids))
