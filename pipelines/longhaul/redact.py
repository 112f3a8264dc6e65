"""Redaction of credentials in URIs and echoed values (pure): the one place every log line, message, tag or spec
error that shows a URI goes through."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
#: Query parameters whose values are credentials (`?token=…`, `&X-Amz-Signature=…`, `api_key=…`).
_SECRET_QUERY = re.compile(r"(?i)([?&;][^=&;#]*(?:token|secret|passw|pwd|key|sig|credential|auth)[^=&;#]*=)[^&;#]*")


def redact_uri(uri: str) -> str:
    """`uri` fit for logs, messages and tags: the password of `user:password@` (a lone `token@` whole) and the
    values of credential-like query parameters become `***`; anything else is kept, so the line still says where.

    `http://user:s3cr3t@mlflow:5000` → `http://user:***@mlflow:5000`; a URI that does not parse → `***`.
    """
    try:
        parts = urlsplit(uri)
    except ValueError:
        return REDACTED
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if has_password and user else f"{REDACTED}@{host}"
        uri = urlunsplit(parts._replace(netloc=netloc))
    return _SECRET_QUERY.sub(rf"\1{REDACTED}", uri)


def redact_value(value: Any) -> Any:
    """A value fit to echo in an error message: a string holding a URI is redacted (`redact_uri`), anything else
    is returned as is."""
    return redact_uri(value) if isinstance(value, str) and "://" in value else value
