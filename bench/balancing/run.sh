#!/usr/bin/env bash
# The load-balancing experiment of bench/results/balancing.md (issue 14, part 4): one small MoE
# (bench/configs/balancing_moe/config.json), trained three times on the same data with the same
# seeds and initial weights, with balance.method none, aux_loss and quantile; then the table and
# the plots (bench/results/balancing_{loss,violation}.png).
#
# usage: bench/balancing/run.sh   (after building loom-trainer and loom-init-model)
# env: BIN (build/bin), OUT (build/balancing), STEPS (400), BATCH (8), SEQ_LEN (128);
#      PLOTS_ONLY=1 redoes the table and the plots from the runs already in OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/build/bin}
OUT=${OUT:-$ROOT/build/balancing}
STEPS=${STEPS:-400}
BATCH=${BATCH:-8}
SEQ_LEN=${SEQ_LEN:-128}
if [[ "${PLOTS_ONLY:-0}" != 1 ]]; then
rm -rf "$OUT"
mkdir -p "$OUT"

# The corpus: the licence texts of Debian's base-files package (each may be copied verbatim),
# byte-level, one document per paragraph; symlinks (GPL -> GPL-3, ...) left out.
find /usr/share/common-licenses -type f | sort |
  xargs "$BIN/loom-trainer" prepare-data --tokenizer byte --split paragraph \
    --out "$OUT/licences.shard"

# The initial weights, shared by the three runs, with the selection biases at zero.
"$BIN/loom-init-model" --config "$ROOT/bench/configs/balancing_moe/config.json" \
  --out "$OUT/init" --seed 1
python3 "$ROOT/bench/balancing/zero_bias.py" "$OUT/init/model.safetensors"

for method in none aux_loss quantile; do
  cat >"$OUT/$method.json" <<JSON
{"model": {"checkpoint": "$OUT/init"},
 "data": {"task": "shards", "shards": ["$OUT/licences.shard"], "seq_len": $SEQ_LEN},
 "batch_size": $BATCH, "steps": $STEPS, "seed": 1,
 "optimizer": {"peak_lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20},
 "balance": {"method": "$method"},
 "out": "$OUT/$method"}
JSON
  echo "== $method"
  start=$(date +%s)
  # Routing warnings and the progress line go to the log; the summary line to stdout.
  nice -n 10 "$BIN/loom-trainer" train --config "$OUT/$method.json" 2>"$OUT/$method.log"
  echo "$method: $(($(date +%s) - start)) s"
done
fi

python3 "$ROOT/bench/balancing/summarise.py" "$OUT" none aux_loss quantile | tee "$OUT/table.md"
gnuplot -e "dir='$OUT'" "$ROOT/bench/balancing/plots.gp"
cp "$OUT/balancing_loss.png" "$OUT/balancing_violation.png" "$ROOT/bench/results/"
echo "commit $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%Y-%m-%d)"
