"""GET with exactly the headers the harness chose: requests would otherwise add an Authorization
from ~/.netrc (its `trust_env`), a token for whatever host the netrc names."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests
from requests.auth import AuthBase

from harness.core.url_tokens import url_token_problem


class ExactHeaders(AuthBase):
    """requests' `auth=`: a given auth object keeps netrc out; this one sets the Authorization
    the caller passed (or none)."""

    def __init__(self, headers: Mapping[str, str] | None) -> None:
        self.authorization = dict(headers or {}).get("Authorization")

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers.pop("Authorization", None)
        if self.authorization:
            request.headers["Authorization"] = self.authorization
        return request


def get(url: str, *, headers: Mapping[str, str] | None = None, timeout: float,
        **kwargs: Any) -> requests.Response:
    """requests.get of `url` with `headers` and nothing else that authenticates; a token in the
    URL is refused before it is sent (tokens go in headers)."""
    problem = url_token_problem(url)
    if problem:
        raise ValueError(problem)
    return requests.get(url, headers=dict(headers or {}), timeout=timeout,
                        auth=ExactHeaders(headers), **kwargs)


def post(url: str, *, headers: Mapping[str, str] | None = None, timeout: float,
         **kwargs: Any) -> requests.Response:
    """requests.post, as `get` (the harness's own proxy controls: /pd/hold, /pd/release)."""
    problem = url_token_problem(url)
    if problem:
        raise ValueError(problem)
    return requests.post(url, headers=dict(headers or {}), timeout=timeout,
                         auth=ExactHeaders(headers), **kwargs)


__all__ = ["ExactHeaders", "get", "post"]
