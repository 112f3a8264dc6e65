"""A small async client for OpenAI-compatible `/chat/completions` with bounded retries.

Every way an endpoint can fail is classified (`FaultKind`) and handled in one place:

- retried: no whole answer within `RetryPolicy.timeout_s` (`timeout`); connection refused (`connection_refused`),
  reset or closed mid-answer (`connection_reset`), other transport errors (`transport`); HTTP 408, 429 and 5xx
  (`http_408`, `http_429`, `http_5xx`); a body that is not UTF-8 (`non_utf8`); truncated or malformed JSON
  (`invalid_json`); JSON that is not a chat completion — no `choices` list, `message` not an object, `content` not
  a string, `tool_calls` not a list of `{"function": {"name": …}}`, non-integer `usage` (`malformed_response`);
  `choices: []` (`empty_choices`); no text where text is required, `chat(expect_text=True)` (`empty_reply`);
- not retried: HTTP 400/413 saying the prompt is too long → `ContextOverflowError` (the runner ends the episode
  `context_overflow`); any other HTTP 4xx → `EndpointError` (`http_4xx`: a wrong URL or model name).

The retry budget is `RetryPolicy` (the only place it is defined; its defaults are what training, evaluation and
`longhaul eval` use unless told otherwise): `attempts` tries (the first included), exponential backoff between
them, `timeout_s` per try (the whole answer, not just each read). A fault that survives the budget raises
`EndpointError` naming the endpoint, the attempts, the fault kind (`.kind`) and the last error. It is never turned
into an empty answer: what becomes of the episode is the caller's explicit decision (veRL's agent loop drops the
prompt group and records `user_simulator_error`; evaluation stops). Tool calls whose `arguments` are not valid
JSON are the policy's output, not an endpoint fault: they reach the runner as calls with `parse_error` set, and
the environment answers them with an error observation (`longhaul.clients.policy`). Every faulty try is counted
per kind in `ChatClient.faults`.

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
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_attempt, wait_exponential

from longhaul.envs.protocols import ContextOverflowError, PolicyEndpointError
from longhaul.redact import redact_uri

_OVERFLOW_HINTS = ("maximum context length", "context length", "too long", "max_model_len", "exceeds the model")


class FaultKind(StrEnum):
    """How an endpoint answer was faulty (module docstring)."""

    TIMEOUT = "timeout"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    TRANSPORT = "transport"
    HTTP_408 = "http_408"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    HTTP_4XX = "http_4xx"
    NON_UTF8 = "non_utf8"
    INVALID_JSON = "invalid_json"
    MALFORMED_RESPONSE = "malformed_response"
    EMPTY_CHOICES = "empty_choices"
    EMPTY_REPLY = "empty_reply"


class EndpointError(PolicyEndpointError):
    """An endpoint failed after its retries, or refused the request (4xx other than context overflow).

    `kind` is the `FaultKind` of the last failed try, `role` the endpoint's role ("policy", "user simulator"),
    `attempts` how many tries were made."""

    def __init__(self, message: str, *, kind: str | None = None, role: str | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.role = role
        self.attempts = attempts


class _Raw(str):
    """Pre-encoded JSON spliced into a request body as is."""


def _encode(payload: dict[str, Any]) -> bytes:
    raw = {k: v for k, v in payload.items() if isinstance(v, _Raw)}
    body = json.dumps({k: v for k, v in payload.items() if k not in raw})
    if raw:
        body = body[:-1] + "".join(f", {json.dumps(k)}: {v}" for k, v in raw.items()) + "}"
    return body.encode()


class _Retryable(Exception):
    def __init__(self, kind: FaultKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RetryPolicy:
    """The retry budget of every OpenAI-compatible endpoint call (module docstring): `attempts` tries (the first
    included), waits growing from `backoff_initial_s` to `backoff_max_s` between them, `timeout_s` for each whole
    answer. Worst case per call: attempts × timeout_s + the waits (defaults: 4 tries, ≤ 20 min, ≈ 3.5 s of waits)."""

    attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    timeout_s: float = 300.0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_completion(data: Any, *, expect_text: bool = False) -> None:
    """Raise `_Retryable` unless `data` is a chat completion the clients can use (module docstring)."""

    def bad(why: str) -> _Retryable:
        return _Retryable(FaultKind.MALFORMED_RESPONSE, f"not a chat completion: {why}")

    if not isinstance(data, dict):
        raise bad(f"the body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise bad(f"'choices' is {type(choices).__name__}, not a list")
    if not choices:
        raise _Retryable(FaultKind.EMPTY_CHOICES, "the answer has no choices ('choices': [])")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise bad("choices[0] is not an object")
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise bad(f"choices[0].message is {type(msg).__name__}, not an object")
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        raise bad(f"choices[0].message.content is {type(content).__name__}, not a string")
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad(f"choices[0].message.tool_calls is {type(calls).__name__}, not a list")
        for i, tc in enumerate(calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad(f"tool_calls[{i}] has no function name")
            if not isinstance(fn.get("arguments"), str | dict | type(None)):
                raise bad(f"tool_calls[{i}].function.arguments is {type(fn.get('arguments')).__name__}")
    usage = data.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise bad("'usage' is not an object")
        for key in ("prompt_tokens", "completion_tokens"):
            if usage.get(key) is not None and not _is_int(usage[key]):
                raise bad(f"usage.{key} is {usage[key]!r}, not an integer")
    if expect_text and not (content or "").strip():
        raise _Retryable(FaultKind.EMPTY_REPLY, "the answer has no text")


def _transport_kind(exc: httpx.TransportError) -> FaultKind:
    if isinstance(exc, httpx.ConnectError):
        cause: BaseException | None = exc
        for _ in range(8):  # httpx → httpcore → OSError → ConnectionRefusedError
            if cause is None or isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
                break
            cause = cause.__cause__ or cause.__context__
        return FaultKind.CONNECTION_REFUSED if cause is not None else FaultKind.TRANSPORT
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError | httpx.CloseError):
        return FaultKind.CONNECTION_RESET
    return FaultKind.TRANSPORT


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
        #: Faulty tries per `FaultKind` (retried or not).
        self.faults: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def shown_url(self) -> str:
        """The URL as messages show it: credentials in it redacted (`longhaul.redact`)."""
        return redact_uri(self.url)

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

    async def _once(self, payload: dict[str, Any], expect_text: bool) -> dict[str, Any]:
        try:
            return await self._attempt(payload, expect_text)
        except _Retryable as exc:
            self.faults[exc.kind] += 1
            raise
        except EndpointError as exc:
            self.faults[exc.kind or FaultKind.HTTP_4XX] += 1
            raise

    async def _attempt(self, payload: dict[str, Any], expect_text: bool) -> dict[str, Any]:
        self.requests_sent += 1
        i = min(range(len(self._pools)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            # The deadline covers the whole answer: httpx's own timeouts are per read, so a server trickling bytes
            # would otherwise hold the episode forever.
            async with asyncio.timeout(self.retry.timeout_s):
                resp = await self._pools[i].post(
                    self.url, content=_encode(payload), headers={"Content-Type": "application/json"}
                )
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise _Retryable(
                FaultKind.TIMEOUT, f"timeout after {self.retry.timeout_s:g}s ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            raise _Retryable(_transport_kind(exc), f"connection error: {type(exc).__name__}: {exc}") from exc
        finally:
            self._in_flight[i] -= 1
        status = resp.status_code
        if status in (408, 429) or status >= 500:
            kind = {408: FaultKind.HTTP_408, 429: FaultKind.HTTP_429}.get(status, FaultKind.HTTP_5XX)
            raise _Retryable(kind, f"HTTP {status}: {resp.text[:300]}")
        if status >= 400:
            body = resp.text[:500]
            if status in (400, 413) and any(h in body.lower() for h in _OVERFLOW_HINTS):
                raise ContextOverflowError(f"{self.role} endpoint {self.shown_url}: prompt too long: {body}")
            raise EndpointError(
                f"{self.role} endpoint {self.shown_url} (model {self.model!r}) refused the request: HTTP {status}: "
                f"{body}. Check the base URL (it must end with the OpenAI root, e.g. /v1) and the served model name.",
                kind=FaultKind.HTTP_4XX,
                role=self.role,
                attempts=1,
            )
        try:
            text = resp.content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Retryable(
                FaultKind.NON_UTF8, f"the body is not UTF-8 ({exc.reason} at byte {exc.start}): {resp.content[:120]!r}"
            ) from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _Retryable(
                FaultKind.INVALID_JSON, f"truncated or malformed JSON body ({exc}): {text[:300]!r}"
            ) from exc
        check_completion(data, expect_text=expect_text)
        return data

    async def chat(self, messages: list[dict[str, Any]], *, expect_text: bool = False, **params: Any) -> dict[str, Any]:
        """One chat completion (the raw response JSON, checked by `check_completion`). `params` go into the request
        body (max_tokens, temperature, top_p, seed, tools, tool_choice, ...); None values are dropped.
        `expect_text`: an answer without text is a fault (the user simulator must always say something)."""
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
                    return await self._once(payload, expect_text)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            kind = getattr(last, "kind", None)
            raise EndpointError(
                f"{self.role} endpoint {self.shown_url} (model {self.model!r}) failed after {r.attempts} attempts: "
                f"{last} (fault: {kind}). The episode is not scored (never a zero reward); check that the server is up "
                "and healthy.",
                kind=kind,
                role=self.role,
                attempts=r.attempts,
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
