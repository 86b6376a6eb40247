#!/usr/bin/env python3
"""The side-by-side table of bench/peers' training comparison (README.md; the device job
.device-clean/job-peer.sh runs it). Standard library only.

  train_table.py loom --metrics RUN/metrics.jsonl --config C --batch B --seq-len T [--skip K]
                      [--label L] [--peak-mem-mib M] [--rc RC]
      loom-trainer's metrics.jsonl as one JSON line in fla_train.py's schema ("peer": "loom"):
      tokens/s over the steps after the first K (their tokens over elapsed_s[last] -
      elapsed_s[K]: elapsed_s is cumulative from the run's start), MFU from model_flops.py.
  train_table.py table RESULTS.jsonl
      a table of every line (Loom's and fla_train.py's), then per label Loom's tokens/s over each
      peer precision's, against issue 14's target of 1.5x.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_flops  # noqa: E402

TARGET = 1.5


def loom_line(a):
    rows = []
    with open(a.metrics if os.path.exists(a.metrics) else os.devnull) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by the timeout that ended the run
    with open(a.config) as f:
        cfg = json.load(f)
    flops = model_flops.training_flops_per_token(cfg, a.seq_len)
    out = {"peer": "loom", "label": a.label, "config": a.config, "precision": "f32",
           "batch": a.batch, "seq_len": a.seq_len, "tokens_per_step": a.batch * a.seq_len,
           "rc": a.rc, "steps_run": len(rows), "params_counted": flops["params"]["total"],
           "flops_per_token": flops["flops_per_token"], "flop_terms": flops["terms"]}
    # Fewer steps than asked (a slow run cut by its time limit): keep at least 2 timed steps,
    # and always leave out step 1 (allocations, cuBLAS set-up).
    skip = max(1, min(a.skip, len(rows) - 2))
    if len(rows) < 2:
        out["error"] = f"{len(rows)} steps in metrics.jsonl: too few to time"
        print(json.dumps(out))
        return 0
    timed = rows[skip:]
    wall = rows[-1]["elapsed_s"] - rows[skip - 1]["elapsed_s"]
    tokens = sum(r["tokens"] for r in timed)
    tps = tokens / wall
    m = model_flops.mfu(tps, flops["flops_per_token"])
    out.update({
        "warmup_steps": skip, "warmup_s": round(rows[skip - 1]["elapsed_s"], 2),
        "timed_steps": len(timed), "timed_s": round(wall, 3),
        "step_ms_mean": round(1e3 * wall / len(timed), 3),
        "step_ms_median": round(1e3 * sorted(
            rows[i]["elapsed_s"] - rows[i - 1]["elapsed_s"] for i in range(skip, len(rows)))[
                len(timed) // 2], 3),
        "tokens_per_s": round(tps, 1), "model_tflops": round(tps * flops["flops_per_token"] / 1e12, 4),
        "mfu_bf16": round(m["bf16"], 6), "mfu_tf32": round(m["tf32"], 6),
        "mfu_fp32": round(m["fp32"], 6),
        "loss_first": round(rows[0]["loss"], 4), "loss_last": round(rows[-1]["loss"], 4),
    })
    if rows[0]["tokens"] != a.batch * a.seq_len:
        out["error"] = (f"metrics say {rows[0]['tokens']} tokens a step, not B x T = "
                        f"{a.batch * a.seq_len}")
    if a.peak_mem_mib is not None:
        out["peak_mem_gib"] = round(a.peak_mem_mib / 1024, 2)
        out["peak_mem_note"] = "nvidia-smi memory.used, whole GPU, sampled every 0.5 s"
    print(json.dumps(out))
    return 0


def table(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"(unreadable line: {line[:80]})")
    head = ("| config | side | precision | B x T | timed steps | step ms | tokens/s | model TFLOP/s "
            "| MFU bf16 989 | MFU TF32 494 | MFU f32 67 | peak GiB | loss first -> last |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"| {r.get('label')} | {r.get('peer')} | {r.get('precision')} | "
                  f"{r.get('batch')} x {r.get('seq_len')} | {r.get('error', 'no result')} (rc {r.get('rc')}) |")
            continue
        print(f"| {r['label']} | {r['peer']} | {r['precision']} | {r['batch']} x {r['seq_len']} | "
              f"{r['timed_steps']} | {r['step_ms_mean']:.1f} | {r['tokens_per_s']:,.0f} | "
              f"{r['model_tflops']:.3g} | {100 * r['mfu_bf16']:.3g}% | {100 * r['mfu_tf32']:.3g}% | "
              f"{100 * r['mfu_fp32']:.3g}% | {r.get('peak_mem_gib', '-')} | "
              f"{r['loss_first']} -> {r['loss_last']} |")
    print()
    for label in dict.fromkeys(r.get("label") for r in rows):
        fpt = next((r["flops_per_token"] for r in rows
                    if r.get("label") == label and "flops_per_token" in r), None)
        if fpt:
            print(f"{label}: {fpt / 1e9:.4g} GFLOP a token (model_flops.py); tokens/s at the "
                  "peaks: " + ", ".join(f"{k} {peak / fpt:,.0f}"
                                        for k, peak in model_flops.PEAK_FLOPS.items()))
        loom = [r for r in rows if r.get("label") == label and r.get("peer") == "loom"
                and "tokens_per_s" in r]
        for p in (r for r in rows if r.get("label") == label and r.get("peer") == "fla"
                  and "tokens_per_s" in r):
            if not loom:
                print(f"{label}: no Loom result to compare with fla {p['precision']}")
                continue
            ratio = loom[0]["tokens_per_s"] / p["tokens_per_s"]
            print(f"{label}: Loom f32 / fla {p['precision']} tokens/s = {ratio:.3f}x "
                  f"(target {TARGET}x: {'met' if ratio >= TARGET else 'not met'})")
    for r in rows:
        if r.get("peer") == "fla" and not r.get("params_match", True):
            print(f"WARNING {r['label']}: fla's model has {r['params']} parameters, "
                  f"model_flops counts {r['params_counted']}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("loom")
    lo.add_argument("--metrics", required=True)
    lo.add_argument("--config", required=True)
    lo.add_argument("--batch", type=int, required=True)
    lo.add_argument("--seq-len", type=int, required=True)
    lo.add_argument("--skip", type=int, default=2, help="untimed first steps")
    lo.add_argument("--label", default="")
    lo.add_argument("--peak-mem-mib", type=float)
    lo.add_argument("--rc", type=int)
    tb = sub.add_parser("table")
    tb.add_argument("results")
    a = ap.parse_args()
    return loom_line(a) if a.cmd == "loom" else table(a.results)


if __name__ == "__main__":
    sys.exit(main())
