"""Each server's effective configuration, read back from its log when a cell's record is written,
and the verdict judged as the cell the servers really ran (harness.judge.effective_config): the
last judging a verdict gets before the recorder stores it (:func:`record_judged`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from harness.core.cell import Cell
from harness.judge.effective_config import judged_as_ran
from harness.judge.verdict import Verdict, as_declared
from harness.protocol.effective_config import EffectiveConfig, parse_server_log
from harness.run.record import CellResult, Recorder

SERVER_ROLES = ("baseline", "prefill", "decode")


def effective_configs(logs: Mapping[str, str]) -> dict[str, EffectiveConfig]:
    """Every vLLM server's configuration from its log (`logs`: role -> path); a log that is not
    there (a server that never started) gives nothing."""
    configs = {}
    for role, path in logs.items():
        if role.split("-")[0] not in SERVER_ROLES:
            continue
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        configs[role] = parse_server_log(role, text)
    return configs


def with_effective_config(cell: Cell, verdict: Verdict,
                          artifacts: Mapping[str, Any] | None) -> tuple[Verdict, dict | None]:
    """(the verdict judged as the cell its servers ran, the record's `effective_config`: role ->
    what it ran, or None when no server log is there)."""
    configs = effective_configs((artifacts or {}).get("logs") or {})
    if not configs:
        return verdict, None
    return judged_as_ran(verdict, cell, configs), {role: c.to_dict() for role, c in configs.items()}


def record_judged(recorder: Recorder, cell: Cell, verdict: Verdict, **parts: Any) -> CellResult:
    """`cell`'s record (``parts``: Recorder.record's) with `verdict` judged once more before it
    is stored: with what the cell declares (harness.judge.verdict.as_declared), then as the cell
    its servers ran (their logs in ``parts["artifacts"]``)."""
    verdict, effective_config = with_effective_config(cell, as_declared(verdict, cell),
                                                      parts.get("artifacts"))
    return recorder.record(cell, verdict, effective_config=effective_config, **parts)
