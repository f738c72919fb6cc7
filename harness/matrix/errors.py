"""The matrix's errors. Every one is a ValueError whose str() is one line."""
from __future__ import annotations


class MatrixError(ValueError):
    """The matrix YAML (or a request against it) is malformed. str() is one line."""


class UnknownProfileError(MatrixError):
    pass


class DuplicateCellIdError(MatrixError):
    pass


class UnknownCellError(MatrixError):
    pass
