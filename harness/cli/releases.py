"""The vLLM release axis of `pd-accuracy run`, and `pd-accuracy bisect`.

    pd-accuracy run --vllm 0.28.0,0.30.0,0.32.0 --profile smoke [RUN ARGS]
        the same run once per release, each in its own cached environment
        (harness.run.releases), records under RESULTS_DIR/vllm-<release>/; exit: the worst.
    pd-accuracy bisect --profile P (--only ID | -k EXPR | --model M) --good RELEASE --bad RELEASE
                       [--vllm R1,R2,...] [--on outcome|digest|check:NAME] [RUN OPTIONS]
        the first bad release between a good and a bad one: runs the cell on the releases
        between them, halving the range, and prints the table it walked (--out FILE: also
        as markdown). A release is a version, a .whl file or a vLLM checkout directory; the
        releases between two versions are the package's from the index (pip index versions),
        or those of --vllm from --good to --bad. "bad" means the cell's judgement differs from the good release's: its
        outcome (default), its kv-digest check (--on digest: identical vs where it differs),
        or one named check's pass/fail.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.core.outcomes import EXIT_ERROR, EXIT_INCONCLUSIVE, EXIT_OK
from harness.run.releases import strip_option

# ---- bisect ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One release the walk ran: its judgement of the cell, and whether that is the bad one's."""

    release: str
    outcome: str
    signature: str
    bad: bool | None        # None: it could not be judged (no record)
    detail: str
    record: str | None


def signature_of(record: dict[str, Any], on: str) -> str:
    """What the walk compares between releases, read off the cell's record."""
    verdict = record.get("verdict") or {}
    checks = {c["name"]: c for c in verdict.get("checks") or ()}
    if on == "outcome":
        return str(verdict.get("outcome"))
    name = "kv-digest" if on == "digest" else on.removeprefix("check:")
    check = checks.get(name)
    if check is None:
        said = [line for line in verdict.get("not_available") or () if line.startswith(name)]
        return f"{name}: not available" if said else f"{name}: did not run"
    if check["passed"]:
        return f"{name}: passed"
    # where the digest differs (first layer, K/V, tokens): the part before the counts
    where = re.split(r"[;(]", str(check.get("detail") or ""))[0].strip()
    return f"{name}: failed ({where[:120]})"


def between(good: str, bad: str, index_versions: Sequence[str]) -> list[str]:
    """The final releases from ``good`` to ``bad`` (both included), oldest first."""
    from packaging.version import Version

    lo, hi = sorted((Version(good), Version(bad)))
    found = sorted({Version(v) for v in index_versions
                    if not Version(v).is_prerelease and not Version(v).is_postrelease
                    and lo <= Version(v) <= hi})
    ordered = [str(v) for v in found]
    for end in (good, bad):
        if end not in ordered:
            ordered.append(end)
    ordered = sorted(set(ordered), key=Version)
    return ordered if Version(good) <= Version(bad) else ordered[::-1]


