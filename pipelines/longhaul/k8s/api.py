"""A small async Kubernetes REST client (httpx) for the operator: create/get/list/patch/delete of any kind.

The credentials come from kopf's login (`kopf.ConnectionInfo`), so kopf and this client talk to the same
server the same way. Bodies are plain dicts: what `render_kubernetes` returned is what gets sent.

Every request is retried (tenacity, bounded by `RetryPolicy`) when the server asks to slow down (429, waiting its
`Retry-After`), fails transiently (500, 502, 503, 504), or the request times out or loses its connection
(exponential back-off with jitter). Retrying is safe for every call this client makes: GET and LIST read, the
status PATCH is a merge patch without precondition (sending it twice gives the same object), and a POST that
reached the server before its answer was lost comes back as 409 AlreadyExists, which `create` adopts; a DELETE
whose answer was lost comes back as 404, which `delete` reports as "already gone". A 409
Conflict on a PATCH (a concurrent writer won) is retried too. Other 4xx answers are the caller's business.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity

log = logging.getLogger(__name__)

#: Plurals of the kinds the operator reads and writes.
PLURALS = {
    "ConfigMap": "configmaps",
    "Job": "jobs",
    "Event": "events",
    "RayJob": "rayjobs",
    "JobSet": "jobsets",
    "Workload": "workloads",
    "Experiment": "experiments",
}


class ApiError(Exception):
    """A non-2xx answer: HTTP status, the server's reason and message (and its Retry-After, in seconds)."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message, self.retry_after = status, reason, message, retry_after


#: The User-Agent of the operator's own requests (kopf's say `kopf/<version>`): tells them apart in audit logs.
USER_AGENT = "longhaul-operator"
#: HTTP statuses retried on every method: the server is overloaded (429) or failed transiently (5xx).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Transport failures retried on every method: timeouts, refused/reset connections, a server that hung up.
RETRY_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retries of one request: at most `attempts` tries within `deadline_s` seconds.

    The wait before retry n (n = 1, 2, …) is random in [0, min(max_backoff_s, initial_s * 2**n)] (exponential
    back-off, full jitter), or the server's Retry-After (at most `max_retry_after_s`) when it sent one.
    """

    attempts: int = 6
    initial_s: float = 0.25
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 30.0
    deadline_s: float = 90.0

    def backoff(self, retry: int, exc: BaseException | None, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `retry` (1-based) after `exc`."""
        after = getattr(exc, "retry_after", None)
        if after is not None:
            return max(0.0, min(float(after), self.max_retry_after_s))
        return rand() * min(self.max_backoff_s, self.initial_s * 2**retry)


def retryable(method: str, exc: BaseException) -> bool:
    """Whether a failed request may be sent again (see the module docstring for why each is safe)."""
    if isinstance(exc, ApiError):
        return exc.status in RETRY_STATUSES or (exc.status == 409 and exc.reason == "Conflict" and method == "PATCH")
    return isinstance(exc, RETRY_ERRORS)


