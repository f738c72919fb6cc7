"""The one vocabulary of the command line: the parser class every command uses, and the option
groups commands share. A command takes the groups it uses and nothing else; the same thing has
the same name everywhere (`--results-dir` is the results folder, `--vllm` the vLLM releases,
`--json` prints JSON, `--out FILE` writes the command's file). docs/cli.md is generated from
these (harness.cli.surface)."""
from __future__ import annotations

import argparse
from typing import Any

from harness.cli import values as v
from harness.core.outcomes import EXIT_USAGE

# values of a cell's fields (harness.core.cell); the parser checks them before the rules do
CELL_GROUP = "cell: with --model, the one cell to run; with a profile, which of its cells"
CANARY_GROUP = "canary of the --model cell"
SELECTION_GROUP = "which cells"


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2 (argparse would print the whole usage
    first); abbreviations are off, so `--vll` is no `--vllm`. Sub-command parsers are of this
    class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, and `given`: the options written on the command line (dest -> as written),
        so that an option given with its default value still counts as given."""
        import sys

        from harness.cli.inputs import given_options

        argv = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(argv, namespace)
        parsed.given = {**(getattr(parsed, "given", None) or {}), **given_options(self, argv)}
        return parsed, extras

    def error(self, message: str):  # type: ignore[override]
        from harness.core.redact import redact

        # every refusal of every command starts the same way (the front door's too)
        self.exit(EXIT_USAGE, f"pd-accuracy: error: {redact(' '.join(message.split()))[:600]}\n")


def add_selection(p: argparse.ArgumentParser, *, shard: bool = True,
                  profile_default: str | None = None) -> None:
    sel = p.add_argument_group(SELECTION_GROUP)
    sel.add_argument("--profile", default=profile_default, type=v.text("--profile", 200),
                     help="matrix profile (smoke, cpu-full, pr, nightly, ...; `pd-accuracy list` "
                          f"shows its cells; default {profile_default or 'smoke'})")
    sel.add_argument("--matrix", type=v.existing("file", "--matrix"), metavar="FILE",
                     help="matrix YAML (default: the harness's own, harness/matrix/default.yaml)")
    sel.add_argument("--only", type=v.text("--only", 1 << 20), metavar="IDS",
                     help="comma-separated cell ids or globs")
    sel.add_argument("-k", dest="keyword", type=v.keyword(), metavar="EXPR",
                     help="keyword expression on cell ids, as pytest -k (words, and/or/not, ())")
    if shard:
        sel.add_argument("--shard", type=v.shard(), metavar="I/N",
                         help="only the I-th of N deterministic shards (0-based)")


def add_platform(p: Any, *, allow_any: bool = False, default: str | None = None,
                 what: str = "expand the cells for this machine instead of this one") -> None:
    p.add_argument("--platform", default=default, type=v.platform(allow_any), metavar="SPEC",
                   help=f"{what}: cpu, cpu:ISA+ISA, cuda:N or cuda:N:GiB"
                        + ("; any: only the matrix's own rules" if allow_any else "")
                        + (f" (default: {default})" if default else " (default: this machine)"))


def add_cell(p: argparse.ArgumentParser) -> None:
    """The options that shape one ad-hoc cell (with --model) or pick a profile's cells."""
    from harness.core.cell import (ASYNC_SCHEDULING, BACKENDS, COMPILE_MODES, CUDAGRAPH_MODES,
                                   DEVICES, KV_BUFFER_DEVICES, KV_CACHE_DTYPES, KV_LAYOUTS,
                                   NETWORKS, RUNNERS, SPEC_DECODE_METHODS, Cell)
    from harness.connectors import KV_CONNECTORS
    from harness.weathers import WEATHERS
    from harness.matrix.rules_cell import DTYPES

    d = Cell(model="-")
    c = p.add_argument_group(CELL_GROUP)
    c.add_argument("--model", type=v.text("--model", 1024), metavar="NAME",
                   help="zoo name, local path or hub id: run this one cell instead of a profile")
    c.add_argument("--backend", type=v.choice(BACKENDS, "attention backend", ignore_case=True),
                   help=f"attention backend, any case ({', '.join(BACKENDS)}; default "
                        f"{d.backend} on CPU, FLASH_ATTN on CUDA)")
    c.add_argument("--runner", type=v.choice(RUNNERS, "runner"),
                   help=f"model runner of the decode and the baseline (default {d.runner})")
    c.add_argument("--prefill-runner", type=v.choice(RUNNERS, "runner"),
                   help="the prefill's runner when not --runner (mixed runners, GPU)")
    c.add_argument("--block-size", type=v.pair(v.whole(1, 1 << 20), "--block-size"),
                   metavar="N|P:D", help=f"KV block size, or prefill's:decode's (default "
                                         f"{d.prefill_block_size})")
    c.add_argument("--device", type=v.choice(DEVICES, "device"),
                   help="cpu | cuda (default: what this machine has)")
    c.add_argument("--kv-buffer-device", type=v.choice(KV_BUFFER_DEVICES, "kv buffer device"),
                   help="where the connector's buffer lives, cpu | cuda (default: the device)")
    c.add_argument("--tp", type=v.pair(v.whole(1, v.MAX_GPUS), "--tp"), metavar="N|P:D",
                   help="tensor parallel size, or prefill's:decode's (default 1)")
    c.add_argument("--dtype", type=v.choice(DTYPES, "dtype"), help=f"model dtype (default {d.dtype})")
    c.add_argument("--max-model-len", type=v.whole(16, 10_000_000), metavar="TOKENS",
                   help=f"every server's --max-model-len (default {d.max_model_len})")
    c.add_argument("--compile", type=v.choice(COMPILE_MODES, "compile mode"),
                   help="default: vLLM's (torch.compile, CUDA graphs); eager: --enforce-eager")
    c.add_argument("--network", type=v.choice(NETWORKS, "network"),
                   help="local: one host; netns: prefill and decode in network namespaces of "
                        "their own, UCX over TCP on a veth link (root; docs/two-host.md)")
    c.add_argument("--async-scheduling", type=v.choice(ASYNC_SCHEDULING, "async scheduling"),
                   help="on: --async-scheduling, off: --no-async-scheduling, every server (GPU)")
    c.add_argument("--spec-decode", type=v.choice(SPEC_DECODE_METHODS, "spec decode method"),
                   help="speculative decoding on the decode and the baseline; a draft model "
                        "(draft_p1_d3), EAGLE head (eagle_p1_d3) or MTP head (mtp_p3_d3) on "
                        "the prefill too, with its own count")
    c.add_argument("--prefix-reuse", action="store_true", default=None,
                   help="prompts share a long prefix that the decode holds in its prefix cache")
    c.add_argument("--chunked-prefill", type=v.whole(1, 10_000_000), metavar="TOKENS",
                   help="prefill at most TOKENS per step on every server (--max-num-batched-tokens)")
    c.add_argument("--cudagraph-mode", type=v.choice(CUDAGRAPH_MODES, "cudagraph mode"),
                   help="--compilation-config cudagraph_mode, every server (GPU)")
    c.add_argument("--kv-layout", type=v.choice(KV_LAYOUTS, "kv layout"),
                   help="VLLM_KV_CACHE_LAYOUT of the decode server only (GPU)")
    c.add_argument("--kv-connector", type=v.choice(tuple(KV_CONNECTORS), "kv connector"),
                   metavar="NAME", help=_connector_help(d.kv_connector))
    c.add_argument("--kv-cache-dtype", type=v.pair(v.choice(KV_CACHE_DTYPES, "kv cache dtype"),
                                                   "--kv-cache-dtype"),
                   metavar="DTYPE|P:D", help=f"--kv-cache-dtype of the servers "
                                             f"({', '.join(KV_CACHE_DTYPES)}); the baseline runs the decode's")
    c.add_argument("--weather", type=v.choice(tuple(WEATHERS), "weather"), metavar="NAME",
                   help=f"the workload and environment the pair is judged in "
                        f"({', '.join(WEATHERS)}; docs/weather.md; default {d.weather})")
    c.add_argument("--weather-param", action="append", type=v.weather_param(),
                   metavar="NAME=NUMBER", help="a parameter of the weather (repeatable), e.g. "
                                               "in_flight=96")
    c.add_argument("--server-arg", action="append", type=v.text("--server-arg"), metavar="ARG",
                   help="an extra vLLM argument of every server of the --model cell (repeatable)")


