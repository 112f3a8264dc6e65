"""What a stage of the launcher gets and hands back: its typed context (`StageContext`) and the results it reports
for the end-of-run summary (`StageResults`, typed fields, not free-form keys).

Below the stages (`longhaul.launcher.stages`) and the modules they call (`.evaluate`, `.traces`), which all take a
`StageContext`: none of them has to import the registry that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from longhaul.launcher.control import StopControl

if TYPE_CHECKING:
    from longhaul.launcher.servers import ManagedServer, PolicyServer, StartupWatch
    from longhaul.layout import Paths
    from longhaul.render.plan import LaunchPlan
    from longhaul.spec.models import Experiment


@dataclass
class StageResults:
    """What the stages of a launch report for its end-of-run summary (`status` is the launcher's own)."""

    status: str = ""
    #: The evaluation summary (`longhaul.eval.evaluate.summarize_evaluation`) of every evaluated checkpoint, by step.
    eval_summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The selected checkpoint (`select_on`, `step`, `pass^1`), or None when none was selected.
    selection: dict[str, Any] | None = None


@dataclass
class StageContext:
    """What a stage gets: the spec, the plan, the MLflow run, the servers and the stop control."""

    exp: Experiment
    plan: LaunchPlan
    run_dir: Path
    tracking_uri: str
    run_id: str
    env: dict[str, str]
    control: StopControl
    simulator_base_url: str
    simulator_model: str
    echo: TextIO
    #: Starts the policy server and waits for its health (called once, on first use).
    start_policy: Callable[[], PolicyServer] | None = None
    results: StageResults = field(default_factory=StageResults)
    #: The MLflow experiment of the run ("" when resumed offline): where the printed UI link opens.
    experiment_id: str = ""
    #: Every server the launch started (a command stage is stopped when one of them exits).
    servers: list[ManagedServer] = field(default_factory=list)
    #: The environment the launcher itself was started with (`env` is this plus what the launcher adds).
    inherited_env: dict[str, str] = field(default_factory=dict)
    #: The health waits of the servers the launch started (None when it started none).
    startup: StartupWatch | None = None
    _policy: PolicyServer | None = field(default=None, init=False, repr=False)

    @property
    def paths(self) -> Paths:
        return self.plan.paths

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.plan.paths.checkpoint_dir)

    def servers_ready(self) -> None:
        """Block until the launch's servers are healthy; raise their start-up error."""
        if self.startup is not None:
            self.startup.wait()

    def startup_failure(self) -> BaseException | None:
        """A server's start-up error so far (a stage running beside the start-up stops on it), else None."""
        return self.startup.failure() if self.startup is not None else None

    def policy_server(self) -> PolicyServer:
        """The policy server, started on first use (a veRL stage must not share its GPUs with it)."""
        if self._policy is None:
            if self.start_policy is None:
                raise RuntimeError("this launch has no policy server")
            self._policy = self.start_policy()
        return self._policy

    def say(self, msg: str) -> None:
        print(f"[launcher] {msg}", file=self.echo, flush=True)
