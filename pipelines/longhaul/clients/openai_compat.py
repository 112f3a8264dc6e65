"""A small async client for OpenAI-compatible `/chat/completions` with bounded retries.

Timeouts, connection failures, HTTP 429 and 5xx are retried with exponential backoff; a failure that survives
the retries raises `EndpointError` naming the endpoint, the attempts and the last error. It is never turned
into an empty answer (an evaluation or a training batch must stop, not record a zero reward). A prompt longer
than the server's context window raises `ContextOverflowError` (the runner ends that episode).

Building a client is cheap (its connection pools share one TLS context per process), but its pools are bound
to the event loop that first uses them: code that runs many short episodes on one loop (the veRL agent-loop
worker) takes `shared_chat_client(...)`, one client per (event loop, endpoint), instead of building its own.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import weakref
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_attempt, wait_exponential

from longhaul.envs.runner import ContextOverflowError, PolicyEndpointError

_OVERFLOW_HINTS = ("maximum context length", "context length", "too long", "max_model_len", "exceeds the model")


class EndpointError(PolicyEndpointError):
    """An endpoint failed after its retries, or refused the request (4xx other than context overflow)."""


class _Raw(str):
    """Pre-encoded JSON spliced into a request body as is."""


def _encode(payload: dict[str, Any]) -> bytes:
    raw = {k: v for k, v in payload.items() if isinstance(v, _Raw)}
    body = json.dumps({k: v for k, v in payload.items() if k not in raw})
    if raw:
        body = body[:-1] + "".join(f", {json.dumps(k)}: {v}" for k, v in raw.items()) + "}"
    return body.encode()


class _Retryable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry. `attempts` counts the first try."""

    attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    timeout_s: float = 300.0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process. httpx builds (and loads the CA bundle into) a new one for every
    `AsyncClient` otherwise: ~20 ms each, ~0.7 s for a client's 32 pools, all of it blocking the event loop."""
    return httpx.create_ssl_context()


class ChatClient:
    """POST `{base_url}/chat/completions` for one model. `base_url` is the OpenAI-style root, e.g.
    `http://127.0.0.1:8000/v1`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        max_connections: int = 512,
        shard_size: int = 16,
        role: str = "policy",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.role = role
        self.retry = retry or RetryPolicy()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpcore's pool scans every connection for every queued request (quadratic in the pool size); with
        # hundreds of concurrent episodes that dominated CPU. Several small pools, least-busy first, keep it flat.
        shards = max(1, -(-max_connections // shard_size))
        per_shard = -(-max_connections // shards)
        self._pools = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(self.retry.timeout_s, connect=min(30.0, self.retry.timeout_s)),
                limits=httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard),
                headers=headers,
                transport=transport,
                verify=_tls_context(),
            )
            for _ in range(shards)
        ]
        self._in_flight = [0] * shards
        self._tools_cache: tuple[list[dict[str, Any]], str] | None = None
        self.requests_sent = 0
        self.retries = 0

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _tools_json(self, tools: list[dict[str, Any]]) -> str:
        # The 14 tool schemas are the same object for every turn: encode them once, not per request.
        cached = self._tools_cache
        if cached is None or cached[0] is not tools:
            cached = self._tools_cache = (tools, json.dumps(tools))
        return cached[1]

    async def _once(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.requests_sent += 1
        i = min(range(len(self._pools)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            resp = await self._pools[i].post(self.url, content=_encode(payload),
                                             headers={"Content-Type": "application/json"})
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timeout after {self.retry.timeout_s:g}s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"connection error: {type(exc).__name__}: {exc}") from exc
        finally:
            self._in_flight[i] -= 1
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code >= 400:
            body = resp.text[:500]
            if resp.status_code in (400, 413) and any(h in body.lower() for h in _OVERFLOW_HINTS):
                raise ContextOverflowError(f"{self.role} endpoint {self.url}: prompt too long: {body}")
            raise EndpointError(
                f"{self.role} endpoint {self.url} (model {self.model!r}) refused the request: HTTP {resp.status_code}: "
                f"{body}. Check the base URL (it must end with the OpenAI root, e.g. /v1) and the served model name."
            )
        try:
            data = resp.json()
            data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retryable(f"malformed response body: {resp.text[:300]}") from exc
        return data

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """One chat completion (the raw response JSON). `params` go into the request body (max_tokens,
        temperature, top_p, seed, tools, tool_choice, ...); None values are dropped."""
        payload = {"model": self.model, "messages": messages, **{k: v for k, v in params.items() if v is not None}}
        tools = payload.pop("tools", None)
        if tools is not None:
            payload["tools"] = _Raw(self._tools_json(tools))
        r = self.retry
        retrying = AsyncRetrying(
            stop=stop_after_attempt(r.attempts),
            wait=wait_exponential(multiplier=r.backoff_initial_s, max=r.backoff_max_s),
            retry=retry_if_exception_type(_Retryable),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        self.retries += 1
                    return await self._once(payload)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise EndpointError(
                f"{self.role} endpoint {self.url} (model {self.model!r}) failed after {r.attempts} attempts: {last}. "
                "The run stops here instead of recording a zero reward; check that the server is up and healthy."
            ) from last
        raise AssertionError("unreachable")  # pragma: no cover


_SHARED: dict[tuple[Any, ...], tuple[weakref.ReferenceType[asyncio.AbstractEventLoop], ChatClient]] = {}


def shared_chat_client(
    base_url: str, model: str, *, api_key: str | None = None, role: str = "policy", retry: RetryPolicy | None = None
) -> ChatClient:
    """The process's client for this endpoint on the running event loop, built on first use and reused by every
    later caller on that loop (its connections stay open between episodes). Must be called from a coroutine."""
    loop = asyncio.get_running_loop()
    key = (id(loop), base_url.rstrip("/"), model, api_key, role, retry)
    entry = _SHARED.get(key)
    if entry is not None and entry[0]() is loop:
        return entry[1]
    for k in [k for k, (ref, _) in _SHARED.items() if (lp := ref()) is None or lp.is_closed()]:
        del _SHARED[k]  # clients of finished loops: their pools cannot be used (or closed) from another loop
    client = ChatClient(base_url, model, api_key=api_key, retry=retry, role=role)
    _SHARED[key] = (weakref.ref(loop), client)
    return client
