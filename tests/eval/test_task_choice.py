"""Which task a cell asks: by model, and the shared-prefix variant for prefix_reuse cells."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.eval.lmeval import materialize_task
from harness.eval.task_choice import default_data_dir, default_task
from harness.serve.launch.models import ResolvedModel
from harness.zoo import shared_prefix


def model(name: str) -> ResolvedModel:
    return ResolvedModel(name=name, path=name, local=False, hybrid=False, architecture=None)


@pytest.mark.parametrize("name,plain,shared", [
    ("tiny-llama-gsm", "gsm_synth", "gsm_synth_shared"),
    ("Qwen/Qwen3-0.6B", "gsm8k_local", "gsm8k_local_shared"),
])
def test_prefix_reuse_asks_the_shared_prefix_variant(name, plain, shared):
    assert default_task(model(name)) == plain
    assert default_task(model(name), prefix_reuse=True) == shared


def test_the_shared_gsm_synth_data_is_written_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ACCURACY_CACHE", str(tmp_path))
    data = Path(default_data_dir(shared_prefix.SHARED_TASK_NAME))
    assert data == tmp_path / "data" / "gsm_synth_shared"
    assert (data / "test.jsonl").exists() and (data / "train.jsonl").exists()


def test_the_shared_task_yamls_ship_and_fill_in_their_data(tmp_path):
    data = shared_prefix.write_shared_splits(tmp_path / "synth", test_size=2, train_size=2)
    out = materialize_task("gsm_synth_shared", data, tmp_path / "tasks")
    text = (out / "gsm_synth_shared.yaml").read_text()
    assert "task: gsm_synth_shared" in text and str(data.resolve()) in text
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    for split in ("train", "test"):
        (gsm8k / f"{split}.jsonl").write_text("{}\n")
    text = (materialize_task("gsm8k_local_shared", gsm8k, tmp_path / "t2") / "gsm8k_local_shared.yaml").read_text()
    assert "sampler: first_n" in text and "num_fewshot: 5" in text
