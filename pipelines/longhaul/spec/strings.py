"""Shared string types of the spec. Untrusted strings end up in shell scripts and manifests: restrict them at the door.

The forms a single section uses live with that section (image references with the backends, quantities with the
resources); paths have their own module (`longhaul.spec.paths`).
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def is_dns1123_label(value: str) -> bool:
    """Whether `value` is a DNS-1123 label, matched whole (`re.match` with `$` would let a trailing newline by)."""
    return re.fullmatch(DNS1123_LABEL, value) is not None


SAFE_TOKEN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
URL = r"^(https?|file|sqlite|postgresql|mysql|databricks)(\+[a-z0-9]+)?:/{0,4}[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]*$"

#: Free text that travels through YAML and logs: no control characters, and none of the characters YAML reads as
#: line breaks (NEL, LS, PS), which would not come back unchanged from the resolved spec a job re-reads.
ONE_LINE_TEXT = r"^[^\x00-\x1f\x7f-\x9f" + "\u2028\u2029" + r"]*$"


def _url(value: str) -> str:
    try:
        netloc = urlsplit(value).netloc
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if "@" in netloc:
        raise ValueError(
            "credentials in the URL would be written in plain text into rendered manifests, the "
            "resolved spec and logs; keep them in a Secret (spec.tracking.uri_secret, "
            "user_simulator.api_key_secret) or in MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD"
        )
    if "$(" in value:
        raise ValueError("'$(' would be expanded by Kubernetes in the container's environment; write '$' as %24")
    return value


SafeToken = Annotated[str, Field(pattern=SAFE_TOKEN, max_length=128)]
Url = Annotated[str, Field(pattern=URL, max_length=2048), AfterValidator(_url)]
#: Kubernetes qualified name (label keys, toleration keys): optional DNS prefix + '/' + name.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QualifiedName = Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=316)]
K8sLabelValue = Annotated[str, Field(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]
