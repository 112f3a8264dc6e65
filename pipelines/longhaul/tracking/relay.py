"""The MLflow relay: training goes on and nothing is lost while the tracking server is down or slow.

Why. veRL's MLflow logger (`verl.utils.tracking`) logs every step synchronously from the trainer to
MLFLOW_TRACKING_URI. Measured against a real `mlflow server` stopped mid-training (mlflow 3.17.2, verl 0.9.1,
default client settings): the next `Tracking.log` call blocked for 739 s — MLflow's HTTP client retries each
request 7 times with back-off 2 → 120 s (≈ 4 min) and veRL's adapter tries 3 times — and then the step's metrics
were dropped with a warning; every later step does the same while the server is down. A black-holed server
(accepting connections, never answering) costs up to 120 s per try on top. A trainer started while the server is
down gives up on MLflow altogether ("Proceeding without MLflow tracking") and every metric of the run is lost.
longhaul's own records (checkpoints, evaluations, selection, run status) raised and failed their stage.

Design. When the run's tracking URI is a server (http, https, databricks, …):

1. **The trainer logs to a store that is always there**: an MLflow sqlite store in the run directory,
   `<run_dir>/.longhaul/mlflow-relay/buffer.db`, in a *mirror* run (tag `longhaul.relay.remote_run_id`). Every
   launch gets a mirror run of its own — veRL logs its whole config as params when it attaches, and a value that
   differs between launches would make MLflow refuse the attach and veRL drop every metric of that launch
   ("Proceeding without MLflow tracking"). `trainer_env` hands veRL the store and this launch's mirror run
   (MLFLOW_TRACKING_URI / MLFLOW_RUN_ID); veRL's logger is unchanged. Nothing in the trainer touches the network.
2. **longhaul's own writes go to an outbox**: while a relay runs for a run, `longhaul.tracking.runs`'
   `log_checkpoint`, `log_evaluation`, `log_selection`, `finish_run` and `mark_requeued` write one JSON file per
   operation to `<relay dir>/outbox/` (atomically, in order) and return at once.
3. **A relay thread in the launcher forwards both**, in order, when the server answers `/health` within
   `probe_timeout_s`: new metric rows of the run's mirror runs, all launches (read by sqlite rowid, which only
   grows: MLflow never deletes metric rows of a live run) in `log_batch` chunks of 1,000, new params, new
   artifacts, then the outbox operations. Progress — the highest forwarded rowid, the params and artifacts
   sent, the operations done — is saved in `state.json` after each acknowledged request. Unreachable or
   failing: it keeps everything, waits (doubling from `poll_s` up to `backoff_max_s`) and tries again.
4. **Exactly once.** A re-send (a launcher killed between the server's acknowledgement and the state save) is
   harmless: the server drops a metric equal to one it has (key, step, timestamp, value — MLflow's primary key);
   operations carry their timestamps and are idempotent (tags overwrite, the evaluation child run is found by
   its tags, artifacts overwrite, a resume is applied once per `resume_token`).
5. **Restart.** Everything is on disk: the next launch of the run finds the earlier mirror runs, the outbox and
   the state, and continues; `start_or_resume_run` resumes from the run directory's record when the server is
   down at launch (queuing the resume bookkeeping). At the end of a launch `close()` flushes for up to
   `flush_s`; what is still buffered then stays on disk for the next launch, or for
   `python -m longhaul.tracking.relay flush RUN_DIR`.

Counts (`RelayCounts`, also in `state.json` and printed by the launcher at the end): trainer metrics produced
(rows in the buffer), flushed (acknowledged by the server), pending (buffered on disk), dropped; longhaul
operations queued / done / pending.

Bound. The buffer is bounded by the run directory's disk, not by a count: a metric row takes ≈ 320 bytes with
MLflow's indexes (measured: a 100-metric step ≈ 32 kB and ≈ 60 ms to write; 10,000 such steps ≈ 320 MB), the
relay holds at most one 1,000-row batch in memory, and no metric is ever dropped by the relay (`dropped` is 0
by construction). Beyond the bound — the disk is full —
the trainer's own write to the buffer fails; veRL's logger then warns and goes on without that step's metrics
(its behaviour for any failing store), the relay keeps forwarding what was written, and the launcher's log shows
the warning. A server that refuses data for good (HTTP 4xx: a deleted run, a param logged with another value) is
reported and retried at the slowest pace; params it refuses (a value that changed between launches) are
counted (`params_rejected`), named in the launcher's log, and skipped.

Local stores (sqlite, file) need no relay: `start_relay` returns a pass-through that changes nothing.
Multi-node: the trainer's TaskRunner writes the buffer, so the run directory must be on a filesystem it shares
with the launcher (as the checkpoints already are).

Which runs are relayed, the outbox and the server's health check are `longhaul.tracking.relayed`, the module
`longhaul.tracking.runs` asks before it writes; the relay replays the outbox with `runs.apply_operation`. The files
are the run directory's (`longhaul.layout.RelayPaths`).

Size: over 400 lines because the relay's write-ahead log, replay and server-health logic are one protocol.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from longhaul.analysis.tags import RELAY_REMOTE_RUN_ID
from longhaul.layout import RELAY_BUFFER_DB
from longhaul.redact import redact_uri
from longhaul.tracking import relayed
from longhaul.tracking.config import ENV_RUN_ID, ENV_TRACKING_URI, local_store_uri
from longhaul.tracking.relayed import Outbox, needs_relay, probe_server, read_json, relay_paths, write_json
from longhaul.tracking.runs import apply_operation

#: Tag on the mirror run in the buffer store naming the server's run it is relayed to.
REMOTE_RUN_TAG = RELAY_REMOTE_RUN_ID
#: MLflow's per-request limits (log_batch).
BATCH_METRICS, BATCH_PARAMS = 1000, 100


@dataclass(frozen=True)
class RelayCounts:
    """What the relay has seen and done (module docstring)."""

    produced: int = 0
    flushed: int = 0
    pending: int = 0
    dropped: int = 0
    params_flushed: int = 0
    params_rejected: int = 0
    artifacts_flushed: int = 0
    ops_queued: int = 0
    ops_done: int = 0
    ops_pending: int = 0

    def summary(self) -> str:
        return (
            f"{self.produced} trainer metrics ({self.flushed} sent, {self.pending} buffered, {self.dropped} "
            f"dropped), {self.ops_queued} longhaul records ({self.ops_done} sent, {self.ops_pending} buffered)"
        )


# ---------------------------------------------------------------------------------------------------------
# The relay


class ServerUnavailable(ConnectionError):
    """The tracking server did not answer its health check (the message says how)."""


class MetricsRelay:
    """Buffer store + outbox + forwarding thread of one training run (module docstring).

    `start_relay(...)` builds and starts one; `trainer_env` is what the trainer gets instead of the server's URI
    and run id; `close(flush_s)` flushes for up to `flush_s` seconds and stops."""

    def __init__(
        self,
        remote_uri: str,
        remote_run_id: str,
        run_dir: str | Path,
        *,
        experiment_name: str = "longhaul-relay",
        poll_s: float = 2.0,
        backoff_max_s: float = 60.0,
        probe_timeout_s: float = 5.0,
        say: Callable[[str], None] | None = None,
        force: bool = False,
        trainer: bool = True,
    ) -> None:
        self.remote_uri = remote_uri
        self.remote_run_id = remote_run_id
        #: `force`: relay to a local store too (tests use a sqlite store as the "server"). `trainer`: this launch
        #: runs a trainer (it gets a mirror run of its own; False: only forward what earlier launches buffered).
        self.active = force or needs_relay(remote_uri)
        self.run_dir = Path(run_dir)
        self.files = relay_paths(run_dir)
        self.dir = Path(self.files.relay_dir)
        self.poll_s, self.backoff_max_s, self.probe_timeout_s = poll_s, backoff_max_s, probe_timeout_s
        self._say = say or (lambda msg: print(f"[mlflow-relay] {msg}", file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.local_uri = ""
        self.local_run_id = ""
        self.mirror_run_ids: list[str] = []
        if not self.active:
            return
        state = read_json(Path(self.files.state_file), {})
        if state.get("remote_run_id") not in (None, remote_run_id):
            # The run directory's MLflow run was replaced (deleted on the server, then created again): what is
            # buffered belongs to the old one and is kept, untouched (its mirror runs stay in the buffer store,
            # its outbox and state are renamed); the new run starts afresh.
            old = state["remote_run_id"]
            for kept in (Path(self.files.outbox_dir), Path(self.files.state_file)):
                if kept.exists():
                    kept.rename(kept.with_name(f"{kept.name}.{old}"))
            self._say(
                f"{self.dir} relayed MLflow run {old}, not {remote_run_id}: its outbox and state are kept as "
                f"*.{old}, its metrics in {RELAY_BUFFER_DB} (mirror runs tagged {REMOTE_RUN_TAG}={old})"
            )
            state = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        self.outbox = Outbox(Path(self.files.outbox_dir))
        self.db_path = Path(self.files.buffer_db)
        self.local_uri = local_store_uri(self.db_path)
        self.state = state
        self.local_run_id = self._mirror_run(experiment_name, new=trainer)

    # -- setup

    def _mirror_run(self, experiment_name: str, *, new: bool) -> str:
        """This launch's mirror run (a new one; with `new=False` the newest existing one, if any);
        `mirror_run_ids` lists every launch's, oldest first."""
        # deferred: mlflow (~1 s): the relay process imports it, not its importers
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.local_uri)
        exp = client.get_experiment_by_name(experiment_name)
        if exp is None:
            artifacts = Path(self.files.artifacts_dir).absolute()
            artifacts.mkdir(parents=True, exist_ok=True)
            exp_id = client.create_experiment(experiment_name, artifact_location=artifacts.as_uri())
        else:
            exp_id = exp.experiment_id
        launch = len(self.state.get("mirror_run_ids", [])) + 1
        run_id = (
            ""
            if not new
            else client.create_run(
                exp_id, run_name=f"launch-{launch}", tags={REMOTE_RUN_TAG: self.remote_run_id}
            ).info.run_id
        )
        found = client.search_runs(
            [exp_id],
            f"tags.`{REMOTE_RUN_TAG}` = '{self.remote_run_id}'",
            order_by=["attributes.start_time ASC"],
            max_results=10_000,
        )
        known = list(self.state.get("mirror_run_ids", []))
        self.mirror_run_ids = known + [r.info.run_id for r in found if r.info.run_id not in known]
        # Credentials never reach the run directory: `flush` takes the full URI from $MLFLOW_TRACKING_URI.
        self.state.update(
            remote_run_id=self.remote_run_id, mirror_run_ids=self.mirror_run_ids, remote_uri=redact_uri(self.remote_uri)
        )
        self._save()
        return run_id or (self.mirror_run_ids[-1] if self.mirror_run_ids else "")

    @property
    def trainer_env(self) -> dict[str, str]:
        """MLFLOW_TRACKING_URI / MLFLOW_RUN_ID for the trainer: the buffer store and the mirror run ({} when
        the tracking URI is a local store: the trainer logs there directly)."""
        if not self.active:
            return {}
        return {ENV_TRACKING_URI: self.local_uri, ENV_RUN_ID: self.local_run_id}

    def start(self) -> MetricsRelay:
        if not self.active:
            return self
        relayed.register(self)
        self._thread = threading.Thread(target=self._run, name=f"mlflow-relay-{self.remote_run_id[:8]}", daemon=True)
        self._thread.start()
        return self

    # -- queueing (longhaul's own writes)

    def enqueue(self, op: str, **args: Any) -> None:
        with self._lock:
            floor = int(self.state.get("ops_seq_done", 0))
            self.state["ops_queued"] = int(self.state.get("ops_queued", 0)) + 1
            self.outbox.put(op, args, floor=floor)
            self._save()
        self._wake.set()

    # -- counts

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.db_path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)

    def counts(self) -> RelayCounts:
        if not self.active:
            return RelayCounts()
        wm = int(self.state.get("metrics_rowid", 0))
        with contextlib.closing(self._connect()) as db:
            produced, flushed = db.execute(
                f"SELECT count(*), coalesce(sum(rowid <= ?), 0) FROM metrics WHERE run_uuid IN ({self._marks})",
                (wm, *self.mirror_run_ids),
            ).fetchone()
        ops_pending = len(self.outbox.pending())
        queued = max(int(self.state.get("ops_queued", 0)), int(self.state.get("ops_done", 0)) + ops_pending)
        return RelayCounts(
            produced=produced,
            flushed=flushed,
            pending=produced - flushed,
            dropped=0,
            params_flushed=len(self.state.get("params_sent", {})),
            params_rejected=len(self.state.get("params_rejected", {})),
            artifacts_flushed=len(self.state.get("artifacts_sent", {})),
            ops_queued=queued,
            ops_done=int(self.state.get("ops_done", 0)),
            ops_pending=ops_pending,
        )

    @property
    def _marks(self) -> str:
        return ", ".join("?" * len(self.mirror_run_ids))

    def _save(self) -> None:
        write_json(Path(self.files.state_file), self.state)

    # -- forwarding

    def _run(self) -> None:
        delay = self.poll_s
        while True:
            stopping = self._stop.is_set()
            try:
                if self.flush_once():
                    delay = self.poll_s
            except ServerUnavailable as exc:
                self._note(str(exc))
                delay = min(self.backoff_max_s, delay * 2)
            except Exception as exc:  # noqa: BLE001 - any failure: keep everything, wait, try again
                self._note(f"{type(exc).__name__}: {str(exc)[:300]}")
                delay = min(self.backoff_max_s, delay * 2)
            if stopping:
                return
            self._wake.wait(delay)
            self._wake.clear()

    def _note(self, error: str | None) -> None:
        if error != self.last_error:
            if error is None:
                self._say(f"MLflow server {redact_uri(self.remote_uri)} reachable again; forwarding what was buffered")
            else:
                self._say(
                    f"MLflow server {redact_uri(self.remote_uri)} unavailable ({error}); training goes on, metrics are "
                    f"buffered in {self.dir}"
                )
        self.last_error = error

    def flush_once(self) -> bool:
        """Forward everything buffered now (metrics, params, artifacts, then the outbox); True when all was sent.
        Raises on the first failure (nothing is lost: the state only advances past acknowledged requests)."""
        if not self.active:
            return True
        down = probe_server(self.remote_uri, self.probe_timeout_s)
        if down is not None:
            raise ServerUnavailable(down)
        # deferred: mlflow (~1 s): the relay process imports it, not its importers
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.remote_uri)
        self._forward_metrics(client)
        self._forward_params(client)
        self._forward_artifacts(client)
        self._apply_outbox(client)
        self._note(None)
        return True

    def _forward_metrics(self, client: Any) -> None:
        # deferred: mlflow (~1 s)
        from mlflow.entities import Metric

        while True:
            wm = int(self.state.get("metrics_rowid", 0))
            with contextlib.closing(self._connect()) as db:
                rows = db.execute(
                    "SELECT rowid, key, value, timestamp, step, is_nan FROM metrics "
                    f"WHERE run_uuid IN ({self._marks}) AND rowid > ? ORDER BY rowid LIMIT ?",
                    (*self.mirror_run_ids, wm, BATCH_METRICS),
                ).fetchall()
            if not rows:
                return
            metrics = [Metric(k, math.nan if nan else float(v), int(ts), int(step)) for _, k, v, ts, step, nan in rows]
            client.log_batch(self.remote_run_id, metrics=metrics)
            with self._lock:
                self.state["metrics_rowid"] = rows[-1][0]
                self.state["metrics_flushed"] = int(self.state.get("metrics_flushed", 0)) + len(rows)
                self._save()

    def _forward_params(self, client: Any) -> None:
        """New params of the mirror runs (`params_sent`: key → value sent). A chunk the server refuses is sent
        again one param at a time, so only the params it refuses (another value than the one it has) are skipped."""
        # deferred: mlflow (~1 s)
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        with contextlib.closing(self._connect()) as db:
            params = db.execute(
                f"SELECT key, value FROM params WHERE run_uuid IN ({self._marks})", tuple(self.mirror_run_ids)
            ).fetchall()
        sent, rejected = self.state.setdefault("params_sent", {}), self.state.setdefault("params_rejected", {})
        todo = sorted({k: v for k, v in params if sent.get(k) != v and rejected.get(k) != v}.items())
        for i in range(0, len(todo), BATCH_PARAMS):
            chunk = todo[i : i + BATCH_PARAMS]
            try:
                client.log_batch(self.remote_run_id, params=[Param(k, v) for k, v in chunk])
                outcome = dict.fromkeys((k for k, _ in chunk), True)
            except MlflowException as exc:
                if exc.error_code != "INVALID_PARAMETER_VALUE":
                    raise
                outcome = {}
                for k, v in chunk:
                    try:
                        client.log_batch(self.remote_run_id, params=[Param(k, v)])
                        outcome[k] = True
                    except MlflowException as one:
                        if one.error_code != "INVALID_PARAMETER_VALUE":
                            raise
                        outcome[k] = False
                bad = [k for k, ok in outcome.items() if not ok]
                self._say(
                    f"MLflow kept its earlier values of {len(bad)} params of run {self.remote_run_id} "
                    f"(this launch logged others): {', '.join(bad[:10])}{' …' if len(bad) > 10 else ''}"
                )
            with self._lock:
                for k, v in chunk:
                    (sent if outcome[k] else rejected)[k] = v
                self._save()

    def _forward_artifacts(self, client: Any) -> None:
        sent = self.state.setdefault("artifacts_sent", {})
        for mirror in self.mirror_run_ids:
            run_root = Path(self.files.artifacts_dir) / mirror / "artifacts"  # the experiment's artifact layout
            if not run_root.is_dir():
                continue
            for path in sorted(p for p in run_root.rglob("*") if p.is_file()):
                rel = path.relative_to(run_root).as_posix()
                stamp = f"{path.stat().st_size}:{path.stat().st_mtime_ns}"
                if sent.get(rel) == stamp:
                    continue
                parent = str(Path(rel).parent)
                client.log_artifact(self.remote_run_id, str(path), None if parent == "." else parent)
                with self._lock:
                    sent[rel] = stamp
                    self._save()

    def _apply_outbox(self, client: Any) -> None:
        for seq, path in self.outbox.pending():
            op = read_json(path, None)
            if op is None:
                continue
            apply_operation(client, self.remote_run_id, op["op"], op.get("args", {}))
            with self._lock:
                path.unlink(missing_ok=True)
                self.state["ops_done"] = int(self.state.get("ops_done", 0)) + 1
                self.state["ops_seq_done"] = max(seq, int(self.state.get("ops_seq_done", 0)))
                self._save()

    # -- stop

    def close(self, flush_s: float = 30.0) -> RelayCounts:
        """Flush for up to `flush_s` seconds, stop the thread, report the counts (what is left stays on disk).
        Never raises: the launcher calls it on its way out."""
        if not self.active:
            return RelayCounts()
        try:
            return self._close(flush_s)
        except Exception as exc:  # noqa: BLE001 - the exit code must still reach the scheduler
            self._stop.set()
            self._wake.set()
            self._say(
                f"MLflow relay: could not finish cleanly ({type(exc).__name__}: {exc}); what was buffered "
                f"stays in {self.dir}"
            )
            return RelayCounts()

    def _close(self, flush_s: float) -> RelayCounts:
        deadline = time.monotonic() + flush_s
        for delay in itertools.chain([0.0], itertools.repeat(min(1.0, self.poll_s))):
            counts = self.counts()
            if (counts.pending == 0 and counts.ops_pending == 0) or time.monotonic() + delay > deadline:
                break
            self._wake.set()
            time.sleep(delay or 0.05)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        relayed.retire(self)
        counts = self.counts()
        with self._lock:
            self.state["counts"] = asdict(counts)
            self._save()
        msg = f"MLflow relay to {redact_uri(self.remote_uri)}: {counts.summary()}"
        if counts.pending or counts.ops_pending:
            msg += (
                f"; the rest is kept in {self.dir} and sent by the next launch of this run or by "
                f"`python -m longhaul.tracking.relay flush {self.run_dir}`"
            )
        self._say(msg)
        return counts


