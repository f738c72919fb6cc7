"""`pd-accuracy zoo build|list|path|data|install|eval|card`: the harness's own tiny trained models.

    pd-accuracy zoo build NAME [--device cuda|cpu] [--steps N] [--out-dir DIR]
        retrain NAME from scratch (default: into its committed checkpoint directory) and
        re-render its card; same seed and steps give the same model.
    pd-accuracy zoo list           names, architectures, hybrid flag, checkpoint present
    pd-accuracy zoo path NAME      the checkpoint directory (what the servers load)
    pd-accuracy zoo data [DIR]     write the gsm_synth train/test jsonl (default: the cache)
    pd-accuracy zoo install TAR [TAR...]
        unpack checkpoint tarballs made by scripts/train_on_device.sh (each holds one directory
        named after the run) into the committed checkpoint directories and render the cards;
        runs whose name is not a zoo name (e.g. tiny-llama-gsm-rerun) are skipped.
    pd-accuracy zoo eval NAME [--limit N]
        measure NAME's gsm_synth accuracy through a real vLLM CPU server (started, confined and
        stopped like a cell's baseline) and write it into eval_vllm.json and the card.
    pd-accuracy zoo card NAME [--vllm-results FILE]
        re-render harness/zoo/cards/NAME.md, optionally recording an lm-eval results JSON
        measured through vLLM first.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from harness.core.outcomes import EXIT_ERROR, EXIT_OK, EXIT_USAGE



def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _build(args: argparse.Namespace) -> int:
    from harness.zoo import card, registry, train
    from harness.zoo.models import SPECS

    if args.name not in SPECS:
        print(f"unknown zoo model {args.name!r}; known: {', '.join(SPECS)}", file=sys.stderr)
        return EXIT_USAGE
    spec = SPECS[args.name]
    target = Path(args.out_dir) if args.out_dir else registry.checkpoint_dir(args.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Train beside the target and swap at the end, so a failed build keeps the old checkpoint.
    work = Path(tempfile.mkdtemp(prefix=f".{args.name}.", dir=target.parent))
    try:
        if spec.recipe in ("eagle-head", "mtp-head"):
            from harness.zoo import eagle, mtp

            kind = mtp.MTP if spec.recipe == mtp.RECIPE else eagle.EAGLE
            eagle.train_head(args.name, work, kind=kind, device=args.device or _default_device(),
                             steps=args.steps,
                             decay_start=None if args.steps else spec.decay_start,
                             stop_after=None if args.steps else spec.stop_after,
                             time_limit_s=args.time_limit)
        elif spec.recipe == "sliding-fine-tune":
            from harness.zoo import sliding

            sliding.fine_tune(work, device=args.device or _default_device(),
                              steps=args.steps or spec.steps, time_limit_s=args.time_limit,
                              probe_n=args.probe_n, workers=args.workers)
        else:
            train.train(args.name, work, device=args.device or _default_device(),
                        steps=args.steps, decay_start=None if args.steps else spec.decay_start,
                        stop_after=None if args.steps else spec.stop_after,
                        time_limit_s=args.time_limit, probe_n=args.probe_n,
                        workers=args.workers)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    if not args.out_dir:
        print(card.write_card(target))
    print(target)
    return EXIT_OK


def _list(_args: argparse.Namespace) -> int:
    from harness.zoo import registry
    from harness.zoo.models import SPECS

    for name in registry.zoo_names():
        spec = SPECS[name]
        present = (registry.checkpoint_dir(name) / "config.json").exists()
        print(f"{name:28s} {spec.architecture:30s} hybrid={str(spec.hybrid).lower():5s} "
              f"block(cpu)={registry.required_block_size(name, 'cpu')} "
              f"checkpoint={'yes' if present else 'missing'}")
    from harness.zoo.shapes import SHAPES   # real shapes: config + tokenizer, random weights
    for name, shape in SHAPES.items():
        present = (registry.checkpoint_dir(name) / "config.json").exists()
        print(f"{name:28s} {shape.architecture:30s} shape of {shape.published}, random weights "
              f"(--load-format dummy) config={'yes' if present else 'missing'}")
    return EXIT_OK


def _path(args: argparse.Namespace) -> int:
    from harness.zoo import registry

    try:
        print(registry.resolve_model(args.name) if args.name in registry.zoo_names()
              else registry.checkpoint_dir(args.name))
    except (KeyError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _data(args: argparse.Namespace) -> int:
    from harness.zoo import task

    print(task.write_splits(args.dir))
    return EXIT_OK


def _install(args: argparse.Namespace) -> int:
    import tarfile

    from harness.zoo import card, registry

    for tar_path in args.tars:
        with tarfile.open(tar_path) as tar:
            tops = {Path(m.name).parts[0] for m in tar.getmembers()}
            if len(tops) != 1:
                print(f"{tar_path}: expected one top-level directory, found {sorted(tops)}",
                      file=sys.stderr)
                return EXIT_USAGE
            name = tops.pop()
            if name not in registry.zoo_names():
                print(f"{tar_path}: {name} is not a zoo name; skipped")
                continue
            target = registry.checkpoint_dir(name)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                tar.extractall(tmp, filter="data")
                if target.exists():
                    shutil.rmtree(target)
                (Path(tmp) / name).rename(target)
        for f in target.iterdir():
            f.chmod(0o644)
        print(card.write_card(target))
    return EXIT_OK


def _card(args: argparse.Namespace) -> int:
    from harness.zoo import card, registry

    try:
        ckpt = Path(registry.resolve_model(args.name))
    except (KeyError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    if args.vllm_results:
        card.record_vllm_eval(ckpt, args.vllm_results, command=args.command or "",
                              vllm_version=args.vllm_version or "")
    print(card.write_card(ckpt))
    return EXIT_OK


def _eval(args: argparse.Namespace) -> int:
    from harness.serve.supervision.process import ManagedProcessError
    from harness.zoo import card, registry
    from harness.run.zoo_eval import measure

    if args.name not in registry.zoo_names():
        print(f"{args.name!r} is not a zoo model; known: {', '.join(registry.zoo_names())}",
              file=sys.stderr)
        return EXIT_USAGE
    if registry.SPECS[args.name].recipe == "eagle-head":
        print(f"{args.name} is an EAGLE head: vLLM serves it only as a draft of "
              f"{registry.SPECS[args.name].target} (spec_decode eagle_p1_d3), not alone",
              file=sys.stderr)
        return EXIT_USAGE
    if args.limit < 1:
        print(f"--limit must be at least 1, got {args.limit}", file=sys.stderr)
        return EXIT_USAGE
    try:
        record = measure(args.name, limit=args.limit, startup_timeout_s=args.startup_timeout)
    except ManagedProcessError as exc:
        print(f"the vLLM server did not start: {exc}", file=sys.stderr)
        return EXIT_ERROR  # the server did not start: the environment, like a verdict's ERROR
    print(f"{args.name}: strict-match {100 * record['strict_match']:.1f}% "
          f"(n={record['n']}, {record['vllm']})")
    print(card.write_card(registry.checkpoint_dir(args.name)))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    from harness.cli import values as v

    p = sub.add_parser("zoo", help="build, list and locate the tiny trained zoo models",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo = p.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)
    name = dict(type=v.text("NAME", 200), help="a zoo model's name (`pd-accuracy zoo list`)")

    b = zoo.add_parser("build", help="retrain a zoo model from scratch (reproducible)")
    b.add_argument("name", **name)
    b.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where to train, cpu | cuda (default: cuda when available)")
    b.add_argument("--steps", type=v.whole(1, 10_000_000), metavar="N",
                   help="training steps (default: the recipe's, models.py)")
    b.add_argument("--out-dir", type=v.writable("dir", "--out-dir"), metavar="DIR",
                   help="where the checkpoint goes (default: the committed checkpoint directory)")
    b.add_argument("--time-limit", type=v.number(0, 1e7, low_open=True), metavar="S",
                   help="seconds of training at most")
    b.add_argument("--probe-n", type=v.whole(0, 1_000_000), default=0, metavar="N",
                   help="PyTorch probe docs (0: skip)")
    b.add_argument("--workers", type=v.whole(0, 256), default=2, metavar="N",
                   help="data-loader processes")
    b.set_defaults(func=_build)

    zoo.add_parser("list", help="the zoo's models").set_defaults(func=_list)

    pa = zoo.add_parser("path", help="checkpoint directory of a zoo model")
    pa.add_argument("name", **name)
    pa.set_defaults(func=_path)

    d = zoo.add_parser("data", help="write the gsm_synth jsonl splits")
    d.add_argument("dir", nargs="?", default=None, type=v.writable("dir", "DIR"),
                   help="where the splits go (default: the cache)")
    d.set_defaults(func=_data)

    i = zoo.add_parser("install", help="unpack device-trained checkpoint tarballs")
    i.add_argument("tars", nargs="+", type=v.existing("file", "TAR"),
                   help="checkpoint tarballs of scripts/train_on_device.sh")
    i.set_defaults(func=_install)

    e = zoo.add_parser("eval", help="measure a zoo model through a real vLLM server (CPU) "
                                    "and write the number into its card")
    e.add_argument("name", **name)
    e.add_argument("--limit", type=v.whole(1, 1_000_000), default=200, metavar="N",
                   help="gsm_synth test docs (default 200)")
    e.add_argument("--startup-timeout", type=v.number(0, 7 * 24 * 3600, low_open=True),
                   default=600.0, metavar="S", help="seconds the server may take to start "
                                                    "(default 600)")
    e.set_defaults(func=_eval)

    c = zoo.add_parser("card", help="re-render a model card (optionally with vLLM results)")
    c.add_argument("name", **name)
    c.add_argument("--vllm-results", type=v.existing("file", "--vllm-results"), metavar="FILE",
                   help="lm-eval results JSON (gsm_synth) measured through vLLM")
    c.add_argument("--vllm-version", type=v.text("--vllm-version", 100), metavar="VERSION",
                   help="the vLLM version --vllm-results were measured with")
    c.add_argument("--command", type=v.text("--command"), metavar="CMD",
                   help="how the vLLM numbers were measured")
    c.set_defaults(func=_card)
