"""The operator's API client retries what is safe to retry — 429 (after its Retry-After), 5xx, timeouts and lost
connections — with bounded, jittered exponential back-off, and adopts objects whose creation answer was lost."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from longhaul.k8s.api import ApiError, KubeApi, RetryPolicy, retryable

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "run-grpo", "namespace": "ns"}, "spec": {}}
JOBS = "/apis/batch/v1/namespaces/ns/jobs"
Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def status(code: int, reason: str, headers: dict[str, str] | None = None, **details: Any) -> httpx.Response:
    return httpx.Response(
        code,
        headers=headers,
        json={"kind": "Status", "code": code, "reason": reason, "message": f"{reason} (test)", "details": details},
    )


class Server:
    """A scripted server: answers (responses, or exceptions raised as transport failures) in order, then 200s."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, str]] = []
        self.sleeps: list[float] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        if not self.answers:
            return httpx.Response(200, json={"kind": "Job", "metadata": {"name": "ok"}, "items": []})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer

    def api(self, policy: RetryPolicy | None = None) -> KubeApi:
        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        client = httpx.AsyncClient(base_url="http://api.test", transport=httpx.MockTransport(self.handle))
        return KubeApi(client, retry=policy or RetryPolicy(), sleep=sleep)


async def test_5xx_answers_are_retried_with_growing_jittered_backoff() -> None:
    server = Server(status(503, "ServiceUnavailable"), status(500, "InternalError"), status(502, "BadGateway"))
    api = server.api()
    assert (await api.get("batch/v1", "Job", "ns", "run-grpo"))["metadata"]["name"] == "ok"
    assert len(server.requests) == 4 and api.retries == 3
    policy = RetryPolicy()
    for n, slept in enumerate(server.sleeps, start=1):
        assert 0 <= slept <= policy.initial_s * 2**n


async def test_429_waits_for_the_servers_retry_after() -> None:
    server = Server(
        status(429, "TooManyRequests", {"Retry-After": "2"}),
        status(429, "TooManyRequests", retryAfterSeconds=3),  # the old style: only in the Status
        status(429, "TooManyRequests", {"Retry-After": "3600"}),
    )  # capped
    await server.api().list("batch/v1", "Job", "ns", "a=b")
    assert server.sleeps == [2.0, 3.0, RetryPolicy().max_retry_after_s]
    assert len(server.requests) == 4


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.ConnectError("connection refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ],
    ids=["read-timeout", "connect-timeout", "refused", "hung-up"],
)
async def test_timeouts_and_lost_connections_are_retried(failure: Exception) -> None:
    server = Server(failure)
    api = server.api()
    await api.patch_status("longhaul.dev/v1alpha1", "Experiment", "ns", "e", {"phase": "Pending"})
    assert server.requests == [("PATCH", "/apis/longhaul.dev/v1alpha1/namespaces/ns/experiments/e/status")] * 2
    assert api.retries == 1


async def test_retries_are_bounded_by_attempts_and_the_last_error_is_raised(caplog: pytest.LogCaptureFixture) -> None:
    policy = RetryPolicy(attempts=4)
    server = Server(*[status(500, "InternalError")] * 10)
    caplog.set_level(logging.WARNING, logger="longhaul.k8s.api")
    with pytest.raises(ApiError) as err:
        await server.api(policy).get("batch/v1", "Job", "ns", "run-grpo")
    assert err.value.status == 500 and len(server.requests) == 4 and len(server.sleeps) == 3
    assert "failed (500 InternalError); retry 1/3" in caplog.text and "retry 3/3" in caplog.text


async def test_retries_are_bounded_by_the_deadline() -> None:
    server = Server(*[httpx.ReadTimeout("slow")] * 10)
    with pytest.raises(httpx.ReadTimeout):
        await server.api(RetryPolicy(deadline_s=0)).get("batch/v1", "Job", "ns", "run-grpo")
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (status(404, "NotFound"), None),
        (status(403, "Forbidden"), 403),
        (status(422, "Invalid"), 422),
        (status(400, "BadRequest"), 400),
        (status(410, "Expired"), 410),
    ],
    ids=["404", "403", "422", "400", "410"],
)
async def test_client_errors_are_not_retried(answer: httpx.Response, outcome: int | None) -> None:
    server = Server(answer)
    api = server.api()
    if outcome is None:
        assert await api.get("batch/v1", "Job", "ns", "x") is None
    else:
        with pytest.raises(ApiError) as err:
            await api.get("batch/v1", "Job", "ns", "x")
        assert err.value.status == outcome
    assert len(server.requests) == 1 and server.sleeps == []


