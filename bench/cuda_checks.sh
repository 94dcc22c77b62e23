#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go, with whatever python3 has torch and
# transformers: the CUDA tests (skipped on CPU machines), both MoE benchmarks in bf16 (the
# layer also at 32768 tokens per call, where a GPU is busy), and a 40-step training run of the
# tiny preset on one GPU (NCCL, CUDA-event op timing).
# Results go to the folder given (default bench/results/cuda).
#
#     bash bench/cuda_checks.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/cuda}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
status=0
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
  transformers.__version__, "gpu", torch.cuda.get_device_name())' || exit 1

# the repo's conftest starts the platform's services; the engine tests need none of them
python3 -m pytest --noconftest -p no:cacheprovider -q -rs --rootdir=. -c /dev/null \
  tests/engine/moe tests/engine/xputimer/test_timer.py 2>&1 | tee "$out/pytest.log" | tail -25
status=$((status | $?))

python3 -m bench.moe_layer --device cuda > "$out/moe_layer.json" || status=1
python3 -m bench.moe_layer --device cuda --tokens 32768 > "$out/moe_layer_32k.json" || status=1
python3 -m bench.moe_model --device cuda > "$out/moe_model.json" || status=1

cat > /tmp/cuda_smoke.json <<'SPEC'
{"name": "cuda-smoke", "model": {"preset": "tiny"},
 "train": {"steps": 40, "eval_every": 20, "trace_every": 20, "device": "cuda"},
 "checkpoint": {"every": 20}}
SPEC
rm -rf /tmp/cuda_smoke
python3 -m engine.train /tmp/cuda_smoke.json --run-dir /tmp/cuda_smoke \
  --events "$out/train_events.jsonl" > "$out/train.log" 2>&1 || status=1
tail -5 "$out/train.log"
exit $status