def _connector_help(default: str) -> str:
    from harness.connectors import KV_CONNECTORS

    named = [f"{value} ({row.vllm_name}{'' if row.driven else ', not driven'})"
             for value, row in KV_CONNECTORS.items()]
    return f"what moves the KV (default {default}): " + ", ".join(named)


def add_canary(p: argparse.ArgumentParser) -> None:
    from harness.core.cell import FAULTS

    g = p.add_argument_group(CANARY_GROUP)
    g.add_argument("--fault", type=v.choice(FAULTS, "fault"), metavar="NAME",
                   help=f"make the cell a canary with this fault ({', '.join(FAULTS)}); with a "
                        "profile, only its canaries of this fault")
    g.add_argument("--fault-block", type=v.fault_block(), metavar="first|last|N",
                   help="which received block a server-side canary breaks (default first)")
    g.add_argument("--fault-share", type=v.number(0, 1, low_open=True, what="a share"),
                   metavar="S", help="a server-side canary breaks this share of the questions only "
                                     "(0-1]")
    g.add_argument("--fault-after", type=v.whole(0, 9_999_999), metavar="N",
                   help="a server-side canary breaks no request before the proxy's (N+1)-th "
                        "(a fault that starts late, under a long weather)")


def add_evaluation(p: argparse.ArgumentParser) -> None:
    from harness.core.options import RunOptions
    from harness.eval.lmeval import TASKS_DIR

    o = RunOptions()
    tasks = ("auto",) + tuple(sorted(t.stem for t in TASKS_DIR.glob("*.yaml")))
    ev = p.add_argument_group("evaluation")
    ev.add_argument("--limit", type=v.whole(1, 1_000_000), metavar="N",
                    help=f"questions at a cell's first look (default {o.limit})")
    ev.add_argument("--task", default=o.task, type=v.choice(tasks, "task"),
                    help=f"lm-eval task the harness ships ({', '.join(tasks)}; auto: by model)")
    ev.add_argument("--dataset-dir", type=v.existing("dir", "--dataset-dir"), metavar="DIR",
                    help="local GSM8K-style jsonl directory (holding test.jsonl)")
    ev.add_argument("--num-fewshot", type=v.whole(0, 1000), metavar="N",
                    help="few-shot examples per question (default: the task's)")
    ev.add_argument("--concurrency", type=v.whole(1, 4096), default=o.concurrency, metavar="N",
                    help=f"questions in flight (default {o.concurrency})")
    ev.add_argument("--seed", type=v.whole(0, 2**32 - 1), default=o.seed, metavar="N",
                    help=f"sampling seed of every request (default {o.seed})")
    ev.add_argument("--max-gen-toks", type=v.whole(1, 1_000_000), metavar="N",
                    help="tokens generated per answer at most (default: the task's)")
    ev.add_argument("--no-noise-floor", action="store_true", help="skip the A/A baseline re-run")
    ev.add_argument("--no-kv-digest", action="store_true",
                    help="P/D servers do not hash each request's prompt KV (no kv-digest check)")
    ev.add_argument("--repeats", type=v.whole(1, 10_000), default=o.repeats, metavar="N",
                    help="evaluate every cell N times on different question samples, servers kept "
                         "up (calibration: false-alarm and canary rates); one record per repeat")
    ev.add_argument("--sample-seed", type=v.whole(0, 2**32 - 1), metavar="N",
                    help="draw the questions at random with this seed instead of the first N")
    ev.add_argument("--alpha", type=v.number(0, 0.5, low_open=True), default=o.alpha,
                    metavar="P", help=f"each error rate of the gate (default {o.alpha})")
    ev.add_argument("--max-questions", type=v.whole(1, 1_000_000), default=o.max_questions,
                    metavar="N", help="question budget of a cell: undecided cells are asked more "
                                      "questions (looks at --limit, 2x, 4x, ... this), then "
                                      f"INCONCLUSIVE (default {o.max_questions})")
    ev.add_argument("--margin", type=v.number(0, 100, low_open=True), default=100 * o.margin,
                    metavar="PTS", help="PASS means P/D is not worse than the baseline by more "
                                        f"than this many accuracy points (default {100 * o.margin:.0f})")


