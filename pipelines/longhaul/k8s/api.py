"""A small async Kubernetes REST client (httpx) for the operator: create/get/list/patch of any kind.

The credentials come from kopf's login (`kopf.ConnectionInfo`), so kopf and this client talk to the same
server the same way. Bodies are plain dicts: what `render_kubernetes` returned is what gets sent.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from typing import Any

import httpx

#: Plurals of the kinds the operator reads and writes.
PLURALS = {
    "ConfigMap": "configmaps",
    "Job": "jobs",
    "Event": "events",
    "RayJob": "rayjobs",
    "JobSet": "jobsets",
    "Experiment": "experiments",
}


class ApiError(Exception):
    """A non-2xx answer: HTTP status, the server's reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
                  subresource: str | None = None) -> str:
    """REST path of a collection or object (`/api/v1/...` for the core group, `/apis/<g>/<v>/...` otherwise)."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}" if namespace else f"{base}/{PLURALS[kind]}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class KubeApi:
    """Async client; one per operator process."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @classmethod
    def from_connection_info(cls, info: Any) -> KubeApi:
        """Build from a `kopf.ConnectionInfo` (server, CA, token or client certificate, insecure flag)."""
        headers = {"Accept": "application/json"}
        if getattr(info, "token", None):
            headers["Authorization"] = f"{getattr(info, 'scheme', None) or 'Bearer'} {info.token}"
        elif getattr(info, "username", None):
            basic = base64.b64encode(f"{info.username}:{info.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        verify: Any = True
        if getattr(info, "insecure", False):
            verify = False
        elif getattr(info, "ca_path", None) or getattr(info, "ca_data", None):
            ctx = ssl.create_default_context(cafile=info.ca_path or None,
                                             cadata=_text(info.ca_data) if info.ca_data else None)
            verify = ctx
        cert = None
        if getattr(info, "certificate_path", None) or getattr(info, "certificate_data", None):
            cert = (_file(info.certificate_path, info.certificate_data), _file(info.private_key_path, info.private_key_data))
            if isinstance(verify, ssl.SSLContext):
                verify.load_cert_chain(*cert)
                cert = None
        client = httpx.AsyncClient(base_url=info.server, headers=headers, verify=verify, cert=cert,
                                   timeout=httpx.Timeout(30.0),
                                   limits=httpx.Limits(max_connections=32, max_keepalive_connections=16))
        return cls(client)

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, method: str, path: str, *, json: Any = None, content_type: str | None = None,
                    params: dict[str, str] | None = None) -> Any:
        headers = {"Content-Type": content_type} if content_type else {}
        resp = await self.client.request(method, path, json=json, params=params, headers=headers)
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"reason": resp.reason_phrase, "message": resp.text[:500]}
            raise ApiError(resp.status_code, body.get("reason", ""), body.get("message", ""))
        return resp.json()

    async def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create `obj`; when it exists already (409) return the stored one. Returns (object, created)."""
        meta = obj["metadata"]
        try:
            path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
            return await self._call("POST", path, json=obj), True
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = await self.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if existing is None:  # deleted between the 409 and the read: let the caller retry
            raise ApiError(409, "Conflict", f"{obj['kind']} {meta['name']} exists and vanished; retry")
        return existing, False

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        try:
            out = await self._call("GET", resource_path(api_version, kind, namespace),
                                   params={"labelSelector": label_selector})
        except ApiError as exc:
            if exc.status == 404:  # the kind is not served (e.g. no KubeRay CRDs)
                return []
            raise
        return out.get("items", [])

    async def patch_status(self, api_version: str, kind: str, namespace: str | None, name: str,
                           status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource."""
        return await self._call("PATCH", resource_path(api_version, kind, namespace, name, "status"),
                                json={"status": status}, content_type="application/merge-patch+json")


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


def _file(path: str | None, data: Any) -> str:
    if path:
        return path
    f = tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem")  # noqa: SIM115 - lives as long as the process
    f.write(data if isinstance(data, bytes) else str(data).encode())
    f.close()
    return f.name
