"""Tokens belong in headers, never in URLs: a URL is echoed in errors, logs and records."""
from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from harness.core.redact import is_secret_name, redact

URL_SECRET_PARAMS = frozenset({"key", "sig", "signature", "code", "jwt", "apikey", "auth"})


def url_token_problem(url: str, what: str = "URL") -> str | None:
    """One line when `url` carries a credential (user:password@, or a query parameter like
    access_token=, api_key=, token=), else None. The line shows the URL redacted."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"{what} {redact(url)!r} is not a URL: {exc}"
    if parts.password is not None or (parts.username and "@" in parts.netloc):
        return (f"{what} {redact(url)!r} holds credentials (user:password@); name an auth_env "
                f"instead")
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if is_secret_name(name) or name.lower() in URL_SECRET_PARAMS:
            return (f"{what} {redact(url)!r} holds a token in its query ({name}=); name an "
                    f"auth_env instead (the token then goes in the Authorization header)")
    return None


__all__ = ["url_token_problem"]
