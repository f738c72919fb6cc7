"""The matrix YAML's JSON Schema: it is a valid schema, agrees with the code that reads what it
allows, and a violation reads as one line naming the file and the place in it."""
from __future__ import annotations

import dataclasses
import textwrap

import pytest
import yaml
from jsonschema import Draft202012Validator

from harness.core.catalog import CONFIG_ONLY_FACTS, ModelInfo
from harness.core.cell import Cell
from harness.matrix import DEFAULT_MATRIX, MatrixError, load_matrix
from harness.matrix.axes import AXES, LIST_AXES, PAIR_AXES, SCALAR_AXES
from harness.matrix.schema import SCHEMA, check_structure, path_text


def test_schema_is_a_valid_draft_2020_12_schema():
    Draft202012Validator.check_schema(SCHEMA)


def test_default_matrix_follows_the_schema():
    check_structure(yaml.safe_load(DEFAULT_MATRIX.read_text()), DEFAULT_MATRIX.name)


def test_schema_axes_map_onto_cell_fields():
    cell_fields = {f.name for f in dataclasses.fields(Cell)}
    assert AXES[:3] == ("model", "model_tag", "runner")      # the product order starts here
    assert set(PAIR_AXES) | set(LIST_AXES) <= set(AXES)
    assert set(SCALAR_AXES) <= cell_fields
    assert {f for pair in PAIR_AXES.values() for f in pair} <= cell_fields
    assert set(LIST_AXES) <= cell_fields


def test_selector_keys_are_axes_cell_fields_and_model_facts():
    keys = set(SCHEMA["$defs"]["selector"]["properties"])
    cell_fields = {f.name for f in dataclasses.fields(Cell)}
    assert set(AXES) <= keys
    assert keys - set(AXES) - cell_fields == {"id", "kind", "family", "ssm", "vllm"}


def test_model_facts_are_model_info_fields():
    facts = set(SCHEMA["$defs"]["model"]["properties"])
    assert facts == ({f.name for f in dataclasses.fields(ModelInfo)} - {"name", "min_block_size"}
                     - CONFIG_ONLY_FACTS)


@pytest.mark.parametrize("path,text", [
    ([], ""),
    (["profiles", "smoke", "grids", 0, "block_size"], "profiles.smoke.grids[0].block_size"),
    (["models", "Qwen/Qwen3-0.6B", "kind"], "models.Qwen/Qwen3-0.6B.kind"),
])
def test_path_text(path, text):
    assert path_text(path) == text


@pytest.mark.parametrize("text,message", [
    ("profiles: {smoke: {grids: [{model: d, bakend: X}]}}",
     "m.yaml: profiles.smoke.grids[0]: unknown axis ['bakend']; axes are " + ", ".join(AXES)),
    ("profiles: {smoke: {grids: [{model: d, block_size: [16, [16, 64, 128]]}]}}",
     "m.yaml: profiles.smoke.grids[0].block_size[1]: [16, 64, 128] is neither a size nor a "
     "[prefill, decode] pair"),
    ("profiles: {smoke: {grids: [{model: d, block_size: 64.0}]}}",
     "m.yaml: profiles.smoke.grids[0].block_size: 64.0 is neither a size nor a [prefill, decode] pair"),
    ("profiles: {smoke: {grids: [{model: d, tp: {prefill: 1, decod: 2}}]}}",
     "m.yaml: profiles.smoke.grids[0].tp: a product needs exactly the keys prefill and decode"),
    ("profiles: {smoke: {grids: [{model: d, runner: []}]}}",
     "m.yaml: profiles.smoke.grids[0].runner: empty list gives no cells"),
    ("profiles: {smoke: {grids: [{model: [d, 5]}]}}",
     "m.yaml: profiles.smoke.grids[0].model[1]: 5 is not a string"),
    ("profiles: {smoke: {grids: [{model: d, extra_env: [{A: 1}, 2]}]}}",
     "m.yaml: profiles.smoke.grids[0].extra_env[1]: a mapping, or a list of mappings (variants)"),
    ("models: {d: {kind: sparse}}\nprofiles: {smoke: {}}",
     "m.yaml: models.d.kind: must be dense or hybrid"),
    ("models: {d: {num_kv_heads: 0}}\nprofiles: {smoke: {}}",
     "m.yaml: models.d.num_kv_heads: must be a positive integer, got 0"),
    ("models: {h: {kind: hybrid}}\nhybrid_block_sizes: {h: {cpu: -1}}\nprofiles: {smoke: {}}",
     "m.yaml: hybrid_block_sizes.h: sizes must be positive integers"),
    ("profiles: {smoke: {exclude: [{match: {model: d}, reason: ' '}]}}",
     "m.yaml: profiles.smoke.exclude[0].reason: must be a non-empty string"),
    ("profiles: {smoke: {exclude: [{match: {}, reason: r}]}}",
     "m.yaml: profiles.smoke.exclude[0].match: must be a non-empty mapping"),
    ("profiles: {smoke: {exclude: [{match: {block_size: required}, reason: r}]}}",
     "m.yaml: profiles.smoke.exclude[0].match.block_size: 'required' is neither a size nor a "
     "[prefill, decode] pair"),
    ("expected_failures: [{match: {model: d}, reason: r, why: x}]\nprofiles: {smoke: {}}",
     "m.yaml: expected_failures[0]: needs the keys match and reason (and, for an expected failure, fails_with)"),
    ("profiles: {smoke: {includes: [pr]}}",
     "m.yaml: profiles.smoke: unknown key(s) ['includes']; known: description, include, defaults, "
     "grids, pairwise, expected_failures, exclude, vllm_releases"),
    # an unquoted 0.30 is the float 0.3 in YAML: refused, not silently 0.3
    ("profiles: {smoke: {vllm_releases: ['0.29.0', 0.30]}}",
     "m.yaml: profiles.smoke.vllm_releases[1]: a vLLM release is a string: a quoted version "
     "('0.30.0'), a .whl file or a checkout directory, got 0.3"),
    ("profiles: {smoke: {vllm_releases: '0.29.0'}}",
     "m.yaml: profiles.smoke.vllm_releases: must be a list of vLLM releases, e.g. "
     "['0.29.0', '0.32.0']"),
    ("profile: {smoke: {}}",
     "m.yaml: unknown top-level key(s) ['profile']; known: defaults, models, hybrid_block_sizes, "
     "expected_failures, profiles"),
])
def test_schema_violation_is_one_line_naming_the_path(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value) == message


def test_the_shallowest_violation_is_reported(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("profiles: {smoke: {grids: [{model: d, bakend: X}], includes: []}}")
    with pytest.raises(MatrixError, match=r"^m\.yaml: profiles\.smoke: unknown key\(s\) \['includes'\]"):
        load_matrix(path)
