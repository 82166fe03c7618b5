#!/usr/bin/env bash
# Pipeline-parallel GPU check, owed until a host with 2+ GPUs is available (NCCL, one GPU per rank):
#   bash benchmarks/gpu_pp_check.sh            # logs to $OUT/gpu_pp_check/ or benchmarks/results/gpu_pp_check-<time>/
# 1. the PP GPU tests: NCCL PP=2 equals one GPU; a killed stage is a TensorParallelError within the bound
#    (by default with two virtual engines, i.e. steps in flight: the NCCL message order of
#    engine/distributed/pipeline_inflight.py is verified only here, never on the CPU);
# 2. pp_bench on the llama-3.1-8b preset (bf16): PP=2 vs TP=2 vs one engine per GPU, interleaved, with
#    bytes moved per step and the bubble (pp2v1: one step at a time, pp2: a step per lane in flight). On PCIe GPUs (L4, A10) PP=2 is expected to beat TP=2; on NVLink
#    (H100/H200 SXM) TP=2 or one engine per GPU is expected to win for a model that fits one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
LOG="${OUT:+$OUT/gpu_pp_check}"
LOG="${LOG:-benchmarks/results/gpu_pp_check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$LOG"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [[ "$GPUS" -lt 2 ]]; then
  echo "needs 2 GPUs, found $GPUS: pipeline-parallel GPU checks stay owed" | tee "$LOG/summary.txt"
  exit 0
fi
nvidia-smi topo -m 2>&1 | tee "$LOG/topology.txt"  # NVLink (NV#) or PCIe (PIX/PHB/SYS) between the GPUs
timeout --kill-after=10 300 python -m pytest -m gpu tests/engine/distributed/test_pipeline_parallel_gpu.py -q -rs -p no:cacheprovider \
  2>&1 | tee "$LOG/pp_gpu_tests.log"
timeout --kill-after=10 1200 python -m benchmarks.pp_bench --model llama-3.1-8b --device cuda --dtype bfloat16 \
  --modes pp2v1,pp2,tp2,dp2 --num-prompts 256 --prompt-len 512 --max-tokens 128 --repeats 2 --json "$LOG/pp_bench.json" 2>&1 | tee "$LOG/pp_bench.log"