def start_relay(
    remote_uri: str,
    remote_run_id: str,
    run_dir: str | Path,
    *,
    experiment_name: str = "longhaul-relay",
    say: Callable[[str], None] | None = None,
    **options: Any,
) -> MetricsRelay:
    """Build and start the relay of a training run (a pass-through for local stores)."""
    return MetricsRelay(remote_uri, remote_run_id, run_dir, experiment_name=experiment_name, say=say, **options).start()


def flush_run_dir(
    run_dir: str | Path, *, flush_s: float = 300.0, say: Callable[[str], None] | None = None
) -> RelayCounts:
    """Send what a run directory's relay still buffers (after the job ended, once the server is back)."""
    state_file = Path(relay_paths(run_dir).state_file)
    state = read_json(state_file, None)
    if not state or not state.get("remote_run_id"):
        raise FileNotFoundError(f"{state_file}: no MLflow relay in this run directory")
    uri = state["remote_uri"]
    if redact_uri(uri) != uri:  # stored redacted: the full URI comes from the environment, as it did for the job
        env_uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if redact_uri(env_uri) != uri:
            raise ValueError(
                f"{state_file}: the run was relayed to {uri} (credentials are not "
                "kept in the run directory); export MLFLOW_TRACKING_URI with that server's full URI and "
                "run the flush again"
            )
        uri = env_uri
    relay = MetricsRelay(uri, state["remote_run_id"], run_dir, say=say, force=not needs_relay(uri), trainer=False)
    return relay.start().close(flush_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m longhaul.tracking.relay flush RUN_DIR [SECONDS]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3) or args[0] != "flush":
        print("usage: python -m longhaul.tracking.relay flush RUN_DIR [SECONDS]", file=sys.stderr)
        return 2
    counts = flush_run_dir(args[1], flush_s=float(args[2]) if len(args) == 3 else 300.0)
    return 0 if counts.pending == 0 and counts.ops_pending == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
