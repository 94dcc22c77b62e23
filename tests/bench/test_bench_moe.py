"""The MoE benchmarks run end to end and print one JSON document with the ratios issue #3
names (their quick forms; the figures themselves are `make bench`'s, not a test's). Running
benchmarks is `make bench`'s work: these run there, with the benchmarks (27 s on two cores)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.bench


@functools.cache  # each benchmark runs once for all the tests that read its document
def run_benchmark(module: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", module, "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "module, ratios",
    [
        ("bench.moe_layer",
         {"layer_vs_hf_best_tiny", "layer_vs_torchtitan_tiny", "layer_vs_hf_eager_min"}),
        ("bench.moe_model", {"model_vs_glm4moe", "model_with_mtp_vs_glm4moe"}),
    ],
)
def test_the_benchmark_prints_its_ratios(module, ratios):
    document = run_benchmark(module)
    assert set(document["ratios"]) == ratios
    assert all(value > 0 for value in document["ratios"].values())


def test_the_layer_benchmark_checks_every_implementation_against_ours_before_timing():
    tiny = run_benchmark("bench.moe_layer")["shapes"]["tiny"]
    difference = tiny["max_abs_diff_vs_ours"]
    assert set(difference) == {"torchtitan", "hf_eager", "hf_grouped_mm"}
    assert max(difference["hf_eager"], difference["hf_grouped_mm"]) <= 1e-5
    # torchtitan runs its experts in bf16, which keeps about 3 significant digits
    assert tiny["relative_error_vs_ours"]["torchtitan"] <= 1e-2
    assert set(tiny["ms"]) == {"ours", "torchtitan", "hf_eager", "hf_grouped_mm", "dense_mm"}
    # beside them, both ways the dispatch can sum the slots back: the device's choice
    assert set(tiny["slot_sum_ms"]) == {"bag", "gather"}
    assert min(tiny["slot_sum_ms"].values()) > 0
