"""This repository's own test fixtures: fake HTTP servers for the unit tests of the harness's
HTTP code. Not shipped: what downstream users load is the plugin (harness/pytest_plugin.py).

Being at the repository root, this file also puts the root on sys.path, so tests import the
helper modules behind these fixtures as `tests.http_fakes`, `tests.server_specs` and
`tests.run.external_fakes` (no `pythonpath` setting).
"""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from tests.http_fakes import FakeHttp, Responder
from tests.run.external_fakes import FakeVllm


@pytest.fixture(autouse=True)
def _registered_secrets_stay_with_their_test():
    """A token one test registers for redaction (a deployment's auth_env read, a fuzzed value)
    must not mask words in a later test's output (a README table was masked in a full run)."""
    from harness.core.redact import forget_secrets, registered_secrets

    before = registered_secrets()
    yield
    forget_secrets(keep=before)


class Started(list):
    """A factory's servers so far (`.servers`), each closed when the test ends."""

    def __init__(self, make: Callable[..., FakeHttp]) -> None:
        super().__init__()
        self._make = make

    @property
    def servers(self) -> "Started":
        return self

    def __call__(self, *args, **kwargs) -> FakeHttp:
        self.append(self._make(*args, **kwargs))
        return self[-1]

    def close(self) -> None:
        for server in self:
            server.close()


@pytest.fixture
def fake_http() -> Iterator[Callable[[Responder], FakeHttp]]:
    """fake_http(respond) -> a FakeHttp on 127.0.0.1 answering with `respond`; `.servers`."""
    started = Started(FakeHttp)
    yield started
    started.close()


@pytest.fixture
def fake_vllm() -> Iterator[Callable[..., FakeVllm]]:
    """fake_vllm(role, **options) -> a vLLM-shaped FakeVllm (tests/run/external_fakes.py);
    `.servers` lists them in start order."""
    started = Started(FakeVllm)
    yield started
    started.close()
