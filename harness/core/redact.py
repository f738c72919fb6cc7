"""The one redaction filter: every record, log line, report, annotation and JUnit file the harness
writes passes through it, so no secret leaves in what the harness writes.

Two kinds of secret are removed:

* values the harness knows are secret: every token it read for an ``auth_env``
  (`register_secret`, called where the token is read), and the values of environment variables
  whose names look secret (``*TOKEN*``, ``*KEY*``, ``*SECRET*``, ``*PASSWORD*``, ...) when they
  appear as a whole word. Long ones (4 characters or more) are replaced wherever they stand;
  short ones only as a whole word, so a 2-character token does not mangle every number;
* shapes that are secret wherever they come from: ``--api-key X`` (and ``=X``), ``Bearer X``,
  ``Authorization: X``, a secret-looking name's ``NAME=value`` / ``"NAME": "value"``, a
  secret-looking URL query parameter (``?access_token=X``), ``user:password@`` in a URL, and the
  well-known token prefixes (``sk-``, ``hf_``, ``ghp_``, ``xox?-``, ``AKIA``).

`redact` takes text, `redact_data` any JSON-like value (a secret-looking key's value is replaced
whole, and an argv list's value after ``--api-key``), `RedactingFilter` is the logging filter.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

MASK = "***"

# a name whose value is a secret: PD_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD...
# (split into words; a name ending in _env, _path, _file... names where a secret is, not one)
SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "pwd", "apikey", "credential",
                          "credentials", "cookie", "authorization", "auth", "bearer"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"),
                          ("secret", "key"), ("session", "id")})
NOT_SECRET_LAST = frozenset({"env", "path", "file", "dir", "url", "name", "names", "type"})
# the shell's working directories: "pwd" here is not a password
NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})
# environment values shorter than this are not taken as secrets (1, true, cpu...)
MIN_ENV_SECRET = 8
# command-line flags whose next argument is a secret (vLLM's --api-key, lm-eval's --api_key)
SECRET_FLAGS = ("--api-key", "--api_key", "--token", "--hf-token", "--password")

_TOKEN_SHAPES = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{6,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|"
    r"xox[abposr]-[A-Za-z0-9\-]{6,}|AKIA[0-9A-Z]{12,})")
_FLAG_VALUE = re.compile(r"(?i)(--(?:api[-_]key|token|hf-token|password)(?:=|\s+))(?!\*\*\*)(\"[^\"]*\"|'[^']*'|\S+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)(?!\*\*\*)([A-Za-z0-9._~+/=\-:]+)")
_AUTH_HEADER = re.compile(
    r"(?i)(\"?authorization\"?\s*[:=]\s*\"?(?:[A-Za-z]+\s+)?)(?!\*\*\*)([^\s\",}]+)")
_NAME_SEP = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)(\"?\s*[:=]\s*\"?|'?\s*:\s*')")
_VALUE = re.compile(r"(?!\*\*\*)[^\s\"',&}\]]+")
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^/\s:@]*:)([^/\s@]+)(@)")

_known: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a secret value (a token just read for a request) so every later redaction
    removes it."""
    if value:
        with _lock:
            _known.add(value)


def forget_secrets(keep: set[str] | frozenset[str] = frozenset()) -> None:
    """Forget every registered secret but `keep` (tests: one test's tokens stay its own)."""
    with _lock:
        _known.intersection_update(keep)


def registered_secrets() -> frozenset[str]:
    """The secrets registered so far."""
    with _lock:
        return frozenset(_known)


def known_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Registered secrets plus the values of secret-looking environment variables, longest
    first (so a secret holding another is replaced whole)."""
    env = os.environ if environ is None else environ
    with _lock:
        values = set(_known)
    values |= {v for k, v in env.items() if len(v or "") >= MIN_ENV_SECRET and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)


def is_secret_name(name: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    if not words or words[-1] in NOT_SECRET_LAST or name in NOT_SECRET_NAMES:
        return False
    return (name.lower() == "key" or any(w in SECRET_WORDS for w in words)
            or any(pair in SECRET_PAIRS for pair in zip(words, words[1:])))


def redact(text: Any, environ: Mapping[str, str] | None = None) -> str:
    """`text` (as a string) with every secret replaced by ``***``."""
    text = str(text)
    if not text:
        return text
    for secret in known_secrets(environ):
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)
    text = _FLAG_VALUE.sub(lambda m: m.group(1) + MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
    text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _mask_named_values(text)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return _TOKEN_SHAPES.sub(MASK, text)


def _mask_named_values(text: str) -> str:
    """``NAME=value`` / ``"NAME": "value"`` with the value masked when NAME looks secret (a
    name is looked for everywhere, also inside a URL's query)."""
    out, pos = [], 0
    for match in _NAME_SEP.finditer(text):
        if match.start() < pos or not is_secret_name(match.group(1)):
            continue
        value = _VALUE.match(text, match.end())
        if value is None:
            continue
        out += [text[pos:value.start()], MASK]
        pos = value.end()
    return "".join(out) + text[pos:]


def redact_argv(argv: list[Any] | tuple[Any, ...]) -> list[str]:
    """An argv with each secret flag's value masked, and every element redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        text = str(arg)
        out.append(MASK if hide_next else redact(text))
        hide_next = text in SECRET_FLAGS
    return out


def redact_data(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A JSON-like value with every secret removed: strings redacted, a secret-looking key's
    value replaced whole, an argv-like list's secret flag values masked."""
    if isinstance(value, Mapping):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    and not isinstance(v, (Mapping, list, tuple, bool, int, float))
                    else redact_data(v, environ))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, str) and v in SECRET_FLAGS for v in value):
            return redact_argv(value)
        return [redact_data(v, environ) for v in value]
    if isinstance(value, str):
        return redact(value, environ)
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message (arguments folded in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return True
        record.msg, record.args = redact(message), None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put the filter on every handler of `logger` (the root logger by default)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


__all__ = ["MASK", "RedactingFilter", "install_log_redaction", "is_secret_name", "known_secrets",
           "redact", "redact_argv", "redact_data", "register_secret"]
