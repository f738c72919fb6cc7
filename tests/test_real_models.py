"""vLLM CI's expected accuracies as the baseline-health guard, and the task choice for them."""
from harness.core.real_models import REAL_MODELS, expected_reference, real_model
from harness.eval import task_choice
from harness.serve.launch.models import ResolvedModel


def _model(name, random_weights=False):
    return ResolvedModel(name, name, local=False, hybrid=False, architecture=None,
                         random_weights=random_weights)


def test_table_holds_vllm_ci_values():
    assert {n: m.expected for n, m in REAL_MODELS.items()} == {
        "Qwen/Qwen3-0.6B": 0.41, "ibm-granite/granite-4.0-h-tiny": 0.77,
        "google/gemma-3-4b-it": 0.74, "deepseek-ai/DeepSeek-V2-Lite-Chat": 0.65,
        "Qwen/Qwen3.5-0.8B": 0.33}
    assert all(m.tolerance == 0.05 and m.num_fewshot == 5 and not m.chat_template
               for m in REAL_MODELS.values())


def test_reference_only_for_gsm8k_and_known_models():
    assert expected_reference("Qwen/Qwen3-0.6B", "gsm8k").accuracy == 0.41
    assert expected_reference("/models/Qwen3-0.6B", "gsm8k_local").tolerance == 0.05
    assert expected_reference("Qwen/Qwen3-0.6B", "gsm_synth") is None
    assert expected_reference("tiny-llama-gsm", "gsm8k") is None
    assert real_model("someone/else") is None


def test_offline_picks_local_copy_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PD_ACCURACY_GSM8K_DIR", str(tmp_path))
    choice = task_choice.choose_task(_model("Qwen/Qwen3-0.6B"), hub=lambda: False)
    assert choice.task == "gsm8k_local"
    assert "not reachable" in choice.why and str(tmp_path) in choice.why and "\n" not in choice.why


def test_online_picks_lm_evals_gsm8k():
    choice = task_choice.choose_task(_model("Qwen/Qwen3-0.6B"), hub=lambda: True)
    assert choice.task == "gsm8k" and task_choice.default_data_dir("gsm8k") is None


def test_hub_offline_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert task_choice.hub_reachable() is False


def test_zoo_and_random_weight_models_unchanged():
    assert task_choice.choose_task(_model("Qwen/Qwen3-0.6B", random_weights=True),
                                   hub=lambda: True).task == "gsm8k_local"
    assert task_choice.choose_task(_model("tiny-llama-gsm"), hub=lambda: True).task == "gsm_synth"


def test_real_profile_lists_the_five_models_on_the_seed():
    from harness.core.platform import PlatformInfo
    from harness.matrix import expand, load_matrix

    expansion = expand(load_matrix(None), "real", PlatformInfo.from_spec("cuda:8"))
    assert {c.model for c in expansion.cells} | {x.cell.model for x in expansion.excluded} == set(REAL_MODELS)
    assert all(c.cell_id.startswith("v2-FLASHINFER-p128d128-") for c in expansion.cells)
    assert all(x.reason for x in expansion.excluded)
