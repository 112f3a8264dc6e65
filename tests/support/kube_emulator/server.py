"""A Kubernetes API server for tests: kmock's KubernetesEmulator plus the semantics kubectl, kopf and helm need.

kmock 0.8 provides the HTTP server, request parsing and the assertable request log (`emu.requests`), the
k8s `Status` error rendering and a bundle of built-in resource discovery documents (dumped from k3s). Its
in-memory object handling lacks what our tests depend on (see docs/notes: uids, resourceVersion, generation,
CRD discovery and validation, status subresource, selectors, dry-run, PUT, server-side apply, garbage
collection, discovery fixes). This subclass takes over every Kubernetes request in `_handle` and implements:

- discovery: /version, /api, /apis, /api/v1, /apis/<g>[/<v>] (core groupVersion "v1"; CRDs registered on
  create, unregistered on delete), OpenAPI v3 documents declaring `fieldValidation` (so plain `kubectl apply`
  validates server-side) and carrying CRD schemas (`kubectl explain`);
- objects: uid, resourceVersion (one counter), creationTimestamp, generation (bumped on non-metadata,
  non-status changes), generateName, namespaces (auto-created on first use, like a permissive admission);
- writes: POST, PUT (with resourceVersion preconditions → 409 Conflict), PATCH (merge, JSON, strategic as
  merge, server-side apply incl. create), DELETE (finalizers → deletionTimestamp; ownerReference garbage
  collection: background/foreground cascade, orphan), `?dryRun=All`, `fieldValidation=Strict`;
- the status subresource (main writes ignore status; /status writes change only status);
- custom objects pruned, defaulted and validated against the CRD's openAPIV3Schema → 422 Invalid;
- built-in kinds validated strictly with kubernetes-validate (unknown or mistyped fields → 422);
- list/watch with label and field selectors, resourceVersion resume, timeoutSeconds; Table output for
  `kubectl get` with the CRD's printer columns;
- fault injection (`faults.py`): late answers (`delays`), error answers (409/410/429/5xx), hung or reset
  requests, expired and dropped watches — set at start or through the control endpoint `/emulator/faults`.

Not emulated: authn/authz (RBAC), admission webhooks, controllers (nothing runs Pods: tests patch Job status
as the Job controller would), protobuf bodies, strategic-merge list semantics (lists are replaced).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import gzip
import importlib.resources
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import rendering

from . import patches, schema
from .faults import REASONS, FaultRule, Faults
from .selectors import parse_field_selector, parse_label_selector

K8S_VERSION = "1.32"
#: Built-in kinds validated with kubernetes-validate (those the operator and the chart write).
STRICT_KINDS = {
    ("batch/v1", "Job"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
}
STATUS_SUBRESOURCE_BUILTINS = {"jobs", "deployments", "namespaces", "customresourcedefinitions", "pods"}
#: Test-only control endpoint of the fault injection (GET: rules and counters; PUT/POST: a `Faults.configure` doc).
CONTROL_PATH = "/emulator/faults"


class ApiError(Exception):
    """Rendered as a `Status` body with the HTTP code, like kube-apiserver."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}
        self.headers = headers or {}


class _DropConnection(Exception):
    """Close the client's connection without an answer (fault injection: `timeout`, `reset`)."""


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    verbs: list[str] = field(default_factory=list)
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    subresources: set[str] = field(default_factory=set)
    crd_schema: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gv_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else "/api/v1"

    @property
    def qualified(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def discovery(self) -> list[dict[str, Any]]:
        main = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs,
        }
        if self.short_names:
            main["shortNames"] = self.short_names
        if self.categories:
            main["categories"] = self.categories
        subs = [
            {
                "name": f"{self.plural}/{s}",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }
            for s in sorted(self.subresources)
        ]
        return [main, *subs]


