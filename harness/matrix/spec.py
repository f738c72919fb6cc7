"""The matrix YAML -> MatrixSpec: model facts, profiles and their selectors.

The YAML (fields documented at the top of harness/matrix/default.yaml, shape in schema.json)
only declares data: axes whose cartesian product gives cells (expand), model facts for the
validity rules (a ModelCatalog), and selectors for known failures and exclusions. `load_matrix`
checks the shape against the schema, then what the schema cannot say: that hybrid block sizes
name a hybrid model, that includes name profiles, and that includes do not loop.
"""
from __future__ import annotations


import dataclasses
import difflib
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.core.bounded_yaml import BoundedYAMLError, load_bounded
from harness.core.catalog import BlockSizeProvider, ModelCatalog, ModelInfo
from harness.core.cell import Cell, weather_items
from harness.core.model_config import facts_from_config, find_config, read_config
from harness.core.vllm_releases import ReleaseError, parse_releases
from harness.matrix.axes import PAIR_AXES, as_list, env_items, pairs
from harness.matrix.errors import MatrixError, UnknownProfileError
from harness.matrix.schema import check_structure
from harness.zoo import registry, required_block_size

MATRIX_DIR = Path(__file__).resolve().parent
DEFAULT_MATRIX = MATRIX_DIR / "default.yaml"


# ---- selectors ------------------------------------------------------------------------------

def release_specifiers(text: Any) -> SpecifierSet:
    """A `vllm:` selector value (PEP 440 specifiers, e.g. ">=0.26,<0.27" or "==0.34.*")."""
    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier:
        raise MatrixError(f"vllm: {str(text)[:80]!r} is no PEP 440 version specifier set "
                          "(e.g. \">=0.26,<0.27\" or \"==0.34.*\")") from None


def release_in(release: str, specifiers: SpecifierSet) -> bool:
    """Whether vLLM `release` lies in `specifiers`: a local version (0.34.0+cu130) or a dev build
    counts as its release; a version that is no PEP 440 version matches nothing."""
    try:
        return specifiers.contains(Version(release), prereleases=True)
    except InvalidVersion:
        return False


def _glob_match(pattern: Any, value: Any) -> bool:
    if isinstance(pattern, str) and isinstance(value, str):
        return fnmatch.fnmatchcase(value, pattern)
    return pattern == value


@dataclass(frozen=True)
class Selector:
    """Matches cells by field values (any-of lists, fnmatch globs for strings).

    Keys: every axis name, the Cell's own field names, `id` (glob on cell_id), and model facts
    `kind`/`family`/`ssm`. `extra_args` matches when the cell has all the given args; `extra_env`
    (`weather_params`) when the cell's env (weather parameters) contains the given mapping.
    """

    criteria: tuple[tuple[str, Any], ...]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "Selector":
        """A schema-checked `match:` mapping -> Selector (MatrixError: a `vllm:` that is no
        PEP 440 specifier set)."""
        criteria = []
        for key, value in data.items():
            if key == "vllm":
                value = release_specifiers(value)
            elif key in PAIR_AXES:
                value = tuple(pairs(value))
            elif key == "extra_env":
                value = env_items(value)
            elif key == "weather_params":
                value = weather_items(value)
            elif key == "extra_args":
                value = tuple(str(v) for v in as_list(value))
            else:
                value = tuple(as_list(value))
            criteria.append((key, value))
        return cls(tuple(criteria))

    @property
    def releases(self) -> SpecifierSet | None:
        """The vLLM releases this selector is bounded to (its `vllm:`), or None: any."""
        return dict(self.criteria).get("vllm")

    def matches(self, cell: Cell, model: ModelInfo, release: str | None = None) -> bool:
        """Whether `cell` (of `model`) on vLLM `release` is selected. A `vllm:` bound matches a
        release inside it; an unknown release (None: no vLLM probed) is not excluded by it."""
        for key, wanted in self.criteria:
            if key == "vllm":
                if release is not None and not release_in(release, wanted):
                    return False
            elif key in PAIR_AXES:
                p_field, d_field = PAIR_AXES[key]
                if (getattr(cell, p_field), getattr(cell, d_field)) not in wanted:
                    return False
            elif key == "extra_args":
                if not all(arg in cell.extra_args for arg in wanted):
                    return False
            elif key == "extra_env":
                if not set(wanted) <= set(cell.extra_env):
                    return False
            elif key == "weather_params":
                if not set(wanted) <= set(cell.weather_params):
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
    fails_with: str | None = None     # expected failures: the regex the verdict's reason matches

    @classmethod
    def parse_list(cls, data: list[Mapping[str, Any]] | None) -> tuple["Rulebook", ...]:
        """A schema-checked list of {match, reason[, fails_with]} -> Rulebooks (reasons on one
        line; a fails_with that is no regular expression is a MatrixError)."""
        books = []
        for entry in data or ():
            pattern = entry.get("fails_with")
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise MatrixError(f"fails_with {pattern!r} is no regular expression: {exc}") from None
            selector = Selector.parse(entry["match"])
            reason = " ".join(entry["reason"].split())
            if selector.releases is not None:   # the report names the releases it was measured on
                reason = f"declared for vLLM {selector.releases}: {reason}"
            books.append(cls(selector, reason, pattern))
        return tuple(books)


