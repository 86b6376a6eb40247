#!/bin/bash
# MQAR at 256 tokens with 16 key-value pairs on the default's architecture with RoPE MLA
# (config.json here: KDA + MLA + MoE + Block AttnRes, bounded gate, 6.9 M parameters), as trained
# on an H200 on 2026-12-03 (bench/results/trainer.md, "MQAR over 256, learned packed first"):
# 16 pairs packed in 64 tokens until the loss is below 0.05 (step 390 with this seed), then the
# queries spread over 256 tokens until the loss is stable. About 1 minute of training on an H200.
#   bench/trainer_gpu/mqar256/run.sh [BIN]   BIN: a CUDA build's binaries (default build-cuda/bin)
# Writes runs/mqar256 (checkpoints, metrics.jsonl) and runs/mqar256-bf16, then evaluates the bf16
# model through the serving engine: 64 examples of 16 spread queries over 256 tokens.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=${1:-build-cuda/bin}
rm -rf runs/mqar256 runs/mqar256-bf16  # metrics.jsonl appends: start clean
"$bin/loom-trainer" train --config bench/trainer_gpu/mqar256/run.json
last=$(ls -d runs/mqar256/checkpoint-* | sort -V | tail -1)
"$bin/loom-convert" --from "$last" --to runs/mqar256-bf16 --dtype bf16 > /dev/null
"$bin/loom-trainer" eval --model runs/mqar256-bf16 --task mqar --samples 64 --mqar_pairs 16 \
  --mqar_seq_len 256 --device cuda | tail -1