@dataclass
class Request:
    method: str
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    params: dict[str, str]
    headers: dict[str, str]
    text: str


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """The emulator. Use `async with KubeEmulator() as emu, kmock.Server(emu, port=N):` or `serve()`."""

    k8s_version: str = K8S_VERSION
    access_log: bool = False
    #: Fault injection: {("POST", "jobs"): 2.0} answers such requests 2 s late (the write happens first), so a
    #: test can kill a client between the server's write and the client seeing the answer.
    delays: dict[tuple[str, str], float] = attrs.field(factory=dict)
    #: Fault injection: error answers, hung/reset requests, expired and dropped watches (see faults.py).
    faults: Faults = attrs.field(factory=Faults)
    #: Bumped to cut every open watch stream now (control endpoint `{"drop_watches_now": true}`).
    _watch_epoch: int = attrs.field(default=0, init=False)
    #: Bumped on every fault configuration, so open watches re-read `faults.drop_watches_s`.
    _faults_rev: int = attrs.field(default=0, init=False)
    types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    store: dict[tuple[str, str, str | None, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    log: list[tuple[int, tuple[str, str], str, dict[str, Any]]] = attrs.field(factory=list, init=False)
    rv: int = attrs.field(default=1, init=False)
    changed: asyncio.Condition | None = attrs.field(default=None, init=False)
    _validators: dict[tuple[str, str], Any] = attrs.field(factory=dict, init=False)
    _admitted: dict[tuple[Any, ...], dict[str, Any]] = attrs.field(factory=dict, init=False)
    _valid_builtins: set[str] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._load_builtin_types()

    # ----------------------------------------------------------------------------------------------------
    # Type registry

    def _load_builtin_types(self) -> None:
        data = importlib.resources.files("kmock._internal").joinpath("resources.json.gz").read_bytes()
        for doc in json.loads(gzip.decompress(data)):
            gv = doc["groupVersion"]
            group, _, version = gv.rpartition("/")
            entries = doc.get("resources", [])
            subs: dict[str, set[str]] = {}
            for e in entries:
                if "/" in e["name"]:
                    parent, sub = e["name"].split("/", 1)
                    subs.setdefault(parent, set()).add(sub)
            for e in entries:
                if "/" in e["name"]:
                    continue
                self.types[(group, version, e["name"])] = ResourceType(
                    group=group,
                    version=version,
                    plural=e["name"],
                    kind=e["kind"],
                    namespaced=e["namespaced"],
                    singular=e.get("singularName", ""),
                    verbs=e.get("verbs", []),
                    short_names=e.get("shortNames", []),
                    categories=e.get("categories", []),
                    subresources=subs.get(e["name"], set()),
                )

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for ver in spec.get("versions", []):
            if not ver.get("served", True):
                continue
            self.types[(spec["group"], ver["name"], names["plural"])] = ResourceType(
                group=spec["group"],
                version=ver["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", ""),
                verbs=["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                short_names=names.get("shortNames", []),
                categories=names.get("categories", []),
                subresources={"status"} if "status" in (ver.get("subresources") or {}) else set(),
                crd_schema=(ver.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=ver.get("additionalPrinterColumns", []),
            )

    def _unregister_crd(self, crd: dict[str, Any]) -> list[ResourceType]:
        spec = crd["spec"]
        gone = [k for k, t in self.types.items() if t.group == spec["group"] and t.plural == spec["names"]["plural"]]
        return [self.types.pop(k) for k in gone]

    def _type_for(self, group: str, version: str, plural: str) -> ResourceType:
        t = self.types.get((group, version, plural))
        if t is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return t

    # ----------------------------------------------------------------------------------------------------
    # HTTP entry point (kmock parses the request and logs it; we answer it)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        await raw_request.read()
        try:
            request = await rendering.Request._parse(raw_request, id=len(self._requests))
        except ValueError:
            # kmock 0.8's path parser fails on e.g. /api/v1/namespaces; log the request without its k8s fields.
            text = await raw_request.text()
            request = rendering.Request(
                id=len(self._requests),
                raw_request=raw_request,
                url=raw_request.url,
                method=raw_request.method,
                params=dict(raw_request.query),
                headers=dict(raw_request.headers),
                body=await raw_request.read(),
                text=text,
            )
        self._requests.append(request)
        try:
            try:
                response = await self._handle(request)
            except _DropConnection:
                if self.access_log:
                    print(f"{raw_request.method} {raw_request.path_qs} -> connection closed (injected)", flush=True)
                if raw_request.transport is not None:
                    raw_request.transport.close()
                return aiohttp.web.Response(status=499)  # never reaches the client
            if self.access_log:
                extra = f" {getattr(response, 'text', '')[:300]}" if response.status >= 400 else ""
                print(f"{raw_request.method} {raw_request.path_qs} -> {response.status}{extra}", flush=True)
            return response
        except Exception as exc:  # a bug in the emulator: answer 500 with the traceback, keep serving
            import traceback

            return aiohttp.web.json_response(
                _status(500, "InternalError", f"emulator error: {exc!r}", {"traceback": traceback.format_exc()}),
                status=500,
            )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self.changed is None:
            self.changed = asyncio.Condition()
        raw = request._raw_request
        path = request.url.path
        try:
            if path.rstrip("/") == CONTROL_PATH:
                return await self._control(request)
            if (
                raw is not None
                and request.method.value.upper() == "GET"
                and request.params.get("watch") in ("true", "1")
            ):
                req = self._parse(request)
                rule = self.faults.pick("WATCH", req.rtype.plural, req.subresource, _agent(req))
                if rule is not None:
                    return await self._watch_fault(rule, req, raw)
                self.faults.answered("WATCH", req.rtype.plural, req.subresource, 200, _agent(req))
                return await self._watch(req, raw)
            body = await self._dispatch(request, path)
            created = request.method.value.upper() == "POST" and isinstance(body, dict) and body.get("kind") != "Status"
            return aiohttp.web.json_response(
                body, status=201 if created else 200, dumps=lambda o: json.dumps(o, separators=(",", ":"))
            )
        except ApiError as exc:
            return aiohttp.web.json_response(
                _status(exc.code, exc.reason, exc.message, exc.details), status=exc.code, headers=exc.headers or None
            )

    async def _dispatch(self, request: rendering.Request, path: str) -> Any:
        method = request.method.value.upper()
        clean = path.rstrip("/") or "/"
        if method == "GET":
            found = self._serve_static(clean)
            if found is not None:
                return found
        req = self._parse(request)
        agent = _agent(req)
        try:
            rule = self.faults.pick(method, req.rtype.plural, req.subresource, agent)
            if rule is not None:
                await self._fault(rule, req, request)
            async with self._lock:
                result = await self._serve_resource(req, request)
        except ApiError as exc:
            self.faults.answered(method, req.rtype.plural, req.subresource, exc.code, agent)
            raise
        created = method == "POST" and isinstance(result, dict) and result.get("kind") != "Status"
        self.faults.answered(method, req.rtype.plural, req.subresource, 201 if created else 200, agent)
        delay = self.delays.get((method, req.rtype.plural))
        if delay:
            await asyncio.sleep(delay)
        return result

    # ----------------------------------------------------------------------------------------------------
    # Fault injection (faults.py)

    async def _control(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        method = request.method.value.upper()
        if method in ("PUT", "POST"):
            try:
                doc = json.loads(request.text or "{}")
                self.faults.configure(doc)
                if "delays" in doc:  # {"POST:jobs": 2.0, …}: replaces the --delay rules
                    self.delays = {
                        (k.partition(":")[0].upper(), k.partition(":")[2]): float(v)
                        for k, v in (doc["delays"] or {}).items()
                    }
            except (ValueError, TypeError, AttributeError) as exc:
                raise ApiError(400, "BadRequest", str(exc)) from exc
            if doc.get("drop_watches_now"):
                await self.drop_watches()
            elif self.changed is not None:  # open watches re-read drop_watches_s
                self._faults_rev += 1
                async with self.changed:
                    self.changed.notify_all()
        elif method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{CONTROL_PATH}: GET, PUT or POST")
        delays = {f"{m}:{p}": v for (m, p), v in sorted(self.delays.items())}
        return aiohttp.web.json_response({**self.faults.to_dict(), "delays": delays})

    async def drop_watches(self) -> None:
        """Cut every open watch stream now (each counts as a dropped watch)."""
        if self.changed is None:
            self.changed = asyncio.Condition()
        self._watch_epoch += 1
        async with self.changed:
            self.changed.notify_all()

    async def _fault(self, rule: FaultRule, req: Request, request: rendering.Request) -> None:
        """Answer a non-watch request with `rule`'s fault (always raises)."""
        if rule.fault == "reset":
            raise _DropConnection()
        if rule.fault == "timeout":
            await asyncio.sleep(self.faults.hold_s)
            raise _DropConnection()
        code = rule.status
        assert code is not None
        res = f"{req.rtype.plural}.{req.rtype.group}" if req.rtype.group else req.rtype.plural
        name = req.name or ""
        note = f" (fault injected by the test API server: {rule.spec})"
        if code == 409 and req.method == "POST":
            # Another writer won the race: the object exists now, and this client is told so.
            async with self._lock:
                created = await self._serve_resource(req, request)
            name = (created.get("metadata") or {}).get("name", "") if isinstance(created, dict) else ""
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res} "{name}" already exists' + note,
                {"name": name, "group": req.rtype.group, "kind": req.rtype.plural},
            )
        if code == 409:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {res} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again" + note,
                {"name": name, "group": req.rtype.group, "kind": req.rtype.plural},
            )
        if code == 429:
            after = self.faults.retry_after_s
            raise ApiError(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later" + note,
                {"retryAfterSeconds": after},
                headers={"Retry-After": str(after)},
            )
        raise ApiError(code, REASONS.get(code, "InternalError"), f"injected HTTP {code}" + note)

    async def _watch_fault(
        self, rule: FaultRule, req: Request, raw: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        """A faulted watch request: 410 as an ERROR event in an opened stream (as kube-apiserver), else `_fault`."""
        if rule.status == 410:
            self.faults.answered("WATCH", req.rtype.plural, req.subresource, 410, _agent(req))
            resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(raw)
            since = req.params.get("resourceVersion") or "0"
            event = {
                "type": "ERROR",
                "object": _status(
                    410, "Expired", f"too old resource version: {since} ({self.rv}) (fault injected: {rule.spec})"
                ),
            }
            await resp.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
            await resp.write_eof()
            return resp
        try:
            await self._fault(rule, req, None)  # type: ignore[arg-type]  (no body needed: never a POST)
        except ApiError as exc:
            self.faults.answered("WATCH", req.rtype.plural, req.subresource, exc.code, _agent(req))
            raise
        raise AssertionError("unreachable")

    def _serve_static(self, path: str) -> Any:
        if path == "/":
            return {
                "paths": sorted(
                    {
                        "/api",
                        "/api/v1",
                        "/apis",
                        "/version",
                        "/openapi/v3",
                        "/healthz",
                        *(t.gv_path for t in self.types.values()),
                    }
                )
            }
        if path in ("/healthz", "/livez", "/readyz"):
            return "ok"
        if path == "/version":
            major, minor = self.k8s_version.split(".")
            return {
                "major": major,
                "minor": minor,
                "gitVersion": f"v{self.k8s_version}.0-longhaul-emulator",
                "platform": "linux/amd64",
                "compiler": "gc",
                "goVersion": "go1.23",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group_doc(g) for g in self._groups()]}
        if path == "/api/v1":
            return self._resource_list("", "v1")
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2:
            if parts[1] not in self._groups():
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._group_doc(parts[1])
        if parts[0] == "apis" and len(parts) == 3:
            if not any(t.group == parts[1] and t.version == parts[2] for t in self.types.values()):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._resource_list(parts[1], parts[2])
        if parts[0] == "openapi":
            from .openapi import openapi_v3_doc, openapi_v3_index

            if parts[1:] == ["v3"]:
                return openapi_v3_index(self.types.values())
            if len(parts) > 2 and parts[1] == "v3":
                gv = "/".join(parts[2:])
                doc = openapi_v3_doc(self.types.values(), gv)
                if doc is None:
                    raise ApiError(404, "NotFound", f"no OpenAPI document for {gv}")
                return doc
            raise ApiError(404, "NotFound", "OpenAPI v2 is not served; clients fall back to v3")
        return None

    def _groups(self) -> list[str]:
        return sorted({t.group for t in self.types.values() if t.group})

    def _group_doc(self, group: str) -> dict[str, Any]:
        # Kubernetes version priority (GA > beta > alpha, then the higher number): kubectl uses the preferred one,
        # e.g. ray.io/v1 over v1alpha1 for KubeRay's CRD, which serves both.
        versions = sorted({t.version for t in self.types.values() if t.group == group}, key=_version_priority)
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = [d for t in self.types.values() if t.group == group and t.version == version for d in t.discovery()]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _parse(self, request: rendering.Request) -> Request:
        parts = request.url.path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.url.path})")
        namespace = None
        # /namespaces/<ns>/<plural>/...: only when the third segment is a namespaced resource of this group/version.
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and (group, version, rest[2]) in self.types
            and self.types[(group, version, rest[2])].namespaced
        ):
            namespace, rest = rest[1], rest[2:]
        rtype = self._type_for(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = "/".join(rest[2:]) or None
        if sub is not None and sub not in rtype.subresources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({sub})")
        return Request(
            method=request.method.value.upper(),
            rtype=rtype,
            namespace=namespace,
            name=name,
            subresource=sub,
            params=dict(request.params),
            headers={k.lower(): v for k, v in request.headers.items()},
            text=request.text,
        )

    # ----------------------------------------------------------------------------------------------------
    # Resources

    async def _serve_resource(self, req: Request, request: rendering.Request) -> Any:
        m = req.method
        if m == "GET" and req.name is None:
            return self._list(req)
        if m == "GET":
            return self._get(req)
        if m == "POST" and req.name is None:
            return await self._create(req, self._body(req))
        if m == "PUT" and req.name:
            return await self._replace(req, self._body(req))
        if m == "PATCH" and req.name:
            return await self._patch(req)
        if m == "DELETE" and req.name:
            return await self._delete(req)
        if m == "DELETE":
            return await self._delete_collection(req)
        raise ApiError(405, "MethodNotAllowed", f"{m} is not supported on this path")

    def _body(self, req: Request) -> Any:
        ctype = req.headers.get("content-type", "")
        if "protobuf" in ctype:
            raise ApiError(415, "UnsupportedMediaType", "the emulator accepts JSON and YAML bodies only, not protobuf")
        try:
            return yaml.safe_load(req.text) if "yaml" in ctype else json.loads(req.text or "null")
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"cannot decode the request body: {exc}") from exc

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str | None, str]:
        return (rtype.group, rtype.plural, namespace if rtype.namespaced else None, name)

    def _not_found(self, rtype: ResourceType, name: str) -> ApiError:
        res = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
        return ApiError(
            404, "NotFound", f'{res} "{name}" not found', {"name": name, "group": rtype.group, "kind": rtype.plural}
        )

    def _existing(self, req: Request) -> dict[str, Any]:
        assert req.name is not None
        obj = self.store.get(self._key(req.rtype, req.namespace, req.name))
        if obj is None:
            raise self._not_found(req.rtype, req.name)
        return obj

    def _selected(self, req: Request) -> list[dict[str, Any]]:
        try:
            by_label = parse_label_selector(req.params.get("labelSelector"))
            by_field = parse_field_selector(req.params.get("fieldSelector"))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        out = []
        for (group, plural, ns, _), obj in self.store.items():
            if group != req.rtype.group or plural != req.rtype.plural:
                continue
            if req.namespace is not None and ns != req.namespace:
                continue
            if by_label(obj) and by_field(obj):
                out.append(obj)
        return sorted(out, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    def _list(self, req: Request) -> dict[str, Any]:
        items = [self._versioned(o, req.rtype) for o in self._selected(req)]
        if "as=table" in req.headers.get("accept", "").lower():
            return self._table(req.rtype, items)
        return {
            "kind": f"{req.rtype.kind}List",
            "apiVersion": req.rtype.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def _get(self, req: Request) -> dict[str, Any]:
        obj = self._versioned(self._existing(req), req.rtype)
        if "as=table" in req.headers.get("accept", "").lower():
            return self._table(req.rtype, [obj])
        return obj

    def _versioned(self, obj: dict[str, Any], rtype: ResourceType) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = rtype.api_version, rtype.kind
        return out

    def _table(self, rtype: ResourceType, items: list[dict[str, Any]]) -> dict[str, Any]:
        cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
        paths: list[str] = []
        for c in rtype.printer_columns:
            if c.get("priority", 0) == 0:
                cols.append(
                    {"name": c["name"], "type": c.get("type", "string"), "format": "", "description": c["name"]}
                )
                paths.append(c["jsonPath"])
        if not rtype.printer_columns:
            cols.append({"name": "Age", "type": "date", "format": "", "description": "Age"})
            paths.append(".metadata.creationTimestamp")
        rows = []
        for obj in items:
            cells: list[Any] = [obj["metadata"]["name"]]
            for p in paths:
                cur: Any = obj
                for part in p.strip(".").split("."):
                    cur = cur.get(part) if isinstance(cur, dict) else None
                if p.endswith("creationTimestamp") and cur:
                    cur = _age(cur)
                cells.append(cur if cur is not None else "")
            meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
            rows.append(
                {
                    "cells": cells,
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.rv)},
            "columnDefinitions": cols,
            "rows": rows,
        }

    # ----------------------------------------------------------------------------------------------------
    # Writes

    def _dry_run(self, req: Request) -> bool:
        return req.params.get("dryRun") == "All"

    def _admit(self, req: Request, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Check identity, prune/default/validate; returns the object to store (not yet stored)."""
        rtype = req.rtype
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the request body must be an object")
        if obj.get("kind") not in (None, rtype.kind) or obj.get("apiVersion") not in (None, rtype.api_version):
            raise ApiError(
                400,
                "BadRequest",
                f"the body is {obj.get('apiVersion')}/{obj.get('kind')} but the URL is for "
                f"{rtype.api_version}/{rtype.kind}",
            )
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            ns = req.namespace or meta.get("namespace") or "default"
            if meta.get("namespace") not in (None, ns):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if rtype.crd_schema is not None:
            self._admit_custom(req, obj)
        elif (rtype.api_version, rtype.kind) in STRICT_KINDS:
            self._validate_builtin(obj)
        return obj

    def _admit_custom(self, req: Request, obj: dict[str, Any]) -> None:
        rtype = req.rtype
        assert rtype.crd_schema is not None
        # Writes that change only metadata (annotations, finalizers: most of kopf's) reuse the last result.
        strict = req.params.get("fieldValidation") == "Strict"
        key = (
            id(rtype.crd_schema),
            strict,
            json.dumps({k: v for k, v in obj.items() if k != "metadata"}, sort_keys=True),
        )
        cached = self._admitted.get(key)
        if cached is not None:
            meta = obj["metadata"]
            obj.clear()
            obj.update(copy.deepcopy(cached))
            obj["metadata"] = meta
            return
        self._admit_custom_uncached(req, obj, strict)
        if len(self._admitted) > 4096:
            self._admitted.clear()
        self._admitted[key] = copy.deepcopy({k: v for k, v in obj.items() if k != "metadata"})

    def _admit_custom_uncached(self, req: Request, obj: dict[str, Any], strict: bool) -> None:
        rtype = req.rtype
        assert rtype.crd_schema is not None
        dropped = schema.prune(obj, rtype.crd_schema)
        if dropped and strict:
            fields = ", ".join(f'unknown field "{d}"' for d in dropped)
            raise ApiError(
                400,
                "BadRequest",
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a '
                f"{rtype.kind}: strict decoding error: {fields}",
            )
        schema.default(obj, rtype.crd_schema)
        problems = schema.validate(obj, rtype.crd_schema)
        if problems:
            name = obj["metadata"].get("name", "")
            text = ", ".join(f"{f}: {m}" for f, m in problems)
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.qualified} "{name}" is invalid: {text}',
                {
                    "name": name,
                    "group": rtype.group,
                    "kind": rtype.kind,
                    "causes": [{"reason": "FieldValueInvalid", "field": f, "message": m} for f, m in problems],
                },
            )

    def _validate_builtin(self, obj: dict[str, Any]) -> None:
        import jsonschema

        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
        key = json.dumps({**obj, "metadata": meta}, sort_keys=True)
        if key in self._valid_builtins:
            return
        validator = self._builtin_validator(obj["apiVersion"], obj["kind"])
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if not errors:
            if len(self._valid_builtins) > 4096:
                self._valid_builtins.clear()
            self._valid_builtins.add(key)
            return
        if errors:
            err = jsonschema.exceptions.best_match(errors)
            where = ".".join(str(p) for p in err.absolute_path) or "<root>"
            kind = obj["kind"] + ("." + obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "")
            name = obj.get("metadata", {}).get("name", "")
            raise ApiError(
                422,
                "Invalid",
                f'{kind} "{name}" is invalid: {where}: {err.message}',
                {
                    "name": name,
                    "kind": obj["kind"],
                    "causes": [
                        {"message": e.message, "field": ".".join(str(p) for p in e.absolute_path)} for e in errors[:10]
                    ],
                },
            )

    def _builtin_validator(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._validators:
            import re

            import jsonschema
            import kubernetes_validate.utils as kvu
            from referencing import Registry, Resource

            version = [v for v in kvu.all_versions() if kvu.major_minor(v) <= kvu.major_minor(self.k8s_version)][-1]
            gv = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
            sdir = f"v{version}-local-strict"
            doc = kvu.schema_contents(f"kubernetes-json-schema/{sdir}/{kind.lower()}-{gv}.json", self.k8s_version)
            defs = kvu.schema_contents(f"kubernetes-json-schema/{sdir}/_definitions.json", self.k8s_version)
            registry = Resource.from_contents(doc) @ (Resource.from_contents(defs) @ Registry())
            self._validators[key] = jsonschema.validators.Draft202012Validator(doc, registry=registry)
        return self._validators[key]

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def _emit(self, rtype: ResourceType, kind: str, obj: dict[str, Any]) -> None:
        self.log.append((self.rv, (rtype.group, rtype.plural), kind, copy.deepcopy(obj)))
        assert self.changed is not None
        async with self.changed:
            self.changed.notify_all()

    async def _create(self, req: Request, body: Any, *, allow_name_from_url: bool = False) -> dict[str, Any]:
        rtype = req.rtype
        if req.subresource:
            raise ApiError(405, "MethodNotAllowed", "create is not supported on subresources")
        if isinstance(body, dict) and not (body.get("metadata") or {}).get("name"):
            gen = (body.get("metadata") or {}).get("generateName")
            if gen:
                body.setdefault("metadata", {})["name"] = gen + uuid.uuid4().hex[:5]
            elif allow_name_from_url and req.name:
                body.setdefault("metadata", {})["name"] = req.name
            else:
                raise ApiError(
                    422,
                    "Invalid",
                    f"{rtype.qualified} is invalid: metadata.name: Required value: name or generateName is required",
                )
        obj = self._admit(req, body, None)
        meta = obj["metadata"]
        key = self._key(rtype, meta.get("namespace"), meta["name"])
        if key in self.store:
            res = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": rtype.group, "kind": rtype.plural},
            )
        if "status" in rtype.subresources or rtype.plural in STATUS_SUBRESOURCE_BUILTINS:
            obj.pop("status", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        for k in ("resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(k, None)
        if rtype.plural == "customresourcedefinitions":
            obj["status"] = _crd_status(obj)
        if rtype.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        if self._dry_run(req):
            meta["resourceVersion"] = str(self.rv)
            return obj
        if rtype.namespaced:
            await self._ensure_namespace(meta["namespace"])
        meta["resourceVersion"] = self._bump()
        self.store[key] = obj
        if rtype.plural == "customresourcedefinitions":
            self._register_crd(obj)
        await self._emit(rtype, "ADDED", obj)
        return copy.deepcopy(obj)

    async def _ensure_namespace(self, ns: str) -> None:
        ns_type = self.types[("", "v1", "namespaces")]
        key = self._key(ns_type, None, ns)
        if key not in self.store:
            obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": ns,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": _now(),
                    "generation": 1,
                    "labels": {"kubernetes.io/metadata.name": ns},
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
            obj["metadata"]["resourceVersion"] = self._bump()
            self.store[key] = obj
            await self._emit(ns_type, "ADDED", obj)

    async def _write(self, req: Request, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """Store `new` as the next version of `old` with subresource, generation and finalizer semantics."""
        rtype = req.rtype
        has_status = "status" in rtype.subresources
        new = copy.deepcopy(new)
        if req.subresource == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status")
            if merged["status"] is None:
                merged.pop("status")
            new = merged
        elif has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        if meta.get("resourceVersion") not in (None, old_meta["resourceVersion"]):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural} "{old_meta["name"]}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        if meta.get("name", old_meta["name"]) != old_meta["name"]:
            raise ApiError(400, "BadRequest", "metadata.name cannot be changed")
        for k in ("uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp"):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        if req.subresource != "status":
            new = self._admit(req, new, old)
            meta = new["metadata"]
        elif rtype.crd_schema is not None:
            # Status writes are validated too (pruning and defaults apply to the whole object).
            self._admit_custom(req, new)
            meta = new["metadata"]
        if _spec_part(new) != _spec_part(old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        probe = copy.deepcopy(new)
        probe["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if probe == old:
            return copy.deepcopy(old)  # no-op writes do not bump resourceVersion (as in kube-apiserver)
        if self._dry_run(req):
            return new
        meta["resourceVersion"] = self._bump()
        key = self._key(rtype, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.store.pop(key, None)
            await self._emit(rtype, "DELETED", new)
            await self._collect_garbage(meta["uid"], "Background")
            return new
        self.store[key] = new
        if rtype.plural == "customresourcedefinitions":
            self._register_crd(new)
        await self._emit(rtype, "MODIFIED", new)
        return copy.deepcopy(new)

    async def _replace(self, req: Request, body: Any) -> dict[str, Any]:
        key = self._key(req.rtype, req.namespace, req.name or "")
        if key not in self.store:
            if req.subresource:
                raise self._not_found(req.rtype, req.name or "")
            return await self._create(req, body, allow_name_from_url=True)
        return await self._write(req, self.store[key], body)

    async def _patch(self, req: Request) -> dict[str, Any]:
        ctype = req.headers.get("content-type", "").split(";")[0].strip()
        body = self._body(req)
        key = self._key(req.rtype, req.namespace, req.name or "")
        old = self.store.get(key)
        if old is None:
            if ctype == patches.APPLY and not req.subresource:
                return await self._create(req, body, allow_name_from_url=True)
            raise self._not_found(req.rtype, req.name or "")
        # Patch the object as served at the URL's version (a CRD serving several versions; conversion None).
        old = self._versioned(old, req.rtype)
        try:
            if ctype == patches.JSON_PATCH:
                new = patches.json_patch(old, body)
            elif ctype in (patches.MERGE, patches.APPLY):
                new = patches.merge_patch(old, body)
            elif ctype == patches.STRATEGIC:
                if req.rtype.crd_schema is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "strategic merge patch is not supported for custom resources; use --type=merge or --type=json",
                    )
                new = patches.merge_patch(old, patches.strip_directives(body))
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
        except patches.PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from exc
        if ctype != patches.JSON_PATCH and isinstance(body, dict):
            # A resourceVersion in a merge patch is a precondition, as in kube-apiserver.
            rv = (body.get("metadata") or {}).get("resourceVersion")
            new.setdefault("metadata", {})["resourceVersion"] = rv if rv else old["metadata"]["resourceVersion"]
        return await self._write(req, old, new)

    async def _delete(self, req: Request) -> dict[str, Any]:
        old = self._existing(req)
        body = self._body(req) if req.text.strip() else {}
        policy = req.params.get("propagationPolicy") or (body or {}).get("propagationPolicy") or "Background"
        if self._dry_run(req) or (body or {}).get("dryRun") == ["All"]:
            return copy.deepcopy(old)
        return await self._delete_object(req.rtype, old, policy)

    async def _delete_object(self, rtype: ResourceType, old: dict[str, Any], policy: str) -> dict[str, Any]:
        meta = old["metadata"]
        key = self._key(rtype, meta.get("namespace"), meta["name"])
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                new = copy.deepcopy(old)
                new["metadata"].update(
                    deletionTimestamp=_now(), deletionGracePeriodSeconds=0, resourceVersion=self._bump()
                )
                self.store[key] = new
                await self._emit(rtype, "MODIFIED", new)
                return copy.deepcopy(new)
            return copy.deepcopy(old)
        self.store.pop(key, None)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._bump()
        await self._emit(rtype, "DELETED", gone)
        if rtype.plural == "namespaces":
            for k in [k for k in self.store if k[2] == meta["name"]]:
                if k in self.store:
                    await self._delete_object(self._type_of(k), self.store[k], "Background")
        if rtype.plural == "customresourcedefinitions":
            for t in self._unregister_crd(old):
                for k in [k for k in self.store if k[0] == t.group and k[1] == t.plural]:
                    await self._delete_object(t, self.store[k], "Background")
        await self._collect_garbage(meta["uid"], policy)
        return gone

    async def _delete_collection(self, req: Request) -> dict[str, Any]:
        items = [copy.deepcopy(o) for o in self._selected(req)]
        for obj in items:
            await self._delete_object(req.rtype, obj, "Background")
        return {
            "kind": f"{req.rtype.kind}List",
            "apiVersion": req.rtype.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def _type_of(self, key: tuple[str, str, str | None, str]) -> ResourceType:
        group, plural = key[0], key[1]
        return next(t for t in self.types.values() if t.group == group and t.plural == plural)

    async def _collect_garbage(self, owner_uid: str, policy: str) -> None:
        """The garbage collector: dependents whose owners are all gone are deleted (or orphaned)."""
        live = {o["metadata"]["uid"] for o in self.store.values()}
        for key, obj in list(self.store.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == owner_uid for r in refs):
                continue
            rtype = self._type_of(key)
            if policy == "Orphan":
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
                new["metadata"]["resourceVersion"] = self._bump()
                self.store[key] = new
                await self._emit(rtype, "MODIFIED", new)
            elif not any(r.get("uid") in live for r in refs):
                if key in self.store:
                    await self._delete_object(rtype, self.store[key], "Background")

    # ----------------------------------------------------------------------------------------------------
    # Watch

    async def _watch(self, req: Request, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            by_label = parse_label_selector(req.params.get("labelSelector"))
            by_field = parse_field_selector(req.params.get("fieldSelector"))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        if self.changed is None:
            self.changed = asyncio.Condition()
        resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(raw)
        key = (req.rtype.group, req.rtype.plural)
        if req.name is not None:
            inner = by_field
            by_field = lambda o, n=req.name: o["metadata"]["name"] == n and inner(o)  # noqa: E731

        def matches(obj: dict[str, Any]) -> bool:
            ns_ok = req.namespace is None or obj["metadata"].get("namespace") == req.namespace
            return ns_ok and by_label(obj) and by_field(obj)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            event = {"type": kind, "object": self._versioned(obj, req.rtype)}
            await resp.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")

        start = req.params.get("resourceVersion") or "0"
        timeout = float(req.params.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Fault injection: cut the stream (no end of stream: the client sees a broken connection) once it is
        # `faults.drop_watches_s` old (read on every turn: it can be set while the stream is open), or when
        # `drop_watches()` is called.
        opened = loop.time()
        epoch = self._watch_epoch

        def drop_in() -> float | None:
            after = self.faults.drop_watches_s
            return None if not after else opened + after - loop.time()

        def cut() -> bool:
            left = drop_in()
            return epoch != self._watch_epoch or (left is not None and left <= 0)

        try:
            if start in ("0", ""):
                for obj in self._selected(Request("GET", req.rtype, req.namespace, None, None, {}, {}, "")):
                    if matches(obj):
                        await send("ADDED", obj)
                cursor = len(self.log)
            else:
                since = int(start)
                cursor = next((i for i, e in enumerate(self.log) if e[0] > since), len(self.log))
            while loop.time() < deadline:
                while cursor < len(self.log):
                    _, k, kind, obj = self.log[cursor]
                    cursor += 1
                    if k == key and matches(obj):
                        await send(kind, obj)
                if cut():
                    self.faults.dropped_watches += 1
                    if raw.transport is not None:
                        raw.transport.close()
                    return resp
                assert self.changed is not None
                left = drop_in()
                limit = min(5.0, deadline - loop.time(), *(() if left is None else (left,)))
                rev = self._faults_rev
                async with self.changed:
                    try:
                        await asyncio.wait_for(
                            self.changed.wait_for(
                                lambda c=cursor, r=rev: (
                                    c < len(self.log) or r != self._faults_rev or epoch != self._watch_epoch
                                )
                            ),
                            timeout=max(0.0, limit),
                        )
                    except TimeoutError:
                        pass
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError, RuntimeError):
            pass
        return resp

    # ----------------------------------------------------------------------------------------------------
    # Test helpers (in-process use)

    def get_object(self, group: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.store.get((group, plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, group: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (g, p, ns, _), o in self.store.items()
            if g == group and p == plural and (namespace is None or ns == namespace)
        ]


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of API versions, most preferred first: v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > anything else."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if m is None:
        return (3, 0, 0, version)
    level = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (level, -int(m.group(1)), -int(m.group(3) or 0), version)


def _agent(req: Request) -> str:
    return req.headers.get("user-agent", "")


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    now = _now()
    names = crd["spec"]["names"]
    accepted = {
        **names,
        "singular": names.get("singular", names["kind"].lower()),
        "listKind": names.get("listKind", names["kind"] + "List"),
    }
    return {
        "acceptedNames": accepted,
        "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ],
    }


def _age(ts: str) -> str:
    try:
        then = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return ts
    secs = int((dt.datetime.now(dt.UTC) - then).total_seconds())
    return f"{secs}s" if secs < 120 else f"{secs // 60}m" if secs < 7200 else f"{secs // 3600}h"