# ---- spec -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    include: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    grids: tuple[Mapping[str, Any], ...] = ()
    # covering arrays: every value pair of the axes a valid cell holds, not their product
    pairwise: tuple[Mapping[str, Any], ...] = ()
    expected_failures: tuple[Rulebook, ...] = ()
    exclude: tuple[Rulebook, ...] = ()
    # the pipeline's release step (docs/releases.md): this profile's own, never an include's
    vllm_releases: tuple[str, ...] = ()

    @classmethod
    def parse(cls, name: str, body: Mapping[str, Any] | None) -> "Profile":
        """A schema-checked profile mapping -> Profile."""
        body = body or {}
        return cls(
            name=name,
            description=" ".join(str(body.get("description", "")).split()),
            include=tuple(str(p) for p in as_list(body.get("include") or [])),
            defaults=dict(body.get("defaults") or {}),
            grids=tuple(dict(g or {}) for g in body.get("grids") or []),
            pairwise=tuple(dict(g or {}) for g in body.get("pairwise") or []),
            expected_failures=Rulebook.parse_list(body.get("expected_failures")),
            exclude=Rulebook.parse_list(body.get("exclude")),
            vllm_releases=tuple(str(r).strip() for r in body.get("vllm_releases") or ()),
        )


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


def _parse_models(data: Mapping[str, Any] | None, block_sizes: Mapping[str, Any] | None,
                  where: str) -> dict[str, ModelInfo]:
    models = {str(name): ModelInfo(name=str(name), **(facts or {})) for name, facts in (data or {}).items()}
    for name, sizes in (block_sizes or {}).items():
        if name not in models or not models[name].is_hybrid:
            raise MatrixError(f"{where}: hybrid_block_sizes.{name}: declare it under models with kind: hybrid")
        per_device = dict(sizes) if isinstance(sizes, Mapping) else {"cpu": sizes}
        models[name] = dataclasses.replace(models[name], min_block_size=per_device)
    return models


def config_facts(model: str) -> ModelInfo | None:
    """`model`'s facts from its own config.json (a zoo name's checkpoint, a local path, a hub id
    cached locally); None when there is none here. A bad config.json raises ModelConfigError."""
    known = model in registry.zoo_names() or model in registry.shape_names()
    where = registry.checkpoint_dir(model) if known else model
    config = find_config(str(where))
    if config is None or not config.exists():
        return None
    return ModelInfo(**facts_from_config(model, read_config(config, model)))


def load_matrix(path: str | Path | None = None,
                block_size_provider: BlockSizeProvider | None = None) -> MatrixSpec:
    """Parse and check a matrix YAML (default: harness/matrix/default.yaml).

    Model facts come from each model's config.json where one is here, overridden by the YAML's
    `models:`. The block `block_size: required` means comes from `block_size_provider` first
    (default: the zoo's `required_block_size`), then from the YAML's hybrid_block_sizes, then
    from the smallest block vLLM keeps (computed from config.json).
    """
    path = Path(path) if path else DEFAULT_MATRIX
    where = path.name
    data = _read_extended(path, ())
    check_structure(data, where)
    models = _parse_models(data.get("models"), data.get("hybrid_block_sizes"), where)
    profiles = {str(name): Profile.parse(str(name), body) for name, body in data["profiles"].items()}
    for profile in profiles.values():
        for inc in profile.include:
            if inc not in profiles:
                raise MatrixError(f"{where}: profiles.{profile.name}.include: unknown profile {inc!r}")
        _check_releases(profile, where)
    spec = MatrixSpec(
        path=str(path),
        models=ModelCatalog(models, block_size_provider or required_block_size, config_facts),
        profiles=profiles,
        defaults=dict(data.get("defaults") or {}),
        expected_failures=Rulebook.parse_list(data.get("expected_failures")),
    )
    for name in profiles:
        _include_order(spec, name, ())   # reject include cycles at load time
    return spec


def _check_releases(profile: Profile, where: str) -> None:
    """A profile's vllm_releases must name releases as `run --vllm` would take them (versions,
    existing .whl files or checkouts, each once): else one line, before anything runs."""
    if not profile.vllm_releases:
        return
    try:
        # the names only: which package a version means is the host's, when it runs
        parse_releases(profile.vllm_releases, package="vllm", source="the list")
    except ReleaseError as exc:
        raise MatrixError(f"{where}: profiles.{profile.name}.vllm_releases: {exc}") from None


def _read_yaml(path: Path) -> Any:
    """The bounded loader's value (harness.core.bounded_yaml: size, depth, aliases, duplicate
    keys), before the schema sees it."""
    try:
        return load_bounded(path)
    except BoundedYAMLError as exc:
        raise MatrixError(f"{path.name}: {exc}") from None


def _read_extended(path: Path, seen: tuple[Path, ...]) -> Any:
    """The YAML of `path`, on top of the matrix it `extends:` (``default``: the packaged one;
    else a path relative to this file): its defaults, models, hybrid_block_sizes and profiles
    add to or replace the base's entry by entry, its expected_failures are added."""
    data = _read_yaml(path)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    target = data.pop("extends")
    if not isinstance(target, str) or not target.strip():
        raise MatrixError(f"{path.name}: extends: must be 'default' or a matrix path")
    base_path = DEFAULT_MATRIX if target == "default" else (path.parent / target).resolve()
    if base_path in seen + (path.resolve(),):
        raise MatrixError(f"{path.name}: extends cycle through {base_path.name}")
    base = _read_extended(base_path, seen + (path.resolve(),))
    if not isinstance(base, dict):
        return data
    merged = dict(base)
    for key, value in data.items():
        if key in ("defaults", "models", "hybrid_block_sizes", "profiles") \
                and isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        elif key == "expected_failures" and isinstance(value, list):
            merged[key] = list(base.get(key) or []) + value
        else:
            merged[key] = value
    return merged


def _include_order(spec: MatrixSpec, name: str, stack: tuple[str, ...]) -> None:
    if name in stack:
        raise MatrixError(f"{Path(spec.path).name}: include cycle {' -> '.join(stack + (name,))}")
    for inc in spec.profiles[name].include:
        _include_order(spec, inc, stack + (name,))
