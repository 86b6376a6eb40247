#!/usr/bin/env bash
# Starts loom-server on MODEL_DIR (a free loopback port), runs `loom-bench serve` against it with
# the remaining arguments, and stops the server, whatever happens. Used by `make bench-serve`.
#   bench/serve/run_against_model.sh BUILD_DIR MODEL_DIR [loom-bench serve flags...]
set -euo pipefail
build=$1
model=$2
shift 2
log=$(mktemp /tmp/loom-bench-server.XXXXXX.log)
"$build/bin/loom-server" --model "$model" --port 0 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
port=""
for _ in $(seq 600); do
  port=$(sed -n 's/.*http listening on .* (port \([0-9]*\)).*/\1/p' "$log" | head -n 1)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "loom-server exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "loom-server did not report its port within 60 s"; cat "$log"; exit 1; }
"$build/bin/loom-bench" serve --url "http://127.0.0.1:$port" "$@"
