#!/usr/bin/env python3
"""Copy the part of a GPU run worth committing into results/reference/.

    python3 scripts/gpu/keep.py RUN results/reference/<DIR>/<NAME> [--samples GLOB]

RUN is one run directory of `pd-accuracy run` or `bench` (packed: packing.json and one folder per
baseline group). Kept: packing.json, bench.json, console/ (one log per group) and every verdict
record.
For each cell that did not PASS also its run's server/proxy logs and KV digest files and the per-question answers of
baseline and P/D when both were evaluated (both gzip: `zless`). --samples GLOB (on the cell id) keeps the answers of passing cells too.
A whole run is ~30 MB; what is kept is a few hundred KB, so device carries stay under 64 MiB.
"""
from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.report.annotate import outcome_of  # noqa: E402


def _gzip_to(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, gzip.open(dst.with_name(dst.name + ".gz"), "wb", 9) as fout:
        shutil.copyfileobj(fin, fout)


def keep(run: Path, dest: Path, samples_glob: str | None) -> list[str]:
    kept = []
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("cells.json", "groups.txt", "packing.json", "bench.json"):
        if (run / name).exists():
            shutil.copy2(run / name, dest / name)
    if (run / "console").is_dir():
        shutil.copytree(run / "console", dest / "console", dirs_exist_ok=True)
    # a packed run's <group>/ (harness.run.plan.packed), a one-group run's own directory, or the
    # records/<group run>/ of the reference runs before `run` packed GPUs itself
    pattern = ("records/*/*.json" if (run / "records").is_dir()
               else "*/*.json" if (run / "packing.json").exists() else "*.json")
    for rec_path in sorted(run.glob(pattern)):
        rec = json.loads(rec_path.read_text())
        if "verdict" not in rec:
            continue
        run_dir, cell_id = rec_path.parent, rec["cell"]["id"]
        out_dir = dest / run_dir.relative_to(run)
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(rec_path, out_dir / rec_path.name)
        failed = outcome_of(rec) != "PASS"
        arts = rec.get("artifacts") or {}
        if failed:  # the record names its own server/proxy logs (run-relative paths)
            for rel in (arts.get("logs") or {}).values():
                if (run_dir / rel).exists():
                    _gzip_to(run_dir / rel, out_dir / rel)
                digests = (run_dir / rel).with_suffix(".kv-digest.jsonl")   # the KV digests
                if digests.exists():
                    _gzip_to(digests, out_dir / Path(rel).with_suffix(".kv-digest.jsonl"))
        judged = (rec.get("metrics") or {}).get("pd_accuracy") is not None
        if judged and (failed or (samples_glob and fnmatch.fnmatch(cell_id, samples_glob))):
            for key in ("baseline_samples", "pd_samples", "proxy_records"):
                rel = arts.get(key)
                if rel and (run_dir / rel).exists():
                    _gzip_to(run_dir / rel, out_dir / rel)
        kept.append(f"{outcome_of(rec):7} {cell_id}")
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--samples", metavar="GLOB", help="also keep the answers of these passing cells")
    args = ap.parse_args(argv)
    if not any((args.run / name).exists() for name in ("packing.json", "logs", "records")):
        print(f"error: {args.run} is not a run directory (no packing.json, logs/ or records/)",
              file=sys.stderr)
        return 2
    for line in keep(args.run, args.dest, args.samples):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
