#!/usr/bin/env bash
# Training throughput on the CPU and the GPU (bench/results/trainer-gpu-h200.md): `loom-trainer
# train` on MQAR (seq_len 256, batch 8) for each model config given, once with "device": "cpu"
# and once with "device": "cuda", from the same synthetic weights and data. Prints one line per
# run: tokens/s over steps 2..N (step 1 pays one-off allocations and cuBLAS set-up), the first
# and last loss.
#
#   bash bench/trainer_gpu/run.sh BUILD_DIR FIXTURES_DIR [STEPS] [CONFIG_NAME ...]
set -euo pipefail
build=$1 fixtures=$2 steps=${3:-6}
shift $(( $# >= 3 ? 3 : $# ))
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(kimi_linear_s0 fla_kda_s0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in "${names[@]}"; do
  for device in cpu cuda; do
    run=$work/$name-$device
    cat >"$work/run.json" <<JSON
{"model": {"config": "$fixtures/$name/config.json", "seed": 1},
 "data": {"task": "mqar", "seq_len": 256},
 "batch_size": 8, "steps": $steps, "device": "$device",
 "optimizer": {"peak_lr": 1e-3, "warmup_steps": 2},
 "out": "$run", "seed": 1}
JSON
    if ! "$build/bin/loom-trainer" train --config "$work/run.json" >"$work/out.txt" 2>"$work/err.txt"; then
      echo "$name $device: FAILED"; tail -5 "$work/err.txt"; continue
    fi
    python3 - "$run/metrics.jsonl" "$name" "$device" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# elapsed_s is cumulative: steps 2..N take elapsed[N] - elapsed[1].
tps = sum(r["tokens"] for r in rows[1:]) / (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"])
print(f"{sys.argv[2]} {sys.argv[3]}: {len(rows)} steps of {rows[0]['tokens']} tokens, "
      f"{tps:.0f} tokens/s (steps 2..{len(rows)}), step 1 {rows[0]['elapsed_s']:.2f} s, "
      f"loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
PY
  done
done
