"""Starting, health-checking, stopping and re-weighting the OpenAI-compatible servers of a launch plan."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

import httpx

from longhaul import constants as C
from longhaul.launcher.console import quiet
from longhaul.launcher.processes import ManagedProcess, describe_exit, wait_until
from longhaul.render.gpus import GpuMaskError, within_job_mask
from longhaul.render.plan import ServerPlan


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time; the message carries the tail of its log."""


def probe_health(url: str, timeout_s: float = 2.0) -> bool:
    """True when `url` answers 200."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


class ManagedServer:
    """One server of the plan: a `ManagedProcess` plus its URLs, health wait and restart."""

    def __init__(self, plan: ServerPlan, env: Mapping[str, str], logs_dir: str | Path, echo: TextIO | None = None):
        self.plan = plan
        self._env = dict(env)
        self._logs_dir = Path(logs_dir)
        self._echo = echo
        self.process: ManagedProcess | None = None
        #: Whether this start has answered its health check (an exit before it is a start failure, not a crash).
        self.healthy = False
        self.starts = 0
        self.startup_seconds: list[float] = []

    @property
    def role(self) -> str:
        return self.plan.role

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    @property
    def served_model_name(self) -> str:
        return self.plan.served_model_name

    def start(self) -> ManagedServer:
        """Start the process (does not wait for health)."""
        if probe_health(self.plan.health_url, timeout_s=0.5):
            raise ServerStartError(
                f"{self.role} server: port {self.plan.port} on {self.plan.host} already answers {self.plan.health_url}; "  # noqa: E501 - a string literal kept whole
                "another server is running there — stop it, or change the port in the spec"
            )
        self.process = ManagedProcess(
            self.role,
            self.plan.argv,
            self._process_env(),
            log_path=self._logs_dir / f"{self.role}.log",
            echo=self._echo,
            console=quiet,
        ).start()
        self.starts += 1
        self._started_at = time.monotonic()
        self.healthy = False
        return self

    def _process_env(self) -> dict[str, str]:
        """The server's environment: the launcher's, the plan's, and the plan's GPU positions taken inside the job's
        own device mask (`longhaul.render.gpus`)."""
        env = {**self._env, **self.plan.env}
        positions = self.plan.env.get(C.CUDA_MASK_VAR)
        if positions is not None:
            try:
                env[C.CUDA_MASK_VAR] = within_job_mask(positions, self._env.get(C.CUDA_MASK_VAR))
            except GpuMaskError as exc:
                raise ServerStartError(f"{self.role} server: {exc}") from None
        return env

    def wait_healthy(self, abort: Callable[[], bool] | None = None) -> float:
        """Block until /health answers 200; returns the seconds since start. Raises ServerStartError."""
        assert self.process is not None, "start() first"
        proc = self.process
        ok = wait_until(
            lambda: probe_health(self.plan.health_url),
            timeout_s=self.plan.startup_timeout_s,
            interval_s=1.0,
            abort=lambda: proc.poll() is not None or (abort is not None and abort()),
        )
        if not ok:
            if proc.poll() is not None:
                raise ServerStartError(
                    f"{self.role} server exited with code {proc.poll()} before {self.plan.health_url} became "
                    f"healthy; command: {' '.join(self.plan.argv)}\n--- last lines of "
                    f"{self._logs_dir / (self.role + '.log')} ---\n{proc.tail()}"
                )
            if abort is not None and abort():
                raise InterruptedError(f"{self.role} server start-up interrupted")
            raise ServerStartError(
                f"{self.role} server: {self.plan.health_url} not healthy after {self.plan.startup_timeout_s} s "
                f"(user_simulator.startup_timeout_s); busy machine? raise the timeout. Last lines:\n{proc.tail()}"
            )
        took = time.monotonic() - self._started_at
        self.startup_seconds.append(took)
        self.healthy = True
        return took

    @property
    def crashed(self) -> bool:
        """True when the server served and has exited since (nobody stopped it). One that exits before its health
        check answered failed to start (`wait_healthy` / `StartupWatch` report it)."""
        return self.process is not None and self.healthy and self.process.poll() is not None

    def describe_crash(self, stage: str) -> str:
        """`simulator server (pid N) exited (killed by SIGKILL) during stage 'grpo'; its log: …` for messages."""
        proc = self.process
        rc = proc.poll() if proc is not None else None
        return (
            f"{self.role} server (pid {proc.pid if proc else '?'}) exited ({describe_exit(rc)}) during stage "
            f"'{stage}'; its log: {self._logs_dir / (self.role + '.log')}"
        )

    def stop(self) -> None:
        """Stop by PID (process group); safe to call twice."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def restart(self, abort: Callable[[], bool] | None = None) -> float:
        """Stop (what is left of its process group), start with the same command, wait healthy; returns the
        start-up seconds."""
        self.stop()
        self.start()
        return self.wait_healthy(abort)