def add_servers(p: argparse.ArgumentParser, *, parallel_groups: bool = True) -> None:
    from harness.core.options import GPU_LAYOUTS, SERVER_STARTS, RunOptions

    o = RunOptions()
    s = p.add_argument_group("servers")
    s.add_argument("--startup-timeout", type=v.number(0, 7 * 24 * 3600, low_open=True),
                   default=o.startup_timeout_s, metavar="S",
                   help="seconds a server may take to become healthy (default 600: three servers "
                        "starting together on a loaded 2-core machine took up to 7 min)")
    s.add_argument("--max-starting", type=v.whole(0, 100_000), metavar="N",
                   help="at most N servers of this host in start-up at once (0: no cap); the "
                        "others wait for a slot and their --startup-timeout counts from it "
                        "(default: $PD_ACCURACY_MAX_STARTING, else no cap)")
    s.add_argument("--server-start", type=v.choice(SERVER_STARTS, "server start"),
                   help="exec: each server a fresh interpreter; template: each a fork of one "
                        "interpreter per run and core set that imported vLLM already; auto: "
                        "template for pinned TP1 CPU servers, exec for the rest (default: "
                        "$PD_ACCURACY_SERVER_START, else auto)")
    if parallel_groups:
        s.add_argument("--parallel-groups", type=v.count_or_auto(1, 4096), metavar="N|auto",
                       help="baseline groups run at once, each its own process (auto: on GPUs "
                            "as many as their free memory and the cores allow; CPU runs keep "
                            "one group and start the next ahead). Default: "
                            "$PD_ACCURACY_PARALLEL_GROUPS, else auto")
    s.add_argument("--gpu-layout", type=v.choice(GPU_LAYOUTS, "gpu layout"), default=o.gpu_layout,
                   help="CUDA cells: all servers from the first visible GPU (shared), or the "
                        "prefill's and the decode's GPUs apart (split)")
    s.add_argument("--kv-cache-bytes", type=v.whole(1, 1 << 50), metavar="BYTES",
                   help="KV cache per server (default: 512 MiB, enough for the tiny zoo models)")


