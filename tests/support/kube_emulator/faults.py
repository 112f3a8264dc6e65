"""Fault injection for the test API server: error answers, hung or reset requests, expired and dropped watches.

A rule is written `METHOD:PLURAL=FAULT[xCOUNT]` (command line `--fault`, repeatable, or the control endpoint):

- METHOD: `GET` (get and list), `WATCH` (a GET with `watch=true`), `POST`, `PUT`, `PATCH`, `DELETE` or `*`;
- PLURAL: a resource's plural (`jobs`: the object and its subresources, like `--delay`), `PLURAL/SUB` for one
  subresource only (`experiments/status`) or `*`; non-resource paths (discovery, /version, OpenAPI) are never hit;
- FAULT: an HTTP status (answered as a k8s `Status`; the request is not performed) with these specifics —
  `409` on POST: the object IS created (by "another writer") and the answer is `409 AlreadyExists`, the race a
  client must adopt from; on other methods `409 Conflict` (a concurrent modification won) · `410` on WATCH: the
  stream opens and sends one `ERROR` event `410 Expired` ("too old resource version"), as kube-apiserver does,
  elsewhere `410 Gone` · `429`: with a `Retry-After` header (and `details.retryAfterSeconds`) · anything else
  (`500`, `503`, `504`…): the status with its usual reason;
  or `timeout`: no answer for `hold` seconds, then the connection is closed, the request not performed (the
  client's own timeout fires first) · `reset`: the connection is closed at once without an answer;
- COUNT: fault the first COUNT matching requests, then let them through (default: every matching request).

The first matching rule that has faults left decides. Every rule counts what it injected and what it let through
(`seen`: time and outcome of each matching request), so tests can report figures and check retry spacing.
Requests whose User-Agent starts with one of `exempt_agents` (e.g. `kubectl`, the test's own client) are never
faulted nor counted, so a test can act and look while the system under test suffers.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

METHODS = {"GET", "WATCH", "POST", "PUT", "PATCH", "DELETE", "*"}
_RULE = re.compile(
    r"^(?P<method>[A-Za-z*]+):(?P<plural>[a-z0-9.*-]+(?:/[a-z]+)?)=(?P<fault>[0-9]{3}|timeout|reset)"
    r"(?:x(?P<count>[0-9]+))?$"
)
#: Reasons kube-apiserver gives with these codes.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}
#: At most this many `seen` entries per rule (the counters keep counting).
SEEN_LIMIT = 1000


@dataclass
class FaultRule:
    method: str
    plural: str
    fault: str  # "409", "429", …, "timeout" or "reset"
    count: int | None = None  # None: every matching request
    injected: int = 0
    passed: int = 0
    seen: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), "fault" | "pass")

    @property
    def spec(self) -> str:
        return f"{self.method}:{self.plural}={self.fault}" + (f"x{self.count}" if self.count is not None else "")

    @property
    def status(self) -> int | None:
        return int(self.fault) if self.fault.isdigit() else None

    def matches(self, method: str, plural: str, subresource: str | None) -> bool:
        if self.method not in ("*", method):
            return False
        if self.plural == "*":
            return True
        want, _, want_sub = self.plural.partition("/")
        return want == plural and (not want_sub or want_sub == subresource)

    def exhausted(self) -> bool:
        return self.count is not None and self.injected >= self.count

    def note(self, outcome: str) -> None:
        if outcome == "fault":
            self.injected += 1
        else:
            self.passed += 1
        if len(self.seen) < SEEN_LIMIT:
            self.seen.append((time.time(), outcome))

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "injected": self.injected,
            "passed": self.passed,
            "remaining": None if self.count is None else self.count - self.injected,
            "seen": [{"t": t, "outcome": o} for t, o in self.seen],
        }


def parse_rule(text: str) -> FaultRule:
    """`POST:jobs=500x2` → FaultRule; ValueError with the expected form otherwise."""
    m = _RULE.match(text.strip())
    if not m or m["method"].upper() not in METHODS:
        raise ValueError(
            f"bad fault rule {text!r}: expected METHOD:PLURAL=FAULT[xCOUNT], METHOD one of "
            f"{', '.join(sorted(METHODS))}, FAULT an HTTP status, 'timeout' or 'reset' "
            "(e.g. POST:jobs=500x2, WATCH:experiments=410x1, PATCH:experiments/status=409)"
        )
    count = int(m["count"]) if m["count"] is not None else None
    return FaultRule(method=m["method"].upper(), plural=m["plural"], fault=m["fault"], count=count)


@dataclass
class Faults:
    """The rules and options of one server, and what it injected."""

    rules: list[FaultRule] = field(default_factory=list)
    #: Seconds after which every watch stream is cut (connection closed without ending the stream); None: never.
    drop_watches_s: float | None = None
    #: The Retry-After of 429 answers (seconds).
    retry_after_s: int = 1
    #: How long a `timeout` fault holds the request before closing the connection (seconds).
    hold_s: float = 30.0
    #: User-Agent prefixes never faulted (the test's own tools).
    exempt_agents: tuple[str, ...] = ()
    dropped_watches: int = 0
    #: Every answered resource request: "METHOD plural[/sub] status" → count (WATCH for watch requests).
    answers: dict[str, int] = field(default_factory=dict)

    def exempt(self, agent: str) -> bool:
        return any(agent.startswith(prefix) for prefix in self.exempt_agents)

    def pick(self, method: str, plural: str, subresource: str | None, agent: str = "") -> FaultRule | None:
        """The rule that faults this request (and count it), or None (and count it as let through)."""
        if self.exempt(agent):
            return None
        matching = [r for r in self.rules if r.matches(method, plural, subresource)]
        for rule in matching:
            if not rule.exhausted():
                rule.note("fault")
                return rule
        for rule in matching:
            rule.note("pass")
        return None

    def answered(self, method: str, plural: str, subresource: str | None, status: int, agent: str = "") -> None:
        if self.exempt(agent):
            return
        key = f"{method} {plural}{'/' + subresource if subresource else ''} {status}"
        self.answers[key] = self.answers.get(key, 0) + 1

    def configure(self, doc: dict[str, Any]) -> None:
        """Apply a control document: {"rules": [...], "drop_watches_s", "retry_after_s", "hold_s", "exempt_agents"}
        (any subset).

        `rules` replaces all rules (their counters start at 0); `"reset_counts": true` also clears `answers` and
        `dropped_watches`."""
        if "rules" in doc:
            self.rules = [parse_rule(r) for r in doc["rules"] or []]
        if "drop_watches_s" in doc:
            self.drop_watches_s = float(doc["drop_watches_s"]) if doc["drop_watches_s"] else None
        if "retry_after_s" in doc:
            self.retry_after_s = int(doc["retry_after_s"])
        if "hold_s" in doc:
            self.hold_s = float(doc["hold_s"])
        if "exempt_agents" in doc:
            self.exempt_agents = tuple(doc["exempt_agents"] or ())
        if doc.get("reset_counts"):
            self.answers.clear()
            self.dropped_watches = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": [r.to_dict() for r in self.rules],
            "drop_watches_s": self.drop_watches_s,
            "retry_after_s": self.retry_after_s,
            "hold_s": self.hold_s,
            "exempt_agents": list(self.exempt_agents),
            "dropped_watches": self.dropped_watches,
            "answers": dict(sorted(self.answers.items())),
        }
