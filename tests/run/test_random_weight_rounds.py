"""A random-weight group's baseline round asks no A/A re-run: its answers are not judged."""
from __future__ import annotations

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.eval.lmeval import EvalRun
from harness.eval.task_choice import default_data_dir
from harness.run.evaluation.aa_rerun import AAReruns, BaselineGate
from harness.run.evaluation.baseline_rounds import BaselineRounds
from harness.run.plan.group_plan import GroupPlan
from harness.serve.deploy import Endpoint


def rounds_of(load_format, tmp_path):
    asked = []

    def ask(endpoint, role, task, data_dir, sample=None, limit=None, concurrency=None):
        asked.append(role)
        return EvalRun(role=role, base_url="u", task=task, n=0, accuracy=0.0,
                       accuracy_flexible=0.0, wall_s=0.0, questions=())

    cell = Cell(model="shape-qwen3-0.6b", backend="CPU_ATTN", device="cpu")
    group = GroupPlan(cells=(cell,), pairs=((cell,),), task="gsm_synth",
                      data_dir=default_data_dir("gsm_synth"), model_path="/m", hybrid=False,
                      reference=None, load_format=load_format)
    gate = BaselineGate()
    reruns = AAReruns(gate)
    rounds = BaselineRounds(RunOptions(limit=4), ask, tmp_path, "run", lambda _: None).evaluate(
        group, Endpoint("baseline", "u", "m", ()), gate, reruns)
    reruns.close()
    return asked, rounds


def test_a_random_weight_group_skips_the_aa_rerun_a_trained_one_does_not(tmp_path):
    asked, rounds = rounds_of("dummy", tmp_path)
    assert asked == ["baseline"] and rounds[0].aa is None
    asked, rounds = rounds_of(None, tmp_path)
    assert asked == ["baseline", "baseline-aa"]