def index_versions(package: str) -> list[str]:
    """The package's versions on the index pip uses here (``pip index versions``)."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package],
                          capture_output=True, text=True, timeout=120)
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise RuntimeError(f"pip index versions {package}: {(done.stderr or done.stdout).strip()[:200]}")


def walk(releases: Sequence[str], judge: Callable[[str], Step | None]) -> tuple[list[Step], str | None]:
    """Binary search for the first bad release in ``releases`` (the first good, the last bad,
    both judged first). ``judge(release)``: its Step (``bad`` against the good one's
    signature). Returns the steps in the order run and the first bad release (None: none
    found, e.g. the ends agree)."""
    steps: list[Step] = []

    def run(release: str) -> Step | None:
        step = judge(release)
        if step is not None:
            steps.append(step)
        return step

    first, last = run(releases[0]), run(releases[-1])
    if first is None or last is None or not last.bad:
        return steps, None
    lo, hi = 0, len(releases) - 1          # lo: known good, hi: known bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        step = run(releases[mid])
        if step is None or step.bad is None:
            return steps, None
        if step.bad:
            hi = mid
        else:
            lo = mid
    return steps, releases[hi]


def table(steps: Sequence[Step], first_bad: str | None, cell: str, on: str) -> str:
    """The walked table, markdown (what bisect prints and --table writes)."""
    lines = [f"bisect of {cell} on {on}", "",
             "| step | vLLM | outcome | compared | vs --good |", "|---|---|---|---|---|"]
    for i, s in enumerate(steps, 1):
        mark = "?" if s.bad is None else "differs (bad)" if s.bad else "same (good)"
        lines.append(f"| {i} | {s.release} | {s.outcome} | {s.signature} | {mark} |")
    lines.append("")
    lines.append(f"first bad release: {first_bad}" if first_bad else
                 "no first bad release: the good and bad releases judge the cell alike")
    return "\n".join(lines)


def run_bisect(args: argparse.Namespace) -> int:
    from harness.cli import front_door
    from harness.core.options import UsageError
    from harness.run.record import load_records
    from harness.run.releases import (ReleaseError, default_package, parse_release, release_env,
                                      run_in)

    try:
        front_door.admit(args)
    except UsageError as exc:
        return front_door.report(str(exc))
    names = args.walk
    try:
        if names is None:
            names = between(args.good, args.bad, index_versions(default_package()))
        releases = {name: parse_release(name) for name in names}
    except (ReleaseError, RuntimeError, ValueError) as error:
        return front_door.report(f"bisect: {error}")
    # the cell's selection and every run option go to each release's run as given
    passthrough = [a for a in strip_option(args.argv[1:], "--good", "--bad", "--vllm", "--on",
                                           "--out", "--results-dir") if a != "--dry-run"]
    if args.dry_run:
        for name in names:
            out = Path(args.results_dir) / f"vllm-{releases[name].label}"
            print(f"{releases[name].label}: pd-accuracy run {' '.join(passthrough)} "
                  f"--results-dir {out}")
        return EXIT_OK
    reference: dict[str, str] = {}

    def judge(name: str) -> Step | None:
        release = releases[name]
        out = Path(args.results_dir) / f"vllm-{release.label}"
        recorded = sorted(load_records(out), key=lambda r: str(r.get("created_at")))
        matching = [r for r in recorded if _selected(r, args)]
        if not matching:        # not run here before: run it now
            python = release_env(release).ensure(lambda line: print(line, file=sys.stderr))
            print(f"== bisect: vLLM {release.label}", flush=True)
            run_in(python, ["run", *passthrough, "--results-dir", str(out)])
            matching = [r for r in sorted(load_records(out), key=lambda r: str(r.get("created_at")))
                        if _selected(r, args)]
        if not matching:
            return Step(release.label, "no record", "-", None, "the run wrote no record", None)
        record = matching[-1]
        signature = signature_of(record, args.on)
        if not reference:
            reference["good"] = signature
        verdict = record.get("verdict") or {}
        return Step(release.label, str(verdict.get("outcome")), signature,
                    signature != reference["good"], str(verdict.get("reason"))[:200],
                    str(record.get("_path") or ""))

    try:
        steps, first_bad = walk(names, judge)
    except ReleaseError as error:
        print(f"pd-accuracy bisect: {error}", file=sys.stderr)
        return EXIT_ERROR
    cell = args.only or args.keyword or args.model
    text = table(steps, first_bad, cell, args.on)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            {"cell": cell, "on": args.on, "releases": names,
             "first_bad": first_bad, "steps": [s.__dict__ for s in steps]}, indent=1) + "\n")
    return EXIT_OK if first_bad else EXIT_INCONCLUSIVE


def _selected(record: dict[str, Any], args: argparse.Namespace) -> bool:
    """A record of the bisected cell: named by --only, or any in a -k bisect's own directory."""
    cell_id = str((record.get("cell") or {}).get("id"))
    return cell_id in args.only.split(",") if args.only else True


def register(subparsers: Any) -> None:
    from harness.cli import values as v
    from harness.cli import vocabulary as vocab

    p = subparsers.add_parser("bisect", help="the first vLLM release that judges a cell "
                                             "differently from a good one",
                              description="Runs the cell on releases between --good and --bad, "
                                          "halving the range, and prints the table it walked.")
    b = p.add_argument_group("the walk")
    b.add_argument("--good", required=True, type=v.release(), metavar="RELEASE",
                   help="a release that judges the cell as expected")
    b.add_argument("--bad", required=True, type=v.release(), metavar="RELEASE",
                   help="a release that does not")
    vocab.add_vllm(b, "the releases to walk, oldest first, --good and --bad among them "
                      "(default: the index's between them)")
    b.add_argument("--on", default="outcome", type=v.compare_on(),
                   help="what differs: outcome (default), digest, or check:NAME")
    vocab.add_out(b, "also write the walked table (markdown, and FILE.json)")
    vocab.add_selection(p, shard=False)
    vocab.add_platform(p)
    vocab.add_cell(p)
    vocab.add_canary(p)
    vocab.add_evaluation(p)
    vocab.add_servers(p)
    out = p.add_argument_group("output")
    vocab.add_results_dir(out, "results/runs", "where each release's records go "
                                                 "(RESULTS_DIR/vllm-RELEASE)")
    vocab.add_dry_run(out, "print the releases and the run each would get; make no environment")
    vocab.add_verbose(out)
    p.set_defaults(func=run_bisect)
