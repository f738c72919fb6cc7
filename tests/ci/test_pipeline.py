"""Buildkite pipeline generation, schema validation and the vLLM test_areas export."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.core.cell import Cell
from harness.ci.pipeline import ANNOTATE_KEY, generate_pipeline, pipeline_yaml
from harness.ci.test_areas import TEST_AREA_FIELDS, export_test_areas, vllm_test_areas_document
from harness.ci.validate import (MAX_STEPS_PER_UPLOAD, PipelineValidationError, count_steps,
                                 is_valid_key, iter_steps, validate_pipeline, validate_uploads)

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
# CI keeps a copy of shared/ beside the clone, as the workspace does.
SHARED_EXAMPLES = REPO.parent / "shared" / "data" / "buildkite" / "examples"


def command_steps(docs):
    return [s for d in docs for s in iter_steps(d) if "command" in s or "commands" in s]


def cell_steps(docs):
    return [s for s in command_steps(docs) if s["key"] != ANNOTATE_KEY]


def only_ids(step) -> list[str]:
    argv = shlex.split(step["commands"][0].replace("$$", "$"))
    return argv[argv.index("--only") + 1].split(",")


def cpu_cells() -> list[Cell]:
    return [Cell(model="tiny-llama-gsm", prefill_block_size=p, decode_block_size=d)
            for d in (16, 128) for p in (16, 64, 128)]


def gpu_cells() -> list[Cell]:
    base = dict(device="cuda", kv_buffer_device="cuda", model="org/Qwen3-0.6B")
    return ([Cell(backend=b, runner=r, prefill_block_size=p, decode_block_size=16, **base)
             for b in ("FLASHINFER", "FLASH_ATTN") for r in ("v1", "v2") for p in (16, 32)]
            + [Cell(backend="FLASH_ATTN", decode_tp=2, **base),
               Cell(backend="TRITON_ATTN", expected_failure="upstream #1234", **base)])


def synthetic_600() -> list[Cell]:
    """600 cells, each with its own baseline (so 600 command steps)."""
    cells = [Cell(model=f"org/model-{m}", backend=b, device="cuda", kv_buffer_device="cuda",
                  decode_block_size=d, prefill_block_size=d, extra_args=(f"--seed={seed}",))
             for m in range(5) for b in ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN")
             for d in (16, 32, 64, 128, 256) for seed in range(4)]
    cells += [c.replace(runner="v2") for c in cells]
    assert len(cells) == 600 and len({c.baseline_key for c in cells}) == 600
    return cells


# ---- the validator itself ---------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((SHARED_EXAMPLES / "valid").glob("*.yml")), ids=lambda p: p.name)
def test_upstream_valid_examples_pass(path):
    validate_pipeline(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", sorted((SHARED_EXAMPLES / "invalid").glob("*.yml")), ids=lambda p: p.name)
def test_invalid_examples_are_rejected(path):
    with pytest.raises(PipelineValidationError):
        validate_pipeline(yaml.safe_load(path.read_text()))


def test_example_sets_are_present():
    assert len(list((SHARED_EXAMPLES / "valid").glob("*.yml"))) == 12
    assert len(list((SHARED_EXAMPLES / "invalid").glob("*.yml"))) == 9


def test_vendored_schema_is_the_shared_copy():
    vendored = REPO / "harness" / "ci" / "schemas" / "buildkite-pipeline-schema.json"
    assert vendored.read_bytes() == (SHARED_EXAMPLES.parent / "pipeline-schema.json").read_bytes()
    assert "MIT" in (vendored.parent / "buildkite-pipeline-schema.LICENSE.txt").read_text()


def test_unescaped_dollar_is_rejected():
    with pytest.raises(PipelineValidationError, match="unescaped"):
        validate_pipeline({"steps": [{"command": "echo $HOME", "key": "a"}]})
    validate_pipeline({"steps": [{"command": "echo $$HOME", "key": "a"}]})


def test_duplicate_keys_and_dangling_depends_on_are_rejected():
    with pytest.raises(PipelineValidationError, match="duplicate"):
        validate_pipeline({"steps": [{"command": "x", "key": "a"}, {"command": "y", "key": "a"}]})
    with pytest.raises(PipelineValidationError, match="unknown step 'nope'"):
        validate_uploads([{"steps": [{"command": "x", "key": "a", "depends_on": ["nope"]}]}])


# ---- generated pipelines ----------------------------------------------------------------------
def test_cells_sharing_a_baseline_share_a_step():
    cells = cpu_cells()
    docs = generate_pipeline(cells, profile="pr")
    steps = cell_steps(docs)
    assert len(steps) == len({c.baseline_key for c in cells}) == 2
    for step in steps:
        ids = only_ids(step)
        assert len({c.baseline_key for c in cells if c.cell_id in ids}) == 1
    assert sorted(i for s in steps for i in only_ids(s)) == sorted(c.cell_id for c in cells)


def test_pr_style_pipeline_shape():
    cells = cpu_cells() + gpu_cells()
    (doc,) = generate_pipeline(cells, profile="pr", timeout_minutes=20)
    validate_pipeline(doc)
    groups = [s for s in doc["steps"] if "group" in s]
    assert {g["group"] for g in groups} == {"tiny-llama-gsm / CPU_ATTN", "Qwen3-0.6B / FLASHINFER",
                                            "Qwen3-0.6B / FLASH_ATTN", "Qwen3-0.6B / TRITON_ATTN"}
    by_key = {s["key"]: s for s in cell_steps([doc])}
    for key, step in by_key.items():
        assert is_valid_key(key)
        assert step["retry"] == {"automatic": [{"exit_status": 3, "limit": 2}]}   # ERROR only
        assert step["timeout_in_minutes"] == 20 * len(only_ids(step))
        assert any(p.endswith("*.json") for p in step["artifact_paths"])
        assert any(p.endswith(".log") for p in step["artifact_paths"])
        assert any(p.endswith(".xml") for p in step["artifact_paths"])
        assert step["env"]["PD_ACCURACY_RESULTS_DIR"] == "results/runs"
        argv = shlex.split(step["commands"][0])
        assert argv[:4] == ["pd-accuracy", "run", "--profile", "pr"]
        assert argv[argv.index("--results-dir") + 1] == "results/runs"
        assert argv[argv.index("--junit-xml") + 1] == f"results/junit/{key}.xml"
        xfail = key.endswith("-xfail")
        assert ("soft_fail" in step) == xfail
        if xfail:
            assert step["soft_fail"] == [{"exit_status": 1}]
            assert only_ids(step) == [gpu_cells()[-1].cell_id]
    queues = {s["agents"]["queue"] for s in by_key.values()}
    # run's shared layout: a TP1 cell's servers share one GPU, a TP2 decode needs two
    assert queues == {"cpu", "gpu-1", "gpu-2"}
    (split,) = generate_pipeline(cells, profile="pr", run_args=["--gpu-layout", "split"])
    # prefill and decode on GPUs of their own: 1+1 GPUs -> gpu-2; 1+2 -> gpu-4
    assert {s["agents"]["queue"] for s in cell_steps([split])} == {"cpu", "gpu-2", "gpu-4"}
    annotate = doc["steps"][-1]
    assert annotate["key"] == ANNOTATE_KEY
    assert annotate["allow_dependency_failure"] is True
    assert annotate["depends_on"] == [g["key"] for g in groups]
    assert annotate["agents"] == {"queue": "cpu"}
    assert any("buildkite-agent artifact download" in c for c in annotate["commands"])
    assert any(c.startswith("pd-accuracy annotate") for c in annotate["commands"])


def test_keys_are_stable_across_generations_and_orders():
    cells = cpu_cells() + gpu_cells()
    keys_a = {s["key"] for s in cell_steps(generate_pipeline(cells, profile="pr"))}
    keys_b = {s["key"] for s in cell_steps(generate_pipeline(cells[::-1], profile="pr"))}
    assert keys_a == keys_b


def test_long_model_names_still_give_valid_keys():
    cell = Cell(model="/models/" + "x" * 300, model_tag=None)
    (doc,) = generate_pipeline([cell], profile="pr")
    assert all(is_valid_key(s["key"]) for s in iter_steps(doc))


def test_custom_queues_pick_smallest_fitting_queue():
    cells = gpu_cells()
    queues = {"0": "c", "8": "big", "2": "pair"}
    docs = generate_pipeline(cells, profile="pr", queues=queues)
    assert {s["agents"]["queue"] for s in cell_steps(docs)} == {"pair"}
    split = generate_pipeline(cells, profile="pr", queues=queues, run_args=["--gpu-layout=split"])
    assert {s["agents"]["queue"] for s in cell_steps(split)} == {"pair", "big"}
    with pytest.raises(ValueError, match="no agent queue"):
        generate_pipeline(cells, profile="pr", queues={0: "cpu", 2: "gpu-2"},
                          run_args=["--gpu-layout", "split"])


def test_600_cells_split_into_valid_uploads():
    cells = synthetic_600()
    # validated once, below (the schema check of 600 steps is the slow part of this file)
    docs = generate_pipeline(cells, profile="nightly", validate=False)
    assert len(docs) >= 2
    assert all(count_steps(doc) <= MAX_STEPS_PER_UPLOAD for doc in docs)
    validate_uploads(docs)     # each upload against the schema, plus keys/depends_on across them
    steps = cell_steps(docs)
    assert sorted(i for s in steps for i in only_ids(s)) == sorted(c.cell_id for c in cells)
    annotates = [s for d in docs for s in d["steps"] if s.get("key") == ANNOTATE_KEY]
    assert len(annotates) == 1 and docs[-1]["steps"][-1] is annotates[0]
    group_keys = [s["key"] for d in docs for s in d["steps"] if "group" in s]
    assert annotates[0]["depends_on"] == group_keys
    assert len(set(group_keys)) == len(group_keys)


def test_a_group_larger_than_an_upload_is_split_into_parts():
    cells = [c for c in synthetic_600() if c.model == "org/model-0" and c.backend == "FLASHINFER"]
    docs = generate_pipeline(cells, profile="nightly", max_steps=12)
    assert len(docs) > 3
    validate_uploads(docs, max_steps=12)
    keys = [s["key"] for d in docs for s in d["steps"] if "group" in s]
    assert keys[0] == "grp-model-0-flashinfer" and keys[1] == "grp-model-0-flashinfer-part2"


def test_parallelism_shards_with_escaped_job_variables():
    cells = cpu_cells() + gpu_cells()
    (shared,) = generate_pipeline(cells, profile="nightly", parallelism=4)
    validate_pipeline(shared)
    # the shared layout: every TP1 cell in one 1-GPU class, each job packs its shard's groups
    shared_steps = {s["key"]: s for s in cell_steps([shared])}
    assert shared_steps["pd-shards-gpu1"]["parallelism"] == 4
    assert shared_steps["pd-shards-gpu1"]["agents"]["queue"] == "gpu-1"
    (doc,) = generate_pipeline(cells, profile="nightly", parallelism=4,
                               run_args=["--gpu-layout", "split"])
    validate_pipeline(doc)
    steps = {s["key"]: s for s in cell_steps([doc])}
    cpu = steps["pd-shards-gpu0"]
    assert cpu["parallelism"] == 2          # capped at the 2 CPU baseline groups
    assert steps["pd-shards-gpu2"]["parallelism"] == 4
    assert "parallelism" not in steps["pd-shards-gpu2-xfail"]      # one cell: no sharding
    assert "parallelism" not in steps["pd-shards-gpu4"]
    assert "--shard" not in steps["pd-shards-gpu4"]["commands"][0]
    command = steps["pd-shards-gpu2"]["commands"][0]
    assert "--shard $$BUILDKITE_PARALLEL_JOB/$$BUILDKITE_PARALLEL_JOB_COUNT" in command
    argv = _shell_argv(command, {"BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "4"})
    assert argv[argv.index("--shard") + 1] == "1/4"
    assert argv[argv.index("--junit-xml") + 1] == "results/junit/pd-shards-gpu2-1.xml"


def test_report_dir_adds_report_command_with_escaped_history_default():
    (doc,) = generate_pipeline(cpu_cells(), profile="nightly", report_dir="results/report")
    annotate = doc["steps"][-1]
    assert annotate["commands"][-2].startswith("pd-accuracy history --results-dir results/runs")
    assert annotate["commands"][-1].startswith("pd-accuracy report --out-dir results/report")
    for command in annotate["commands"][-2:]:
        assert "$${PD_ACCURACY_HISTORY:-results/history.sqlite}" in command
    assert "results/report/**/*" in annotate["artifact_paths"]


def test_yaml_round_trip_is_valid():
    (doc,) = generate_pipeline(cpu_cells() + gpu_cells(), profile="pr")
    assert yaml.safe_load(pipeline_yaml(doc)) == doc


# ---- matrix profiles (harness.matrix) ---------------------------------------------------------
def expand(profile: str, platform: str = "any"):
    from harness import matrix
    from harness.core.platform import PlatformInfo

    spec = None if platform == "any" else PlatformInfo.from_spec(platform)
    return list(matrix.expand(matrix.load_matrix(), profile, spec).cells)


@pytest.mark.parametrize("profile,parallelism", [("smoke", 1), ("pr", 1), ("nightly", 1),
                                                 ("nightly", 8)])
def test_matrix_profiles_give_valid_pipelines(profile, parallelism):
    cells = expand(profile)
    assert cells
    docs = generate_pipeline(cells, profile=profile, parallelism=parallelism)
    validate_uploads(docs)
    steps = cell_steps(docs)
    assert sorted(i for s in steps for i in only_ids(s)) == sorted(c.cell_id for c in cells)
    by_id = {c.cell_id: c for c in cells}
    for step in steps:
        members = [by_id[i] for i in only_ids(step)]
        gpus = max(c.gpus_needed["min_shared"] for c in members)
        assert int(step["env"]["PD_ACCURACY_GPUS"]) >= gpus
        # no TP1 cell on a queue of two GPUs (run packs a TP1 group on one GPU)
        if all(c.gpus_needed["min_shared"] <= 1 for c in members):
            assert int(step["env"]["PD_ACCURACY_GPUS"]) <= 1
        assert ("soft_fail" in step) == all(c.expected_failure for c in members)
        if parallelism == 1:
            assert len({c.baseline_key for c in members}) == 1


def test_nightly_shards_cover_every_cell_once():
    """The sharded steps' --only lists, split by harness.matrix.shard, cover each cell once."""
    from harness import matrix

    cells = expand("nightly")
    (doc,) = generate_pipeline(cells, profile="nightly", parallelism=8)
    by_id = {c.cell_id: c for c in cells}
    seen = []
    for step in cell_steps([doc]):
        members = [by_id[i] for i in only_ids(step)]
        jobs = step.get("parallelism", 1)
        shards = [matrix.shard(members, i, jobs) for i in range(jobs)]
        assert all(shards), f"{step['key']}: an empty shard would make a job fail"
        seen += [c.cell_id for shard in shards for c in shard]
    assert sorted(seen) == sorted(by_id)


