"""Waiting for an OpenAI-compatible endpoint that is still starting.

The launcher starts the user simulator and veRL's trainer side by side: the simulator loads its weights (a 72B AWQ
model takes minutes on GPUs) while Ray, the actor and the rollout engine start. The first episode must not reach
the simulator before it serves, so the agent loop waits for it here, once per process: `GET <base_url>/models`
(every OpenAI-compatible server answers it; vLLM only once its engine is up) until it answers 200.

The wait is bounded by the launcher's own start-up budget (`spec.user_simulator.startup_timeout_s`, handed to the
trainer's processes as `LONGHAUL_SERVER_WAIT_S`): the launcher stops the stage when the server fails to start or
exceeds that budget, so the bound here only matters to a process nobody supervises. Unset or 0: no wait (an
endpoint outside a launch is expected to serve already; its faults are the retry policy's).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Mapping

import httpx

from longhaul.clients.openai_compat import EndpointError, FaultKind
from longhaul.constants import ENV_SERVER_WAIT_S
from longhaul.redact import redact_uri

#: Base URLs this process has seen serve: later episodes do not ask again.
_SERVING: set[str] = set()


async def wait_until_serving(
    base_url: str,
    timeout_s: float,
    *,
    api_key: str | None = None,
    role: str = "user simulator",
    interval_s: float = 1.0,
) -> None:
    """Return once `GET <base_url>/models` answers 200, at once when this process saw it do so before or when
    `timeout_s` <= 0; raise `EndpointError` (kind `connection_refused`) when `timeout_s` passes first."""
    base = base_url.rstrip("/")
    if timeout_s <= 0 or base in _SERVING:
        return
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        while True:
            try:
                r = await http.get(f"{base}/models", headers=headers)
                if r.status_code == 200:
                    _SERVING.add(base)
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.monotonic() + interval_s > deadline:
                raise EndpointError(
                    f"{role} endpoint {redact_uri(base)} did not serve within {timeout_s:g} s of the trainer's start "
                    f"(last: {last}); see the server's log",
                    kind=FaultKind.CONNECTION_REFUSED,
                    role=role,
                )
            await asyncio.sleep(interval_s)


def wait_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The start-up wait the launcher handed this process (`LONGHAUL_SERVER_WAIT_S`, seconds); 0 when unset or not
    a finite non-negative number (then nobody waits)."""
    raw = (os.environ if environ is None else environ).get(ENV_SERVER_WAIT_S, "")
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0
