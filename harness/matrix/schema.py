"""The matrix YAML's shape, checked with its JSON Schema (harness/matrix/schema.json).

`check_structure` raises MatrixError with one line naming the file, the place in it and what is
wrong, e.g. ``m.yaml: profiles.smoke.grids[0]: unknown axis ['bakend']; axes are model, ...``.
The wording comes from the schema's own `errorMessage` entries (see its description), so the
schema is the one place that says both what is allowed and how a violation reads. What a schema
cannot say (include cycles, names that must refer to each other, duplicate cell ids) is checked
in code by spec and expand.
"""
from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match, relevance

from harness.matrix.errors import MatrixError

SCHEMA: dict[str, Any] = json.loads(
    resources.files("harness.matrix").joinpath("schema.json").read_text("utf-8"))

# YAML gives Python values: an integer is an int, not a bool and not a float such as 64.0
# (jsonschema's default counts 64.0 as an integer)
_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
_VALIDATOR = validators.extend(Draft202012Validator, type_checker=_TYPES)(SCHEMA)

_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "a boolean", "null": "null"}


def check_structure(data: Any, source: str) -> None:
    """Raise MatrixError for the most relevant way `data` (a loaded YAML) breaks the schema: the
    shallowest violation, and among equals the first in schema order (so the top level lists
    additionalProperties before required: a misspelt `profiles` reads as the unknown key)."""
    error = max(_VALIDATOR.iter_errors(data), key=relevance, default=None)
    if error is not None:
        raise MatrixError(describe(error, source))


def describe(error: ValidationError, source: str) -> str:
    """One line: ``SOURCE: PATH: message`` (``SOURCE: message`` at the top level)."""
    error = _reported(error)
    where = path_text(error.absolute_path)
    message = " ".join(_message(error).split())
    return f"{source}: {where}: {message}" if where else f"{source}: {message}"


def path_text(path: Iterable[Any]) -> str:
    """``profiles.smoke.grids[0].block_size`` from the instance path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _custom(error: ValidationError) -> str | None:
    """The schema's errorMessage for this failure, if the failing node has one."""
    custom = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
    if isinstance(custom, dict):
        return custom.get(error.validator)
    return custom


def _reported(error: ValidationError) -> ValidationError:
    """For an anyOf without a message of its own, the alternative that came closest."""
    while error.validator in ("anyOf", "oneOf") and error.context and _custom(error) is None:
        error = best_match(error.context)
    return error


_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxdict, _EXCERPT.maxlist = 2, 4, 4
_EXCERPT.maxstring = _EXCERPT.maxother = 60


def excerpt(value: Any) -> str:
    """A bounded repr of a value from the file: an error line quotes it, never all of it."""
    return _EXCERPT.repr(value)


def _message(error: ValidationError) -> str:
    instance = error.instance
    fields = {"value": excerpt(instance), "unknown": "", "known": ""}
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        declared = error.schema.get("properties", {})
        fields["unknown"] = excerpt(sorted((k for k in instance if k not in declared), key=str))
        fields["known"] = ", ".join(declared)
    template = _custom(error)
    if template is not None:
        return template.format(**fields)
    if error.validator == "additionalProperties":
        return "unknown key(s) {unknown}; known: {known}".format(**fields)
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"{excerpt(instance)} is not {' or '.join(_TYPE_WORDS.get(t, t) for t in wanted)}"
    return error.message[:300]
