"""The errors a ManagedProcess raises when its server does not come up, each carrying the server's
name, its log file and the log lines that explain the failure (``logscan``)."""
from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from harness.serve.launch.logscan import most_decisive_line

__all__ = ["ManagedProcessError", "ProcessStartError", "ServerDiedError", "ServerStartTimeout"]


class ManagedProcessError(RuntimeError):
    """Base of the errors a managed server raises; each carries its name, log and decisive lines."""

    name: str
    log_path: str
    decisive_lines: list[str]

    @property
    def decisive_line(self) -> str:
        """The one log line that best explains the failure ('' when the log is empty)."""
        return most_decisive_line(self.decisive_lines)


class ServerDiedError(ManagedProcessError):
    """The process exited before its health URL answered 200."""

    def __init__(self, name: str, returncode: int, log_path: str | os.PathLike[str],
                 decisive_lines: Sequence[str]) -> None:
        # args are exactly the constructor's parameters, so the exception pickles (xdist, mp)
        super().__init__(name, returncode, str(log_path), list(decisive_lines))
        self.name, self.returncode = name, returncode
        self.log_path, self.decisive_lines = str(log_path), list(decisive_lines)

    def __str__(self) -> str:
        code = str(self.returncode)
        if self.returncode < 0:
            try:
                code += f" ({signal.Signals(-self.returncode).name})"
            except ValueError:
                pass
        return (f"{self.name} exited with code {code} before becoming healthy: "
                f"{self.decisive_line or '(empty log)'} (log: {self.log_path})")


class ServerStartTimeout(ManagedProcessError):
    """The process was still running but not healthy when the deadline passed."""

    def __init__(self, name: str, deadline_s: float, log_path: str | os.PathLike[str],
                 decisive_lines: Sequence[str]) -> None:
        super().__init__(name, deadline_s, str(log_path), list(decisive_lines))
        self.name, self.deadline_s = name, deadline_s
        self.log_path, self.decisive_lines = str(log_path), list(decisive_lines)

    def __str__(self) -> str:
        return (f"{self.name} was not healthy after {self.deadline_s:g}s: "
                f"{self.decisive_line or '(empty log)'} (log: {self.log_path})")


class ProcessStartError(ManagedProcessError):
    """The executable could not be started at all (missing binary, bad cwd, ...)."""

    def __init__(self, name: str, reason: str, log_path: str | os.PathLike[str]) -> None:
        super().__init__(name, reason, str(log_path))
        self.name, self.reason = name, reason
        self.log_path, self.decisive_lines = str(log_path), [reason]

    def __str__(self) -> str:
        return f"{self.name} could not be started: {self.reason} (log: {self.log_path})"