def add_results_dir(p: Any, default: str | None, what: str = "where the records go", *,
                    read: bool = False, required: bool = False, repeat: bool = False) -> None:
    """--results-dir: a folder of records the command writes, or reads (`read`)."""
    # a folder read is checked by the command (it says what it looked for there)
    kind = v.text("--results-dir") if read else v.writable("dir", "--results-dir")
    p.add_argument("--results-dir", default=default, type=kind, metavar="DIR", required=required,
                   action="append" if repeat else "store",
                   help=what + (f" (default {default})" if default else "")
                        + (" (repeatable)" if repeat else ""))


def add_junit(p: Any) -> None:
    p.add_argument("--junit-xml", type=v.writable("file", "--junit-xml"), metavar="FILE",
                   help="also write the verdicts as JUnit XML")


def add_dry_run(p: Any, what: str) -> None:
    p.add_argument("--dry-run", action="store_true", help=what)


def add_verbose(p: Any) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does (INFO)")


def add_json(p: Any, what: str = "print JSON instead of tables") -> None:
    p.add_argument("--json", action="store_true", help=what)


def add_out(p: Any, what: str, default: str | None = None) -> None:
    p.add_argument("--out", default=default, type=v.writable("file", "--out"), metavar="FILE",
                   help=what + (f" (default {default})" if default else ""))


def add_vllm(p: Any, what: str, *, allow_none: bool = False) -> None:
    p.add_argument("--vllm", type=v.releases(allow_none), metavar="RELEASES",
                   help=f"{what}: comma-separated versions, .whl files or vLLM checkouts "
                        "(docs/releases.md)" + ("; none: no release step" if allow_none else ""))


def add_run_arguments(p: argparse.ArgumentParser, *, releases: bool = True) -> None:
    """Every option of `pd-accuracy run`, in its help groups."""
    from harness.core.options import RunOptions

    add_selection(p)
    add_platform(p)
    dep = p.add_argument_group("a deployment the harness did not start")
    dep.add_argument("--deployment", metavar="FILE", type=v.existing("file", "--deployment"),
                     help="judge a running P/D deployment described by FILE (docs/deployment.md) "
                          "instead of starting servers; no --profile or cell options with it")
    add_trust_arguments(dep)
    add_cell(p)
    add_canary(p)
    add_evaluation(p)
    add_servers(p)
    out = p.add_argument_group("output")
    add_results_dir(out, RunOptions().results_dir)
    add_junit(out)
    if releases:
        add_vllm(out, "run once per vLLM release, each in its own cached environment, records "
                      "under RESULTS_DIR/vllm-RELEASE")
    add_dry_run(out, "print the run's settings and each cell's server commands; start nothing")
    add_verbose(out)
    out.add_argument("--run-id", type=v.safe_name("--run-id"),   # a packed run's child's
                     help=argparse.SUPPRESS)


def run_parser(releases: bool = False) -> argparse.ArgumentParser:
    """`pd-accuracy run`'s own parser (without the release axis unless `releases`), for callers
    that build RunOptions from run arguments: the pytest plugin, a packed run's children."""
    p = OneLineParser(prog="pd-accuracy run")
    add_run_arguments(p, releases=releases)
    return p


def add_trust_arguments(p: Any) -> None:
    """--allow-auth-env (a deployment's extra token variables): the user's word, never the
    file's."""
    p.add_argument("--allow-auth-env", action="append", type=v.env_name(), metavar="NAME",
                   help="with --deployment: let the file name NAME as an auth_env besides the "
                        "PD_* variables (docs/security.md; repeatable)")


__all__ = ["CANARY_GROUP", "CELL_GROUP", "OneLineParser", "SELECTION_GROUP", "add_canary",
           "add_cell", "add_dry_run", "add_evaluation", "add_json", "add_junit", "add_out",
           "add_platform", "add_results_dir", "add_selection", "add_servers", "add_verbose",
           "add_run_arguments", "add_trust_arguments", "add_vllm", "run_parser"]
