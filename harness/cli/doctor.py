"""`pd-accuracy doctor`: what of the harness attaches to the installed vLLM.

    pd-accuracy doctor [--json] [--no-cache]

Reads the installed vLLM through the feature probe (a child interpreter, cached per release):
each hook of the compatibility table (harness.core.vllm_hooks) and what the vLLM lacks for it,
then the verdict checks, canaries, weathers and KV connectors of the harness, each with
"runs" or the line saying why not on this release. Exit 0 when every hook attaches, 1 when one
does not (the run still works: what rests on it is said not available, never passed), 3 when
vLLM cannot be probed here.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness.core.outcomes import EXIT_ERROR, EXIT_OK

EXIT_SOME_MISSING = 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("doctor", help="which checks, canaries, weathers and connectors "
                                             "attach to the installed vLLM",
                              description=__doc__.split("\n\n")[2].replace("\n", " "))
    from harness.cli import vocabulary as vocab

    vocab.add_json(p)
    p.add_argument("--no-cache", action="store_true", help="probe vLLM afresh")
    p.set_defaults(func=run_doctor)


def diagnose(features: Any) -> dict[str, Any]:
    """Everything doctor prints, from a probed VllmFeatures (pure; tests pass fakes)."""
    from harness.core.cell import FAULTS
    from harness.connectors import KV_CONNECTORS
    from harness.core.vllm_hooks import hooks as all_hooks, not_available_checks, unavailable_for
    from harness.weathers import WEATHERS
    from harness.judge.verdict import CHECKS
    from harness.serve.launch.hook_plugins import hook_plugins

    version = features.version
    missing = features.hooks_missing()
    shapes = features.hook_shapes or {}
    plugins = hook_plugins()
    hooks = [{"hook": row.name, "attaches": row.name not in missing,
              "missing": missing.get(row.name), "serves": list(row.serves),
              "uses": list(shapes.get(row.name, ())), "plugin": plugins.get(row.name)}
             for row in all_hooks()]
    if features.hooks is None:      # an older cached probe: nothing known, nothing claimed
        hooks = [{**h, "attaches": None, "missing": "not probed"} for h in hooks]
    checks_off = not_available_checks(missing, version)
    checks = [{"check": row.name, "stage": row.stage, "runs": row.name not in checks_off,
               "why": checks_off.get(row.name)} for row in CHECKS]
    canaries = []
    for fault in FAULTS:
        why = unavailable_for("canary", fault, missing, version)
        canaries.append({"canary": fault, "runs": why is None, "why": why})
    weathers = []
    for name, row in WEATHERS.items():
        why = unavailable_for("weather", name, missing, version)
        if why is None and row.min_vllm and _older(version, row.min_vllm):
            why = f"weather {name} needs vLLM >= {row.min_vllm} (its settings)"
        weathers.append({"weather": name, "runs": why is None, "why": why})
    connectors = [{"kv_connector": value, "vllm_class": row.vllm_name,
                   "attaches": _connector_why(row, features) is None,
                   "why": _connector_why(row, features)} for value, row in KV_CONNECTORS.items()]
    runners = [{"runner": r, "runs": features.runner_missing(r) is None,
                "why": features.runner_missing(r)} for r in ("v1", "v2")]
    return {"vllm": version, "platform": features.platform, "hooks": hooks, "checks": checks,
            "canaries": canaries, "weathers": weathers, "connectors": connectors,
            "runners": runners}


def _connector_why(row: Any, features: Any) -> str | None:
    """Why a connector does not run here: one the harness excludes (it moves no KV between
    servers, or no module drives it: the matrix's rules say the same), or one this vLLM lacks."""
    if row.moves_kv is not None:
        return f"excluded: it moves no KV between servers ({row.moves_kv})"
    if not row.driven:
        return f"excluded: the harness does not drive it ({row.not_driven or 'no module'})"
    registered = features.kv_connectors is None or row.vllm_name in features.kv_connectors
    error = (features.kv_transport_errors or {}).get(row.transport)
    imports = features.kv_transports is None or row.transport in features.kv_transports
    if not registered:
        return f"vLLM {features.version} registers no {row.vllm_name}"
    if not imports:
        return f"transport {row.transport} does not import ({error or 'not found'})"
    return None


def _older(version: str, minimum: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version.split("+")[0]) < Version(minimum)
    except InvalidVersion:
        return False


def render(report: dict[str, Any]) -> str:
    """The report as plain text, one line per item (diffable between releases)."""
    lines = [f"vLLM {report['vllm']} ({report['platform']})", "", "hooks into vLLM:"]
    for h in report["hooks"]:
        state = {True: "attaches", False: "NOT AVAILABLE", None: "unknown"}[h["attaches"]]
        uses = f" [on {', '.join(h['uses'])}]" if h.get("uses") else ""
        lines.append(f"  {h['hook']:<18} {state:<13} {h['missing'] or '; '.join(h['serves'])}"
                     f"{uses}")
    for title, section, key, ok in (("model runners", "runners", "runner", "runs"),
                                    ("checks", "checks", "check", "runs"),
                                    ("canaries", "canaries", "canary", "runs"),
                                    ("weathers", "weathers", "weather", "runs"),
                                    ("connectors", "connectors", "kv_connector", "attaches")):
        lines += ["", f"{title}:"]
        for item in report.get(section, ()):
            state = "runs" if item[ok] else "not available"
            lines.append(f"  {item[key]:<26} {state}{': ' + item['why'] if item['why'] else ''}")
    off = [h["hook"] for h in report["hooks"] if h["attaches"] is False]
    lines += ["", f"{len(report['hooks']) - len(off)}/{len(report['hooks'])} hooks attach"
                  + (f"; not available: {', '.join(off)}" if off else "")]
    return "\n".join(lines)


def run_doctor(args: argparse.Namespace) -> int:
    from harness.serve.launch.vllm_features import VllmNotInstalled, detect

    try:
        features = detect(use_cache=not args.no_cache)
    except (VllmNotInstalled, RuntimeError) as error:
        print(f"pd-accuracy doctor: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_ERROR
    report = diagnose(features)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return EXIT_SOME_MISSING if any(h["attaches"] is False for h in report["hooks"]) else EXIT_OK
