"""The declarative matrix: YAML profiles → validated, identified, shardable Cells.

The YAML (schema in the comments at the top of harness/matrix/default.yaml) only declares data:
axes whose cartesian product gives cells, model facts, and selectors for known failures. This
module interprets it:

    load_matrix(path) -> MatrixSpec
    expand(spec, profile, platform) -> Expansion(cells, excluded, notes)   # rules applied
    select(cells, only, keyword) -> cells                                  # --cell / -k
    shard(cells, index, count) -> cells                                    # CI parallelism

Validity rules live in harness/rules.py; expansion keeps a cell, excludes it with the rule's reason
(invalid or unavailable here), or keeps it with `expected_failure` set (xfail).
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from harness.core.cell import Cell
from harness.matrix.rules import (
    EXCLUDING_KINDS,
    BlockSizeProvider,
    ModelCatalog,
    ModelInfo,
    check_cell,
    gpus_needed,
    normalize_cell,
)
from harness.core.platform import PlatformInfo

__all__ = [
    "MATRIX_DIR", "DEFAULT_MATRIX", "MatrixError", "UnknownProfileError", "DuplicateCellIdError",
    "UnknownCellError", "Selector", "Rulebook", "Profile", "MatrixSpec", "Excluded", "Expansion",
    "load_matrix", "expand", "select", "shard", "gpus_needed",
]

MATRIX_DIR = Path(__file__).resolve().parent
DEFAULT_MATRIX = MATRIX_DIR / "default.yaml"

SCALAR_AXES = ("model", "model_tag", "runner", "backend", "device", "kv_buffer_device", "dtype",
               "max_model_len", "fault")
PAIR_AXES = {  # YAML key -> (prefill field, decode field)
    "block_size": ("prefill_block_size", "decode_block_size"),
    "tp": ("prefill_tp", "decode_tp"),
    "instances": ("num_prefill", "num_decode"),
}
LIST_AXES = ("extra_args", "extra_env")
AXES = SCALAR_AXES + tuple(PAIR_AXES) + LIST_AXES
REQUIRED_BLOCK = "required"   # block_size value: the hybrid model's minimum block on that device

SELECTOR_KEYS = set(AXES) | {
    "id", "kind", "family", "ssm", "prefill_block_size", "decode_block_size", "prefill_tp",
    "decode_tp", "num_prefill", "num_decode",
}
PROFILE_KEYS = {"description", "include", "defaults", "grids", "expected_failures", "exclude"}
TOP_KEYS = {"defaults", "models", "hybrid_block_sizes", "expected_failures", "profiles"}
MODEL_KEYS = {"kind", "ssm", "family", "num_kv_heads", "head_dim", "max_position_embeddings"}


class MatrixError(ValueError):
    """The matrix YAML (or a request against it) is malformed. str() is one line."""


class UnknownProfileError(MatrixError):
    pass


class DuplicateCellIdError(MatrixError):
    pass


class UnknownCellError(MatrixError):
    pass


# ---- selectors ------------------------------------------------------------------------------

def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _pairs(value: Any, where: str, allow_required: bool = False) -> list[Any]:
    """`128` | `[16, 64, [64, 128]]` | `{prefill: [..], decode: [..]}` (also as a list item)
    -> [(p, d), ...]."""
    out: list[Any] = []
    for item in _as_list(value):
        if isinstance(item, Mapping):
            if set(item) != {"prefill", "decode"}:
                raise MatrixError(f"{where}: a product needs exactly the keys prefill and decode")
            out.extend(_pairs([[p, d] for p in _as_list(item["prefill"]) for d in _as_list(item["decode"])], where))
        elif allow_required and item == REQUIRED_BLOCK:
            out.append(REQUIRED_BLOCK)
        elif isinstance(item, bool) or item is None:
            raise MatrixError(f"{where}: {item!r} is not a size")
        elif isinstance(item, int):
            out.append((item, item))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, int) for x in item):
            out.append((item[0], item[1]))
        else:
            raise MatrixError(f"{where}: {item!r} is neither a size nor a [prefill, decode] pair")
    return out


def _glob_match(pattern: Any, value: Any) -> bool:
    if isinstance(pattern, str) and isinstance(value, str):
        return fnmatch.fnmatchcase(value, pattern)
    return pattern == value


@dataclass(frozen=True)
class Selector:
    """Matches cells by field values (any-of lists, fnmatch globs for strings).

    Keys: every axis name, the Cell's own field names, `id` (glob on cell_id), and model facts
    `kind`/`family`/`ssm`. `extra_args` matches when the cell has all the given args; `extra_env`
    when the cell's env contains the given mapping.
    """

    criteria: tuple[tuple[str, Any], ...]

    @classmethod
    def parse(cls, data: Any, where: str) -> "Selector":
        if not isinstance(data, Mapping) or not data:
            raise MatrixError(f"{where}: `match` must be a non-empty mapping")
        unknown = set(data) - SELECTOR_KEYS
        if unknown:
            raise MatrixError(f"{where}: unknown selector key(s) {sorted(unknown)}; known: {sorted(SELECTOR_KEYS)}")
        criteria = []
        for key, value in data.items():
            if key in PAIR_AXES:
                value = tuple(_pairs(value, f"{where}.{key}"))
            elif key == "extra_env":
                if not isinstance(value, Mapping):
                    raise MatrixError(f"{where}.extra_env: must be a mapping")
                value = tuple(sorted((str(k), str(v)) for k, v in value.items()))
            elif key == "extra_args":
                value = tuple(str(v) for v in _as_list(value))
            else:
                value = tuple(_as_list(value))
            criteria.append((key, value))
        return cls(tuple(criteria))

    def matches(self, cell: Cell, model: ModelInfo) -> bool:
        for key, wanted in self.criteria:
            if key in PAIR_AXES:
                p_field, d_field = PAIR_AXES[key]
                if (getattr(cell, p_field), getattr(cell, d_field)) not in wanted:
                    return False
            elif key == "extra_args":
                if not all(arg in cell.extra_args for arg in wanted):
                    return False
            elif key == "extra_env":
                if not set(wanted) <= set(cell.extra_env):
                    return False
            else:
                facts = {"id": cell.cell_id, "kind": model.kind, "family": model.family, "ssm": model.ssm}
                actual = facts[key] if key in facts else getattr(cell, key)
                if not any(_glob_match(pattern, actual) for pattern in wanted):
                    return False
        return True


@dataclass(frozen=True)
class Rulebook:
    """A selector with its reason: an expected failure or an explicit exclusion."""

    selector: Selector
    reason: str

    @classmethod
    def parse_list(cls, data: Any, where: str) -> tuple["Rulebook", ...]:
        if data is None:
            return ()
        if not isinstance(data, list):
            raise MatrixError(f"{where}: must be a list of {{match: ..., reason: ...}}")
        out = []
        for i, entry in enumerate(data):
            here = f"{where}[{i}]"
            if not isinstance(entry, Mapping) or set(entry) != {"match", "reason"}:
                raise MatrixError(f"{here}: needs exactly the keys match and reason")
            if not isinstance(entry["reason"], str) or not entry["reason"].strip():
                raise MatrixError(f"{here}: reason must be a non-empty string")
            out.append(cls(Selector.parse(entry["match"], here), " ".join(entry["reason"].split())))
        return tuple(out)


# ---- spec -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    include: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    grids: tuple[Mapping[str, Any], ...] = ()
    expected_failures: tuple[Rulebook, ...] = ()
    exclude: tuple[Rulebook, ...] = ()


@dataclass
class MatrixSpec:
    path: str
    models: ModelCatalog
    profiles: dict[str, Profile]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    expected_failures: tuple[Rulebook, ...] = ()

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            close = difflib.get_close_matches(name, self.profiles, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownProfileError(
                f"unknown profile {name!r}{hint}; {Path(self.path).name} has: {', '.join(self.profiles)}")
        return self.profiles[name]


def _check_axes(data: Any, where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise MatrixError(f"{where}: must be a mapping of axis -> value(s)")
    unknown = set(data) - set(AXES)
    if unknown:
        raise MatrixError(f"{where}: unknown axis {sorted(unknown)}; axes are {', '.join(AXES)}")
    return dict(data)


def _parse_models(data: Any, block_sizes: Any, where: str) -> dict[str, ModelInfo]:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise MatrixError(f"{where}: models must be a mapping name -> facts")
    models: dict[str, ModelInfo] = {}
    for name, facts in data.items():
        facts = dict(facts or {})
        unknown = set(facts) - MODEL_KEYS
        if unknown:
            raise MatrixError(f"{where}: models.{name}: unknown key(s) {sorted(unknown)}; known: {sorted(MODEL_KEYS)}")
        if facts.get("kind", "dense") not in ("dense", "hybrid"):
            raise MatrixError(f"{where}: models.{name}.kind must be dense or hybrid")
        models[str(name)] = ModelInfo(name=str(name), **facts)
    for name, sizes in (block_sizes or {}).items():
        if name not in models or not models[name].is_hybrid:
            raise MatrixError(f"{where}: hybrid_block_sizes.{name}: declare it under models with kind: hybrid")
        per_device = dict(sizes) if isinstance(sizes, Mapping) else {"cpu": sizes}
        if not all(isinstance(v, int) and v > 0 for v in per_device.values()):
            raise MatrixError(f"{where}: hybrid_block_sizes.{name}: sizes must be positive integers")
        models[name] = dataclasses.replace(models[name], min_block_size=per_device)
    return models


def _zoo_block_size_provider() -> BlockSizeProvider | None:
    """The zoo may expose `required_block_size(model, device) -> int | None`; use it if present."""
    try:
        import harness.zoo as zoo
    except ImportError:
        return None
    return getattr(zoo, "required_block_size", None)


def load_matrix(path: str | Path | None = None,
                block_size_provider: BlockSizeProvider | None = None) -> MatrixSpec:
    """Parse and check a matrix YAML (default: harness/matrix/default.yaml)."""
    path = Path(path) if path else DEFAULT_MATRIX
    where = path.name
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixError(f"cannot read matrix {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise MatrixError(f"{where}{at}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, Mapping):
        raise MatrixError(f"{where}: top level must be a mapping")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise MatrixError(f"{where}: unknown top-level key(s) {sorted(unknown)}; known: {sorted(TOP_KEYS)}")
    models = _parse_models(data.get("models"), data.get("hybrid_block_sizes"), where)
    raw_profiles = data.get("profiles") or {}
    if not isinstance(raw_profiles, Mapping) or not raw_profiles:
        raise MatrixError(f"{where}: needs a non-empty `profiles` mapping")
    profiles: dict[str, Profile] = {}
    for name, body in raw_profiles.items():
        here = f"{where}: profiles.{name}"
        body = body or {}
        if not isinstance(body, Mapping):
            raise MatrixError(f"{here}: must be a mapping")
        unknown = set(body) - PROFILE_KEYS
        if unknown:
            raise MatrixError(f"{here}: unknown key(s) {sorted(unknown)}; known: {sorted(PROFILE_KEYS)}")
        grids = body.get("grids") or []
        if not isinstance(grids, list):
            raise MatrixError(f"{here}.grids: must be a list of axis mappings")
        profiles[str(name)] = Profile(
            name=str(name),
            description=" ".join(str(body.get("description", "")).split()),
            include=tuple(str(p) for p in _as_list(body.get("include") or [])),
            defaults=_check_axes(body.get("defaults"), f"{here}.defaults"),
            grids=tuple(_check_axes(g, f"{here}.grids[{i}]") for i, g in enumerate(grids)),
            expected_failures=Rulebook.parse_list(body.get("expected_failures"), f"{here}.expected_failures"),
            exclude=Rulebook.parse_list(body.get("exclude"), f"{here}.exclude"),
        )
    for profile in profiles.values():
        for inc in profile.include:
            if inc not in profiles:
                raise MatrixError(f"{where}: profiles.{profile.name}.include: unknown profile {inc!r}")
    spec = MatrixSpec(
        path=str(path),
        models=ModelCatalog(models, block_size_provider or _zoo_block_size_provider()),
        profiles=profiles,
        defaults=_check_axes(data.get("defaults"), f"{where}: defaults"),
        expected_failures=Rulebook.parse_list(data.get("expected_failures"), f"{where}: expected_failures"),
    )
    for name in profiles:
        _include_order(spec, name, ())   # reject include cycles at load time
    return spec


def _include_order(spec: MatrixSpec, name: str, stack: tuple[str, ...]) -> None:
    if name in stack:
        raise MatrixError(f"{Path(spec.path).name}: include cycle {' -> '.join(stack + (name,))}")
    for inc in spec.profiles[name].include:
        _include_order(spec, inc, stack + (name,))


# ---- expansion ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Excluded:
    cell: Cell
    rule: str
    reason: str


@dataclass
class Expansion:
    profile: str
    platform: PlatformInfo | None      # None: expanded for any machine
    cells: list[Cell]
    excluded: list[Excluded]
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)   # cell_id -> note lines

    def by_id(self) -> dict[str, Cell]:
        return {c.cell_id: c for c in self.cells}


def _options(key: str, value: Any, where: str) -> list[Any]:
    """The values one axis takes in a grid."""
    here = f"{where}.{key}"
    if key in PAIR_AXES:
        return _pairs(value, here, allow_required=(key == "block_size"))
    if key == "extra_args":
        items = _as_list(value)
        if all(isinstance(v, str) for v in items):
            return [tuple(items)]
        if all(isinstance(v, (list, tuple)) for v in items):
            return [tuple(str(a) for a in v) for v in items]
        raise MatrixError(f"{here}: a list of args, or a list of such lists (variants)")
    if key == "extra_env":
        variants = value if isinstance(value, list) else [value]
        if not all(isinstance(v, Mapping) for v in variants):
            raise MatrixError(f"{here}: a mapping, or a list of mappings (variants)")
        return [tuple(sorted((str(k), str(v)) for k, v in m.items())) for m in variants]
    options = _as_list(value)
    if not options:
        raise MatrixError(f"{here}: empty list gives no cells")
    return options


def _grid_cells(axes: Mapping[str, Any], catalog: ModelCatalog, where: str) -> list[Cell]:
    keys = [k for k in AXES if k in axes]
    if "model" not in keys:
        raise MatrixError(f"{where}: no model (set it in the grid, the profile's or the top-level defaults)")
    cells = []
    for combo in itertools.product(*(_options(k, axes[k], where) for k in keys)):
        fields: dict[str, Any] = {}
        for key, value in zip(keys, combo):
            if key in PAIR_AXES:
                fields[PAIR_AXES[key][0]], fields[PAIR_AXES[key][1]] = (value, value) \
                    if value == REQUIRED_BLOCK else value
            else:
                fields[key] = value
        if fields.get("prefill_block_size") == REQUIRED_BLOCK:
            device = fields.get("device", Cell.__dataclass_fields__["device"].default)
            need = catalog.min_block_size(fields["model"], device)
            if need is None:
                raise MatrixError(
                    f"{where}: block_size: required, but no minimum block size is known for "
                    f"{fields['model']} on {device}; add it under hybrid_block_sizes")
            fields["prefill_block_size"] = fields["decode_block_size"] = need
        try:
            cells.append(Cell(**fields))
        except TypeError as exc:
            raise MatrixError(f"{where}: {exc}") from exc
    return cells


@dataclass
class _Candidate:
    cell: Cell
    excluded: Excluded | None = None
    xfail: list[str] = field(default_factory=list)


def _collect(spec: MatrixSpec, name: str) -> list[_Candidate]:
    """Cells of a profile and its includes, with that level's selectors applied."""
    profile = spec.profile(name)
    candidates: list[_Candidate] = []
    for inc in profile.include:
        candidates.extend(_collect(spec, inc))
    for i, grid in enumerate(profile.grids):
        axes = {**spec.defaults, **profile.defaults, **grid}
        where = f"{Path(spec.path).name}: profiles.{name}.grids[{i}]"
        candidates.extend(_Candidate(normalize_cell(c, spec.models)) for c in _grid_cells(axes, spec.models, where))
    for cand in candidates:
        model = spec.models.get(cand.cell.model)
        for book in profile.exclude:
            if cand.excluded is None and book.selector.matches(cand.cell, model):
                cand.excluded = Excluded(cand.cell, f"profile-exclude:{name}", book.reason)
        cand.xfail.extend(b.reason for b in profile.expected_failures if b.selector.matches(cand.cell, model))
    return candidates