class PolicyServer(ManagedServer):
    """The policy server of a CPU run: serves a model directory that weight updates replace.

    `serve_weights(src)` makes the server serve the model in `src`. It first asks the running server to reload
    its weights in place from `src` (vLLM's development endpoint `POST /collective_rpc` with method
    `reload_weights`, enabled by VLLM_SERVER_DEV_MODE=1 on loopback only, then `POST /reset_prefix_cache`);
    if that is not available it restarts the server on `src`. The seconds taken and the way are recorded in
    `self.updates` (logged as `timing/serve_weights_s`). Either way the server's command then names `src`, so a
    restart after a crash (`restart`) serves the same weights.
    """

    #: Environment that enables the in-place reload endpoints (the server binds 127.0.0.1 only).
    DEV_ENV = {"VLLM_SERVER_DEV_MODE": "1"}

    def __init__(
        self,
        plan: ServerPlan,
        env: Mapping[str, str],
        logs_dir: str | Path,
        echo: TextIO | None = None,
        reload_in_place: bool = True,
    ):
        super().__init__(plan, {**env, **(self.DEV_ENV if reload_in_place else {})}, logs_dir, echo)
        self.reload_in_place = reload_in_place
        self.serving: str | None = None  # label of the weights being served (for logs and the summary)
        self.updates: list[dict[str, object]] = []

    def _root(self) -> str:
        return f"http://{self.plan.host}:{self.plan.port}"

    def _reload(self, src: Path) -> bool:
        try:
            r = httpx.post(
                f"{self._root()}/collective_rpc",
                timeout=600.0,
                json={"method": "reload_weights", "kwargs": {"weights_path": str(src.resolve())}},
            )
            if r.status_code != 200:
                return False
            httpx.post(f"{self._root()}/reset_prefix_cache", timeout=60.0)
            return probe_health(self.plan.health_url)
        except httpx.HTTPError:
            return False

    def serve_weights(self, src: str | Path, label: str, abort: Callable[[], bool] | None = None) -> float:
        """Serve the model directory `src`; returns the seconds until the server answers with it."""
        src = Path(src)
        if not (src / "config.json").is_file():
            raise FileNotFoundError(f"{src}: not a model directory (no config.json)")
        t0 = time.monotonic()
        how = "reload"
        if self.process is None or self.process.poll() is not None or not (self.reload_in_place and self._reload(src)):
            how = "restart"
            self.stop()
            self.plan = replace_model(self.plan, str(src))
            self.start()
            self.wait_healthy(abort)
        else:
            self.plan = replace_model(self.plan, str(src))  # a restart after a crash serves these weights too
        took = time.monotonic() - t0
        self.serving = label
        self.updates.append({"label": label, "how": how, "seconds": round(took, 3)})
        return took


def replace_model(plan: ServerPlan, model_dir: str) -> ServerPlan:
    """The same server plan serving `model_dir` (the value after `--model` is replaced)."""
    argv = list(plan.argv)
    try:
        i = argv.index("--model")
    except ValueError as exc:
        raise ValueError(f"{plan.role} server command has no --model argument: {argv}") from exc
    argv[i + 1] = model_dir
    return dataclasses.replace(plan, argv=tuple(argv))


class StartupWatch:
    """The health waits of servers just started, each in a thread of its own, so that the launcher can go on: veRL's
    trainer starts while the simulator loads (its agent loop waits for the simulator to serve, `clients.ready`).

    `failure()` is the first start-up error so far (None while all are fine or pending): a stage running beside
    the waits stops on it. `wait()` blocks until every server is healthy and raises the first error
    (`ServerStartError`, or `InterruptedError` when `abort` cut a wait short), as `wait_healthy` would have."""

    def __init__(self, servers: list[ManagedServer], abort: Callable[[], bool], say: Callable[[str], None]) -> None:
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._wait, args=(sv, abort, say), name=f"{sv.role}-health", daemon=True)
            for sv in servers
        ]
        for t in self._threads:
            t.start()

    def _wait(self, server: ManagedServer, abort: Callable[[], bool], say: Callable[[str], None]) -> None:
        try:
            took = server.wait_healthy(abort=abort)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits or polls
            with self._lock:
                self._errors.append(exc)
            return
        if isinstance(server, PolicyServer):
            server.serving = "base"
        say(f"{server.role} server healthy after {took:.0f} s")

    def failure(self) -> BaseException | None:
        """The first start-up error so far, or None."""
        with self._lock:
            return self._errors[0] if self._errors else None

    def wait(self) -> None:
        """Block until every wait has ended; raise the first error."""
        for t in self._threads:
            t.join()
        error = self.failure()
        if error is not None:
            raise error