def _retry_after(resp: httpx.Response, body: dict[str, Any]) -> float | None:
    """The server's Retry-After (seconds; header, else `details.retryAfterSeconds`), or None."""
    value: Any = resp.headers.get("Retry-After") or (body.get("details") or {}).get("retryAfterSeconds")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):  # an HTTP date: not sent by kube-apiserver; use our own back-off
        return None


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    """REST path of a collection or object (`/api/v1/...` for the core group, `/apis/<g>/<v>/...` otherwise)."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}" if namespace else f"{base}/{PLURALS[kind]}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class KubeApi:
    """Async client; one per operator process. `retry` bounds the retries of each request; `sleep` is for tests."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        #: Requests retried since the client was made (for logs and tests).
        self.retries = 0

    @classmethod
    def from_connection_info(cls, info: Any, *, timeout: float = 30.0, retry: RetryPolicy | None = None) -> KubeApi:
        """Build from a `kopf.ConnectionInfo` (server, CA, token or client certificate, insecure flag).

        `timeout`: seconds for connecting, and for each read and write of one request (then it is retried)."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if getattr(info, "token", None):
            headers["Authorization"] = f"{getattr(info, 'scheme', None) or 'Bearer'} {info.token}"
        elif getattr(info, "username", None):
            basic = base64.b64encode(f"{info.username}:{info.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        verify: Any = True
        if getattr(info, "insecure", False):
            verify = False
        elif getattr(info, "ca_path", None) or getattr(info, "ca_data", None):
            ctx = ssl.create_default_context(
                cafile=info.ca_path or None, cadata=_text(info.ca_data) if info.ca_data else None
            )
            verify = ctx
        cert = None
        if getattr(info, "certificate_path", None) or getattr(info, "certificate_data", None):
            cert = (
                _file(info.certificate_path, info.certificate_data),
                _file(info.private_key_path, info.private_key_data),
            )
            if isinstance(verify, ssl.SSLContext):
                verify.load_cert_chain(*cert)
                cert = None
        client = httpx.AsyncClient(
            base_url=info.server,
            headers=headers,
            verify=verify,
            cert=cert,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
        )
        return cls(client, retry=retry)

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        """One request, retried within `self.retry` (see `retryable`); the last failure is raised."""
        policy = self.retry

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return policy.backoff(state.attempt_number, exc)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            self.retries += 1
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            log.warning(
                "%s %s failed (%s); retry %d/%d in %.2f s",
                method,
                path,
                _describe(exc),
                state.attempt_number,
                policy.attempts - 1,
                delay,
            )

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(lambda exc: retryable(method, exc)),
            stop=tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_after_delay(policy.deadline_s),
            wait=wait,
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._send(method, path, json=json, content_type=content_type, params=params)
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    async def _send(
        self, method: str, path: str, *, json: Any, content_type: str | None, params: dict[str, str] | None
    ) -> Any:
        headers = {"Content-Type": content_type} if content_type else {}
        resp = await self.client.request(method, path, json=json, params=params, headers=headers)
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"reason": resp.reason_phrase, "message": resp.text[:500]}
            if not isinstance(body, dict):
                body = {"reason": resp.reason_phrase, "message": str(body)[:500]}
            raise ApiError(
                resp.status_code, body.get("reason", ""), body.get("message", ""), retry_after=_retry_after(resp, body)
            )
        return resp.json()

    async def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create `obj`; when it exists already (409) return the stored one. Returns (object, created).

        A 409 whose object cannot be read back (deleted in between, or a Conflict that was no AlreadyExists) is
        tried again, twice at most."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        for attempt in range(3):
            try:
                return await self._call("POST", path, json=obj), True
            except ApiError as exc:
                if exc.status != 409:
                    raise
            existing = await self.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            if existing is not None:
                return existing, False
            log.warning(
                "POST %s: 409 for %s %s, which does not exist; creating again (%d/2)",
                path,
                obj["kind"],
                meta["name"],
                attempt + 1,
            )
        raise ApiError(
            409,
            "Conflict",
            f"{obj['kind']} {meta['name']}: the server answered 409 three times but the "
            "object does not exist; retry later",
        )

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]:
        try:
            out = await self._call(
                "GET", resource_path(api_version, kind, namespace), params={"labelSelector": label_selector}
            )
        except ApiError as exc:
            if exc.status == 404:  # the kind is not served (e.g. no KubeRay CRDs)
                return []
            raise
        return out.get("items", [])

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str, *, propagation: str) -> bool:
        """Delete one object with `propagation` (Foreground, Background or Orphan: what happens to its dependents,
        e.g. a Job's pods); False when it did not exist (404)."""
        try:
            await self._call(
                "DELETE", resource_path(api_version, kind, namespace, name), params={"propagationPolicy": propagation}
            )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch of the status subresource."""
        return await self._call(
            "PATCH",
            resource_path(api_version, kind, namespace, name, "status"),
            json={"status": status},
            content_type="application/merge-patch+json",
        )


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.reason}" + (
            f", Retry-After {exc.retry_after:g} s" if exc.retry_after is not None else ""
        )
    return type(exc).__name__ if exc is not None else "?"


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


def _file(path: str | None, data: Any) -> str:
    if path:
        return path
    f = tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem")  # noqa: SIM115 - lives as long as the process
    f.write(data if isinstance(data, bytes) else str(data).encode())
    f.close()
    return f.name