def expand(spec: MatrixSpec, profile: str, platform: PlatformInfo | None = None) -> Expansion:
    """All cells of `profile` (with includes), split into runnable and excluded-with-reason.

    `platform=None` expands for any machine (pipeline generation): only invalid cells are
    excluded. Pass `PlatformInfo.detect()` (or `harness.serve.vllm_features.detect_platform()` to also check the installed
    vLLM) to exclude what this machine cannot run, or `PlatformInfo.from_spec("cuda:8")` to
    see what a bigger one would.
    """
    seen: dict[str, _Candidate] = {}
    for cand in _collect(spec, profile):
        cid = cand.cell.cell_id
        if cid in seen:
            if seen[cid].cell != cand.cell:
                first, second = seen[cid].cell.to_dict(), cand.cell.to_dict()
                diff = {k: (first[k], second[k]) for k in first if first[k] != second[k]}
                raise DuplicateCellIdError(
                    f"profile {profile}: two different cells share the id {cid} (they differ in {diff}); "
                    "give one a model_tag or drop the duplicate")
            seen[cid].xfail.extend(r for r in cand.xfail if r not in seen[cid].xfail)
            continue
        seen[cid] = cand
    cells: list[Cell] = []
    excluded: list[Excluded] = []
    notes: dict[str, tuple[str, ...]] = {}
    for cid, cand in seen.items():
        model = spec.models.get(cand.cell.model)
        xfail = list(cand.xfail) + [b.reason for b in spec.expected_failures
                                    if b.selector.matches(cand.cell, model)]
        if cand.excluded is not None:
            excluded.append(cand.excluded)
            continue
        problems = check_cell(cand.cell, platform, spec.models)
        blocking = [p for p in problems if p.kind in EXCLUDING_KINDS]
        if blocking:
            excluded.append(Excluded(cand.cell, blocking[0].rule, blocking[0].message))
            continue
        xfail += [p.message for p in problems if p.kind == "xfail"]
        note_lines = tuple(f"{p.rule}: {p.message}" for p in problems if p.kind == "note")
        if note_lines:
            notes[cid] = note_lines
        reasons = list(dict.fromkeys(xfail))
        cells.append(cand.cell.replace(expected_failure="; ".join(reasons)) if reasons else cand.cell)
    return Expansion(profile=profile, platform=platform, cells=cells, excluded=excluded, notes=notes)


