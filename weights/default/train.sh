#!/bin/bash
# Trains the bundled default model (weights/default/model.safetensors) from seed on one GPU, as it
# was trained on an H200 (bench/results/trainer.md, 2026-12-03): passkeys at 512 tokens, then
# passkeys and tool dialogues at 1024 in two runs, each starting from the previous one's last
# checkpoint in bf16 (the dtype the weights ship in). At most 17 minutes on an H200 (its three
# runs took 0.12, 0.165 and 0.166 s a step there, each beside other runs).
#   weights/default/train.sh [BIN]   BIN: a CUDA build's binaries (default build-cuda/bin:
#                                    `cmake --preset cuda && cmake --build build-cuda`)
# Writes runs/default/ (checkpoints, metrics.jsonl per run) and runs/default/model (bf16), then
# evaluates it: passkey recall at 512-4096 tokens and tool dialogues, through the serving engine.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build-cuda/bin}
trainer=$bin/loom-trainer
rm -rf runs/default  # each run's metrics.jsonl appends: start clean
bf16() { "$bin/loom-convert" --from "$1" --to "$2" --dtype bf16 > /dev/null; }
"$trainer" train --config weights/default/train-1-passkey.json
bf16 runs/default/1-passkey/checkpoint-3000 runs/default/1-passkey-bf16
"$trainer" train --config weights/default/train-2-tools.json
bf16 runs/default/2-tools/checkpoint-2400 runs/default/2-tools-bf16
"$trainer" train --config weights/default/train-3-tools.json
bf16 runs/default/3-tools/checkpoint-1400 runs/default/model
"$trainer" eval --model runs/default/model --task passkey --lengths 512,1024,2048,4096 --samples 4 \
  --device cuda | tail -1
"$trainer" eval --model runs/default/model --task tool --samples 32 --device cuda | tail -1
