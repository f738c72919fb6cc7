"""The one host store: a JSON file of entries, read and changed under a file lock, written
atomically, in a per-user directory only this user can enter. The port registry
(`host.ports`), the process ledger (`supervision.ledger`) and the namespace ledger (`net.netns`)
are its three users; each gives a validator, so an entry another process (or another user)
forged or broke is skipped with a warning and never reaches a kill, a reclaim or a start.

The directory (`default_state_dir`: ``$TMPDIR/pd-accuracy-<uid>``) is created 0700 and refused
when it is a link or another user owns it: on a shared machine anybody could otherwise create
it first and write the entries the harness acts on.
"""
from __future__ import annotations

import json
import logging
import math
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import filelock

from harness.core.atomic import atomic_write_text
from harness.serve.host.liveness import owner_alive

LOG = logging.getLogger(__name__)

__all__ = ["HostStateError", "HostStore", "default_state_dir", "drop_dead", "owned_dir",
           "problem_of_owner", "problem_of_time"]

T = TypeVar("T")
Entries = dict[str, dict[str, Any]]
Validator = Callable[[str, dict[str, Any]], "str | None"]


class HostStateError(OSError):
    """The state directory is not this user's own. One line."""


def owned_dir(path: str | os.PathLike[str]) -> Path:
    """`path` as a directory of this user's, mode 0700 (created so; tightened when looser);
    HostStateError when it is a link, not a directory, or another user's."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise HostStateError(f"{path} is not a directory (a link?): refusing to keep host state "
                             f"there")
    if info.st_uid != os.geteuid():
        raise HostStateError(f"{path} belongs to uid {info.st_uid}, not to this user "
                             f"({os.geteuid()}): refusing to keep host state there")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def default_state_dir() -> Path:
    """``$TMPDIR/pd-accuracy-<uid>``: this user's host state (ports, ledgers, start slots)."""
    return owned_dir(Path(tempfile.gettempdir()) / f"pd-accuracy-{os.geteuid()}")


def problem_of_time(value: Any, what: str) -> str | None:
    """None for a process start time (a finite positive number); never null: a null start time
    would make any process with that PID count as the recorded one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        return f"{what} {value!r} is not a start time"
    return None


def problem_of_owner(entry: dict[str, Any], pid_key: str = "owner_pid",
                     time_key: str = "owner_create_time") -> str | None:
    pid = entry.get(pid_key)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return f"{pid_key} {pid!r} is not a PID"
    host = entry.get("host")
    if host is not None and not isinstance(host, str):
        return f"host {host!r} is not a name"
    return problem_of_time(entry.get(time_key), time_key)


def drop_dead(entries: Entries, pid_key: str = "owner_pid",
              time_key: str = "owner_create_time") -> Entries:
    """Remove (and return) the entries whose owner process is gone."""
    dead = {key: e for key, e in entries.items()
            if not owner_alive(int(e[pid_key]), e.get(time_key), e.get("host"))}
    for key in dead:
        del entries[key]
    return dead


class HostStore:
    """``<directory>/<name>``: ``{section: {key: entry}}``. `update` runs a change on the valid
    entries under the lock and writes them back if it changed them (malformed entries are
    dropped then, with a warning)."""

    def __init__(self, name: str, section: str, validate: Validator, *,
                 directory: str | os.PathLike[str] | None = None,
                 lock_timeout_s: float = 10.0) -> None:
        self.directory = owned_dir(directory) if directory is not None else default_state_dir()
        self.path = self.directory / name
        self.section = section
        self.validate = validate
        self._lock = filelock.FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._warned: set[str] = set()
        self._skipped = 0   # entries the last load skipped: the next write drops them

    @property
    def lock(self) -> filelock.BaseFileLock:
        return self._lock

    def load(self) -> Entries:
        """The valid entries (call under `lock`); an unreadable file is an empty store."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._warn("file", f"{self.path} unreadable ({exc}); starting it afresh")
            return {}
        section = raw.get(self.section) if isinstance(raw, dict) else None
        if not isinstance(section, dict):
            return {}
        entries: Entries = {}
        self._skipped = 0
        for key, entry in section.items():
            problem = ("not a mapping" if not isinstance(entry, dict)
                       else self.validate(str(key), entry))
            if problem:
                self._warn(f"entry {key}", f"{self.path}: skipping entry {str(key)[:40]!r}: "
                                           f"{problem}")
                self._skipped += 1
                continue
            entries[str(key)] = entry
        return entries

    def save(self, entries: Entries) -> None:
        """Write `entries` atomically (call under `lock`)."""
        atomic_write_text(self.path, json.dumps({self.section: entries}, indent=1,
                                                sort_keys=True))

    def read(self) -> Entries:
        with self._lock:
            return self.load()

    def update(self, change: Callable[[Entries], T]) -> T:
        """``change(entries)`` under the lock; written back when it changed them."""
        with self._lock:
            entries = self.load()
            before = json.dumps(entries, sort_keys=True)
            result = change(entries)
            if json.dumps(entries, sort_keys=True) != before or self._skipped:
                self.save(entries)
            return result

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            LOG.warning("%s", message)
        self._warned.add(key)