# ---- selection and sharding -----------------------------------------------------------------

_KEYWORD_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def _keyword_matches(expression: str, cell_id: str) -> bool:
    """pytest -k style: words are case-insensitive substrings of the id; and/or/not/()."""
    tokens = _KEYWORD_TOKEN.findall(expression)
    if not tokens:
        return True
    python = []
    for tok in tokens:
        if tok in ("and", "or", "not", "(", ")"):
            python.append(tok)
        else:
            python.append(str(tok.lower() in cell_id.lower()))
    try:
        return bool(eval(" ".join(python), {"__builtins__": {}}, {}))  # only True/False/and/or/not/()
    except SyntaxError as exc:
        raise MatrixError(f"keyword expression {expression!r} is not valid (use words with and/or/not/())") from exc


def select(cells: Sequence[Cell], only: Sequence[str] | None = None, keyword: str | None = None) -> list[Cell]:
    """Cells named in `only` (exact ids or globs) and matching the -k style `keyword`.

    An `only` entry that matches no cell raises UnknownCellError naming the closest ids.
    """
    chosen = list(cells)
    if only:
        ids = [c.cell_id for c in cells]
        wanted: set[str] = set()
        for entry in only:
            hits = [i for i in ids if fnmatch.fnmatchcase(i, entry)] if any(ch in entry for ch in "*?[") \
                else [i for i in ids if i == entry]
            if not hits:
                close = difflib.get_close_matches(entry, ids, n=3, cutoff=0.5)
                hint = f"; closest: {', '.join(close)}" if close else ""
                raise UnknownCellError(f"no cell {entry!r} in this expansion{hint}")
            wanted.update(hits)
        chosen = [c for c in chosen if c.cell_id in wanted]
    if keyword:
        chosen = [c for c in chosen if _keyword_matches(keyword, c.cell_id)]
    return chosen


def shard(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """The cells of shard `index` (0-based) out of `count`, deterministically.

    Cells with equal GPU needs and baseline_key form one group (they reuse one baseline server
    and one lease shape), and a group never splits across shards. Groups are placed largest
    first onto the least-loaded shard (ties: lower shard index; group order: size, then key),
    so every cell lands in exactly one shard and the split depends only on the cell list.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}: need count >= 1 and 0 <= index < count")
    groups: dict[tuple[int, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((gpus_needed(cell)["total"], cell.baseline_key), []).append(cell)
    order = sorted(groups, key=lambda k: (-len(groups[k]), k))
    loads = [0] * count
    mine: set[str] = set()
    for key in order:
        target = min(range(count), key=lambda s: (loads[s], s))
        loads[target] += len(groups[key])
        if target == index:
            mine.update(c.cell_id for c in groups[key])
    return [c for c in cells if c.cell_id in mine]


def iter_profiles(spec: MatrixSpec) -> Iterable[Profile]:
    return spec.profiles.values()
