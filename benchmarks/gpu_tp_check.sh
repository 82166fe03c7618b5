#!/usr/bin/env bash
# Tensor-parallel GPU check, owed until a host with 2+ GPUs is available (NCCL needs one GPU per rank):
#   bash benchmarks/gpu_tp_check.sh            # logs to $OUT/gpu_tp_check/ or benchmarks/results/gpu_tp_check-<time>/
# 1. the TP GPU tests: NCCL TP=2 equals one GPU, with decode CUDA graphs (all-reduces captured) on every rank;
#    a killed worker is a TensorParallelError within the bound (the NCCL abort path);
# 2. tp_bench on the llama-3.1-8b shape, TP=1 vs TP=2 (bf16), A B A B.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
LOG="${OUT:+$OUT/gpu_tp_check}"
LOG="${LOG:-benchmarks/results/gpu_tp_check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$LOG"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [[ "$GPUS" -lt 2 ]]; then
  echo "needs 2 GPUs, found $GPUS: tensor-parallel GPU checks stay owed" | tee "$LOG/summary.txt"
  exit 0
fi
timeout --kill-after=10 300 python -m pytest -m gpu tests/engine/distributed/test_tensor_parallel_gpu.py -q -rs -p no:cacheprovider \
  2>&1 | tee "$LOG/tp_gpu_tests.log"
timeout --kill-after=10 900 python -m benchmarks.tp_bench --preset llama-3.1-8b --device cuda --dtype bfloat16 --tp 2 \
  --num-prompts 256 --prompt-len 512 --max-tokens 128 --repeats 2 --json "$LOG/tp_bench.json" 2>&1 | tee "$LOG/tp_bench.log"
