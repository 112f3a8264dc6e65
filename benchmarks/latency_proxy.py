"""The user simulator's reply time for benchmarks/bench_async.py: a seeded lognormal delay and an HTTP reverse proxy
that holds every request for one draw before forwarding it unchanged.

Lognormal because an LLM reply's latency is a product of positive factors (tokens generated × time per token ×
queueing and batching slowdowns), so its logarithm is roughly normal: right-skewed with a long tail — most replies
near the median, a few many times slower — which is what makes a synchronous step wait for its slowest
conversation. It stands in for a 72B simulator's replies on GPU.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from longhaul.render.plan import LOOPBACK

QUANTILES = (0.5, 0.9, 0.99)
#: Headers that belong to one connection, not to the message (RFC 9110 §7.6.1), and the ones aiohttp recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

# ------------------------------------------------------------------------------------------------------------
# Latency: a lognormal with a given median and log-standard deviation (pure)


def lognormal_quantile(median: float, sigma: float, p: float) -> float:
    """The `p` quantile of a lognormal with median `median` and log-standard deviation `sigma`."""
    return median * math.exp(sigma * NormalDist().inv_cdf(p))


def sample_latencies(median: float, sigma: float, n: int, seed: int) -> np.ndarray:
    """`n` delays (seconds) from the lognormal, as `LatencySampler(median, sigma, seed)` draws them one by one."""
    sampler = LatencySampler(median, sigma, seed)
    return np.array([sampler() for _ in range(n)])


def empirical_quantiles(values: Sequence[float], ps: Sequence[float] = QUANTILES) -> dict[str, float]:
    """`{"p50": …, "p90": …}` of `values` (empty: nothing)."""
    if len(values) == 0:
        return {}
    qs = np.quantile(np.asarray(values, dtype=float), ps)
    return {f"p{round(p * 100):g}": float(q) for p, q in zip(ps, qs, strict=True)}


def theory_quantiles(median: float, sigma: float, ps: Sequence[float] = QUANTILES) -> dict[str, float]:
    """The lognormal's own quantiles, keyed as `empirical_quantiles` keys them."""
    return {f"p{round(p * 100):g}": lognormal_quantile(median, sigma, p) for p in ps}


class LatencySampler:
    """Per-request delays from a seeded lognormal (`median` seconds, log-standard deviation `sigma`)."""

    def __init__(self, median: float, sigma: float, seed: int) -> None:
        if median <= 0 or sigma < 0:
            raise ValueError(f"lognormal needs median > 0 and sigma ≥ 0 (got {median}, {sigma})")
        self.median, self.sigma, self.seed = median, sigma, seed
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        """The next delay (seconds)."""
        with self._lock:
            return float(self._rng.lognormal(math.log(self.median), self.sigma))


# ------------------------------------------------------------------------------------------------------------
# The latency proxy: an aiohttp reverse proxy on its own event loop thread


class LatencyProxy:
    """An HTTP reverse proxy on 127.0.0.1 that holds every request for `delay()` seconds, then forwards it to
    `upstream` (`http://host:port`) unchanged — method, path and query, headers, body — and returns the upstream's
    status, headers and body as they came (not decompressed). Every delay drawn is kept in `delays`. Use as a
    context manager, or `start()` / `stop()`; the OpenAI root of the proxied server is `base_url + "/v1"`."""

    def __init__(self, upstream: str, delay: Callable[[], float], host: str = LOOPBACK, port: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay = delay
        self.host, self.port = host, port
        self.delays: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._session: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LatencyProxy:
        """Bind, serve on a daemon thread, return once the port is listening."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop)
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while self._runner is None or not self._runner.sites:
            if time.monotonic() > deadline:
                raise RuntimeError("latency proxy did not start within 30 s")
            time.sleep(0.02)
        return self

    async def _serve(self, sock: socket.socket) -> None:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0),
        )
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def _forward(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        delay = self.delay()
        self.delays.append(delay)
        body = await request.read()
        await asyncio.sleep(delay)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            async with self._session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body
            ) as r:
                payload = await r.read()
                out = {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP}
                return web.Response(status=r.status, body=payload, headers=out)
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"latency proxy: upstream {self.upstream}: {exc}")

    def stop(self) -> None:
        """Close the listener and the upstream connections, end the thread; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        loop.close()
