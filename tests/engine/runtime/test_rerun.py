"""The `rerun` rung tells a bad batch from a bad step: the attribution on its own, and in a
real 1x2 run with a bad batch (scrambled labels: the same data spikes again) and a transient
spike (a one-off scaling of a step's loss)."""

import math

from engine.contract import RerunCause
from engine.data.loader import training_data
from engine.runtime.rerun import attribute, same_result
from engine.runtime.spec import parse_spec
from tests.engine.runtime.test_faults import of_type, run


def test_a_spike_that_comes_back_on_every_spiking_rank_is_the_datas():
    found = attribute([9.0, 3.0], [9.0, 3.0], spiking=[0])
    assert found.cause is RerunCause.DATA and found.differed == []


def test_a_spike_that_does_not_come_back_is_the_steps_and_names_the_ranks_that_differed():
    found = attribute([3.0, 30.0, 3.1], [3.0, 3.0, 3.1], spiking=[1])
    assert found.cause is RerunCause.STEP and found.differed == [1]
    assert found.details()["rerun_loss"] == [3.0, 3.0, 3.1]


def test_a_rank_that_differs_beside_a_reproduced_spike_is_still_a_suspect():
    found = attribute([9.0, 3.0], [9.0, 3.5], spiking=[0])
    assert found.cause is RerunCause.DATA and found.differed == [1]


def test_the_same_result_allows_the_last_digits_and_nan_again():
    assert same_result(4.0, 4.0 * (1 + 1e-6))
    assert not same_result(4.0, 4.1)
    assert same_result(math.nan, math.nan) and not same_result(math.nan, 4.0)


def rerun_spec(steps: int, inject: list[dict]) -> dict:
    # lr 3e-3: by step 30 the model predicts the text well enough that scrambled labels spike;
    # the straggler rung only observes, so the ranks' shares (and the batch's samples) stay
    # even on a busy host; the thresholds are pinned to today's so the spikes stay flagged
    return {"name": "rerun", "model": {"preset": "nano"},
            "parallel": {"nodes": 1, "procs_per_node": 2, "strategy": "NNG"},
            "train": {"steps": steps, "micro_batch": 2, "seq_len": 64, "lr": 3e-3,
                      "eval_every": 0, "warmup": 5, "threads": 1},
            "checkpoint": {"every": 0},
            "faults": {"inject": inject, "policy": {
                "actions": {"loss_spike": ["rerun", "rerun", "pause"], "straggler": ["observe"]},
                "thresholds": {"loss_spike": {"z": 3.0, "min_rise": 0.25}}}}}


def test_a_bad_batch_is_recorded_and_skipped_and_a_transient_spike_retried(tmp_path):
    spec = rerun_spec(40, [{"kind": "bad_batch", "step": 30, "rank": 1},
                           {"kind": "loss_spike", "step": 36, "rank": 0, "factor": 10.0}])
    events = run(tmp_path, spec)
    reruns = {a["step"]: a for a in of_type(events, "action") if a["action"] == "rerun"}
    assert sorted(reruns) == [30, 36]  # the healthy steps are not run twice

    # the bad batch: rank 1's part of step 30 (4 samples a step, 2 a rank, none skipped
    # before), spiking the same way again: the data's, recorded with its samples and skipped
    assert reruns[30]["cause"] == "data" and reruns[30]["spiking_ranks"] == [1]
    assert reruns[30]["loss"] == reruns[30]["rerun_loss"]
    (bad,) = of_type(events, "bad_batch")
    assert bad["step"] == 30 and bad["ranks"] == [1] and bad["anomaly"] == "loss_spike"
    assert bad["samples"] == [29 * 4 + 2, 29 * 4 + 3]
    marker = tmp_path / "rerun" / "faults" / "injected-0-bad_batch"
    assert int(marker.read_text()) == bad["samples"][0]  # the batch the injection scrambled
    loader = training_data(parse_spec(spec), rank=1, world_size=2)
    assert bad["windows"] == [loader.window(i) for i in bad["samples"]]

    # the transient spike: gone on the rerun, so the step's; it goes on with the rerun's
    # result, and rank 0, whose result differed, is a suspect of silent data corruption
    assert reruns[36]["cause"] == "step" and reruns[36]["differed_ranks"] == [0]
    first, again = reruns[36]["loss"][0], reruns[36]["rerun_loss"][0]
    assert math.isclose(first, 10 * again, rel_tol=1e-4)
    (suspect,) = [a for a in of_type(events, "anomaly") if a["kind"] == "sdc_suspect"]
    assert suspect["rank"] == 0 and suspect["evidence"]["rerun_step"] == 36

    curve = {s["step"]: s["loss"] for s in of_type(events, "step")}
    assert sorted(curve) == list(range(1, 41))  # step 30 trained again on the next data
    assert curve[36] < 1.5 * curve[35]
    assert of_type(events, "state")[-1]["state"] == "completed"