async def test_conflict_is_retried_on_a_patch_only() -> None:
    assert retryable("PATCH", ApiError(409, "Conflict", "modified"))
    assert not retryable("POST", ApiError(409, "AlreadyExists", "exists"))
    assert not retryable("PUT", ApiError(409, "Conflict", "stale resourceVersion"))
    server = Server(status(409, "Conflict"))
    await server.api().patch_status("longhaul.dev/v1alpha1", "Experiment", "ns", "e", {"phase": "Running"})
    assert len(server.requests) == 2


async def test_a_create_whose_answer_was_lost_is_adopted() -> None:
    """The POST reaches the server but its answer times out; the retried POST gets 409 → the stored Job."""
    stored: dict[str, Any] = {}

    def write_then_time_out(request: httpx.Request) -> httpx.Response:
        stored.update(json.loads(request.content), status={"active": 1})
        raise httpx.ReadTimeout("the answer was lost")

    def get(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=stored)

    server = Server(write_then_time_out, status(409, "AlreadyExists"), get)
    obj, created = await server.api().create(JOB)
    assert not created and obj["status"] == {"active": 1}
    assert server.requests == [("POST", JOBS), ("POST", JOBS), ("GET", f"{JOBS}/run-grpo")]


async def test_a_409_without_the_object_creates_again_a_bounded_number_of_times() -> None:
    server = Server(
        status(409, "Conflict"), status(404, "NotFound"), lambda r: httpx.Response(201, json=json.loads(r.content))
    )
    obj, created = await server.api().create(JOB)
    assert created and obj["metadata"]["name"] == "run-grpo"
    server = Server(*[status(409, "Conflict"), status(404, "NotFound")] * 3)
    with pytest.raises(ApiError, match="409 three times"):
        await server.api().create(JOB)
    assert [m for m, _ in server.requests] == ["POST", "GET"] * 3


async def test_a_delete_sends_its_propagation_and_a_lost_answer_reads_as_already_gone() -> None:
    """The DELETE reaches the server but its answer times out; the retried DELETE gets 404 → False (gone)."""
    policies: list[str | None] = []

    def delete_then_time_out(request: httpx.Request) -> httpx.Response:
        policies.append(request.url.params.get("propagationPolicy"))
        raise httpx.ReadTimeout("the answer was lost")

    server = Server(delete_then_time_out, status(404, "NotFound"))
    assert await server.api().delete("batch/v1", "Job", "ns", "run-grpo", propagation="Foreground") is False
    assert server.requests == [("DELETE", f"{JOBS}/run-grpo")] * 2 and policies == ["Foreground"]
    assert await Server().api().delete("batch/v1", "Job", "ns", "run-grpo", propagation="Foreground") is True
    with pytest.raises(ApiError, match="403"):
        await Server(status(403, "Forbidden")).api().delete("batch/v1", "Job", "ns", "x", propagation="Foreground")


def test_backoff_doubles_up_to_its_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(initial_s=0.25, max_backoff_s=2.0, max_retry_after_s=10)
    assert [policy.backoff(n, None, rand=lambda: 1.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert policy.backoff(1, ApiError(429, "TooManyRequests", "", retry_after=4)) == 4
    assert policy.backoff(1, ApiError(429, "TooManyRequests", "", retry_after=60)) == 10


def test_from_connection_info_sets_the_request_timeout() -> None:
    class Info:
        server, token, scheme, insecure = "http://127.0.0.1:1", "t", "Bearer", False
        username = ca_path = ca_data = certificate_path = certificate_data = None

    api = KubeApi.from_connection_info(Info(), timeout=2.5, retry=RetryPolicy(attempts=2))
    assert api.client.timeout.read == 2.5 and api.client.timeout.connect == 2.5 and api.retry.attempts == 2
    assert api.client.headers["Authorization"] == "Bearer t"
    assert api.client.headers["User-Agent"] == "longhaul-operator"