def test_generated_commands_parse_with_the_real_cli():
    """Every pd-accuracy command the pipelines contain is accepted by harness.cli.main's parser."""
    from harness.cli.main import build_parser

    parser = build_parser()
    docs = generate_pipeline(expand("nightly"), profile="nightly", parallelism=8,
                             report_dir="results/report", run_args=["--limit", "20"])
    docs += generate_pipeline(expand("smoke", "cpu"), profile="smoke")
    seen = set()
    for step in command_steps(docs):
        for command in step["commands"]:
            command = (command.replace("$$BUILDKITE_PARALLEL_JOB_COUNT", "8")
                       .replace("$$BUILDKITE_PARALLEL_JOB", "0")
                       .replace("$${PD_ACCURACY_HISTORY:-results/history.sqlite}", "h.sqlite"))
            if not command.startswith("pd-accuracy "):
                continue
            args = parser.parse_args(shlex.split(command)[1:])
            seen.add(args.command)
            if args.command == "run":
                assert args.only.split(",") == only_ids(step)
                assert args.results_dir == "results/runs" and args.junit_xml.endswith(".xml")
                assert args.shard in (None, "0/8")
                assert args.limit in (None, 20)
    assert seen == {"run", "annotate", "history", "report"}


# ---- CLI --------------------------------------------------------------------------------------
def test_cli_pipeline_stdout_is_a_valid_upload(capsys):
    from harness.cli.main import main

    assert main(["pipeline", "--profile", "pr"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    validate_pipeline(doc)
    assert doc["steps"][-1]["key"] == ANNOTATE_KEY
    assert {c for s in cell_steps([doc]) for c in only_ids(s)} == {c.cell_id for c in expand("pr")}


def test_cli_pipeline_options(tmp_path, capsys):
    from harness.cli.main import main

    out_dir = tmp_path / "gen"
    assert main(["pipeline", "--profile", "nightly", "--max-steps", "40", "--limit", "10",
                 "--queues", '{"0": "cpu", "1": "h200-1", "2": "h200-2", "4": "h200-4"}',
                 "--out-dir", str(out_dir)]) == 0
    files = sorted(out_dir.glob("pipeline-*.yml"))
    assert len(files) > 1 and capsys.readouterr().out.split() == [str(f) for f in files]
    docs = [yaml.safe_load(f.read_text()) for f in files]
    validate_uploads(docs, max_steps=40)
    steps = cell_steps(docs)
    # the nightly's CPU cells (soaks, the combos CPU array) go to its cpu queue
    assert {s["agents"]["queue"] for s in steps} == {"cpu", "h200-1", "h200-2"}
    # every `pd-accuracy run`, the release step's (from the nightly profile) too
    assert all(" --limit 10" in s["commands"][-1] for s in steps)
    assert "pd-accuracy-vllm-releases" in {s["key"] for s in steps}
    # too many steps for one upload on stdout: refused, nothing printed
    assert main(["pipeline", "--profile", "pr", "--max-steps", "20"]) == 2
    assert main(["pipeline", "--profile", "pr", "--platform", "cpu"]) == 2    # no GPU cell fits
    assert capsys.readouterr().out == ""
    assert main(["pipeline", "--profile", "nosuch"]) == 2
    assert main(["pipeline", "--profile", "pr", "--queues", "[1]"]) == 2
    assert main(["pipeline", "--profile", "pr", "--queues", '{"0": "cpu"}']) == 2   # no GPU queue
    out = tmp_path / "areas.yaml"
    assert main(["pipeline", "--profile", "pr", "--format", "test-areas", "--ci-device", "h200",
                 "--out", str(out)]) == 0
    areas = yaml.safe_load(out.read_text())
    assert areas["group"] and all(set(s) <= TEST_AREA_FIELDS for s in areas["steps"])


# ---- the checked-in bootstrap pipelines -------------------------------------------------------
@pytest.mark.parametrize("name", ["pipeline.yml", "nightly.yml"])
def test_checked_in_buildkite_pipelines_are_valid(name):
    doc = yaml.safe_load((REPO / "buildkite" / name).read_text())
    validate_pipeline(doc)
    commands = " ".join(c for s in command_steps([doc]) for c in s["commands"])
    assert "pd-accuracy pipeline --profile" in commands
    assert "buildkite-agent pipeline upload" in commands


def _shell_argv(command: str, env: dict[str, str]) -> list[str]:
    """argv `pd-accuracy` gets when a job's bash runs `command` (after upload turned $$ to $)."""
    shell = f"pd-accuracy() {{ printf '%s\\n' \"$@\"; }}; {command.replace('$$', '$')}"
    out = subprocess.run(["bash", "-e", "-c", shell], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", **env})
    return out.stdout.splitlines()


def test_nightly_generation_command_takes_schedule_env():
    doc = yaml.safe_load((REPO / "buildkite" / "nightly.yml").read_text())
    (command,) = [c for c in doc["steps"][0]["commands"] if c.startswith("pd-accuracy pipeline")]
    argv = _shell_argv(command, {})
    assert argv[argv.index("--parallelism") + 1] == "8" and "--queues" not in argv
    queues = '{"0": "cpu", "2": "h200x2"}'
    argv = _shell_argv(command, {"PD_ACCURACY_PARALLELISM": "3", "PD_ACCURACY_QUEUES": queues})
    assert argv[argv.index("--parallelism") + 1] == "3"
    assert argv[argv.index("--queues") + 1] == queues
    assert argv[argv.index("--out-dir") + 1] == ".pd-accuracy-pipeline"
    # the releases: the nightly profile's unless the schedule names others (or `none`)
    assert "--vllm" not in argv
    argv = _shell_argv(command, {"PD_ACCURACY_VLLM_RELEASES": "0.31.0,0.32.0"})
    assert argv[argv.index("--vllm") + 1] == "0.31.0,0.32.0"


# ---- vLLM ci-infra test_areas -----------------------------------------------------------------
def test_test_areas_export_matches_the_vllm_format():
    sample = yaml.safe_load((DATA / "vllm_test_areas_disaggregated.yaml").read_text())
    # our field list covers the real file (sanity of TEST_AREA_FIELDS)
    for step in sample["steps"]:
        assert set(step) <= TEST_AREA_FIELDS
    steps = export_test_areas(cpu_cells() + gpu_cells(), profile="nightly", device="h200",
                              setup_commands=["uv pip install --system -e /pd-accuracy"])
    doc = vllm_test_areas_document(steps)
    assert set(doc) == set(sample)                     # group, depends_on, steps
    assert doc["depends_on"] == sample["depends_on"]
    for step in steps:
        assert set(step) <= TEST_AREA_FIELDS
        for field, value in step.items():
            if field in sample["steps"][1]:
                assert type(value) is type(sample["steps"][1][field]), field
        assert {"label", "key", "timeout_in_minutes", "source_file_dependencies",
                "commands"} <= set(step)
        assert is_valid_key(step["key"])
        assert step["commands"][0].startswith("uv pip install")
        assert step["commands"][1].startswith("pd-accuracy run --profile nightly --only ")
    cpu = [s for s in steps if s.get("device") == "cpu"]
    gpu = [s for s in steps if "num_devices" in s]
    assert cpu and gpu and all(s["device"] == "h200" for s in gpu)
    assert all("num_devices" not in s for s in cpu)
    assert {s["num_devices"] for s in gpu} == {1, 2}
    assert [s.get("soft_fail") for s in steps if s["key"].endswith("-xfail")] == [True]
    # the same keys as the Buildkite pipeline, so history and dashboards line up
    keys = {s["key"] for s in cell_steps(generate_pipeline(cpu_cells() + gpu_cells(),
                                                           profile="nightly"))}
    assert {s["key"] for s in steps} == keys


def test_the_nightly_release_axis_is_one_cpu_step_the_annotation_waits_for():
    cells = [Cell(model="tiny-llama-gsm", device="cpu")]
    docs = generate_pipeline(cells, profile="smoke", vllm_releases=["0.30.0", "0.32.0"])
    steps = [s for s in docs[-1]["steps"] if s.get("key") == "pd-accuracy-vllm-releases"]
    assert len(steps) == 1
    step = steps[0]
    assert step["agents"] == {"queue": "cpu"}
    assert step["commands"][-1] == ("pd-accuracy run --profile smoke --vllm 0.30.0,0.32.0 "
                                    "--results-dir results/runs/vllm-releases")
    annotate = next(s for s in docs[-1]["steps"] if s.get("key") == ANNOTATE_KEY)
    assert "pd-accuracy-vllm-releases" in annotate["depends_on"]
    plain = generate_pipeline(cells, profile="smoke")
    assert not any(s.get("key") == "pd-accuracy-vllm-releases" for s in plain[-1]["steps"])


# ---- the release step from the matrix ---------------------------------------------------------
RELEASE_MATRIX = """
models:
  d: {kind: dense, num_kv_heads: 4}
profiles:
  base:
    defaults: {device: cpu, backend: CPU_ATTN}
    grids: [{model: d, block_size: 32}]
  night:
    include: [base]
    vllm_releases: ["0.27.1", "0.29.0"]
"""


def _release_steps(main, capsys, argv: list[str]) -> list[dict]:
    assert main(["pipeline", *argv]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    return [s for s in command_steps([doc]) if s["key"] == "pd-accuracy-vllm-releases"]


def test_the_pipeline_takes_the_release_step_from_the_profile(tmp_path, capsys):
    from harness.cli.main import main

    matrix = tmp_path / "m.yaml"
    matrix.write_text(RELEASE_MATRIX)
    (step,) = _release_steps(main, capsys, ["--matrix", str(matrix), "--profile", "night"])
    assert "--vllm 0.27.1,0.29.0 " in step["commands"][-1]
    # not inherited: a profile without the key gets no release step
    assert _release_steps(main, capsys, ["--matrix", str(matrix), "--profile", "base"]) == []
    # the shipped nightly: the releases of the committed SUMMARY
    (step,) = [s for s in cell_steps(generate_nightly(main, tmp_path, capsys))
               if s["key"] == "pd-accuracy-vllm-releases"]
    assert "--vllm 0.27.1,0.29.0,0.31.0,0.32.0 " in step["commands"][-1]


def generate_nightly(main, tmp_path, capsys) -> list[dict]:
    out = tmp_path / "nightly"
    assert main(["pipeline", "--profile", "nightly", "--out-dir", str(out)]) == 0
    capsys.readouterr()
    return [yaml.safe_load(f.read_text()) for f in sorted(out.glob("pipeline-*.yml"))]


def test_vllm_releases_on_the_command_line_overrides_the_profile(tmp_path, capsys):
    from harness.cli.main import main

    matrix = tmp_path / "m.yaml"
    matrix.write_text(RELEASE_MATRIX)
    base = ["--matrix", str(matrix), "--profile", "night"]
    (step,) = _release_steps(main, capsys, [*base, "--vllm", "0.31.0, 0.32.0"])
    assert "--vllm 0.31.0,0.32.0 " in step["commands"][-1]
    (step,) = _release_steps(main, capsys, ["--matrix", str(matrix), "--profile", "base",
                                            "--vllm", "0.32.0"])
    assert "--vllm 0.32.0 " in step["commands"][-1]
    assert _release_steps(main, capsys, [*base, "--vllm", "none"]) == []


@pytest.mark.parametrize("value,message", [
    ("", "pd-accuracy: error: argument --vllm: the list names no release"),
    ("0.31.0,0.31.0", "pd-accuracy: error: argument --vllm: the list names a release twice: "
                      "0.31.0,0.31.0"),
    ("0.30.0,latest", "pd-accuracy: error: argument --vllm: vLLM release 'latest': expected a "
                      "version (0.29.0), a .whl file or a vLLM checkout directory"),
])
def test_a_bad_vllm_releases_option_is_one_line(tmp_path, capsys, value, message):
    from harness.cli.main import main

    matrix = tmp_path / "m.yaml"
    matrix.write_text(RELEASE_MATRIX)
    assert main(["pipeline", "--matrix", str(matrix), "--profile", "night",
                 "--vllm", value]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [message]
