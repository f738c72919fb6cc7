"""RunOptions: every run-wide setting that is not part of a cell's identity, typed, with its one
default. The CLI (`harness.cli.run.options_from`), the pytest plugin (both modes, through the same
parser) and the farm's `pd-accuracy run` steps all build it the same way; `__post_init__` rejects
bad values with one line (UsageError), before any server starts."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GPU_LAYOUTS = ("shared", "split")
# how a server process starts: "exec" a fresh interpreter per server, or "template" a fork of
# one interpreter per run that imported vLLM already (harness.serve.template.server)
SERVER_STARTS = ("auto", "exec", "template")


class UsageError(ValueError):
    """Bad input: reported as one line, exit 2, before any server starts."""


@dataclass(frozen=True)
class RunOptions:
    # which questions
    limit: int = 50                       # questions at a cell's first look
    max_questions: int = 400              # its question budget: looks at limit, 2 limit, ... this
    task: str = "auto"                    # lm-eval task; "auto": the model's own (zoo) or GSM8K
    dataset_dir: str | None = None        # local GSM8K-style jsonl directory
    num_fewshot: int | None = None        # None: the task YAML's own
    seed: int = 1234
    sample_seed: int | None = None        # draw questions at random with this seed
    repeats: int = 1                      # evaluations per cell on different samples (calibration)
    # how they are asked
    concurrency: int = 16                 # lm-eval num_concurrent (on CPU twice as fast as 4)
    max_gen_toks: int | None = None
    top_logprobs: int = 5
    request_timeout_s: float = 300.0
    noise_floor: bool = True              # the A/A re-run of the baseline
    kv_digest: bool = True                # P/D servers hash each request's prompt KV (both sides)
    # how they are judged
    alpha: float = 0.01                   # each error rate of the gate (false FAIL, false PASS)
    margin: float = 0.05                  # PASS: P/D is not worse by more than this (5 pts)
    # where servers run
    startup_timeout_s: float = 600.0      # room for three servers starting on a loaded 2-core host
    max_starting: int | None = None       # servers of this host in start-up at once (None: no cap)
    gpu_layout: str = "shared"
    server_start: str = "auto"            # SERVER_STARTS (auto: harness.serve.deploy.uses_template)
    kv_cache_bytes: int | None = None     # per server (None: the deployment's default)
    # where results go
    results_dir: str = "results/runs"
    profile: str | None = None            # the matrix profile the cells came from (records)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise UsageError("--limit must be at least 1")
        if not 0 < self.alpha < 0.5:
            raise UsageError("--alpha must be in (0, 0.5)")
        if not 0 < self.margin < 1:
            raise UsageError("--margin must be in (0, 100) points")
        if self.max_questions < self.limit:
            raise UsageError(f"--max-questions ({self.max_questions}) must be at least --limit "
                             f"({self.limit})")
        if self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.max_starting is not None and self.max_starting < 0:
            raise UsageError("--max-starting must be 0 (no cap) or more")
        if self.gpu_layout not in GPU_LAYOUTS:
            raise UsageError(f"--gpu-layout must be one of {', '.join(GPU_LAYOUTS)}")
        if self.server_start not in SERVER_STARTS:
            raise UsageError(f"--server-start must be one of {', '.join(SERVER_STARTS)}")
        if self.startup_timeout_s <= 0:
            raise UsageError("--startup-timeout must be positive")

    @property
    def stages(self) -> tuple[int, ...]:
        """Questions at each look: limit, 2 limit, 4 limit, ... below the budget, then it."""
        stages, n = [], self.limit
        while n < self.max_questions:
            stages.append(n)
            n *= 2
        return tuple(stages) + (self.max_questions,)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
