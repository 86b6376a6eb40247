#!/usr/bin/env python3
"""Summarises the balancing runs' metrics.jsonl files for plots.gp and bench/results/balancing.md.

usage: summarise.py OUT METHOD...
Writes OUT/METHOD.tsv (one row per step: step, loss, the mean and the max over the MoE layers of
the max violation, the mean idle-expert fraction, the mean load entropy, aux_loss or 0, the 20-step
trailing means of loss and mean max violation, and the 20-step trailing mean of the loss minus the
first method's at the same step) and prints a Markdown table: final loss (mean of the last 50
steps' cross-entropy), its paired difference to the first method's (the runs see the same batches)
with the standard error of that mean, max violation (mean over steps and layers, over all steps
and over the last 100; and the worst layer's, last 100), idle-expert fraction (all / last 100) and
load entropy.
"""
import json
import os
import sys

out, methods = sys.argv[1], sys.argv[2:]
print("| method | final loss (last 50 steps) | vs %s (paired) | mean max violation (all / last 100 "
      "steps) | worst layer's max violation, last 100 steps | idle-expert fraction (all / last "
      "100) | load entropy |" % methods[0])
print("|---|---|---|---|---|---|---|")
base = None
for m in methods:
    rows = []
    with open(os.path.join(out, m, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            r = j["routing"]
            viol = [x["max_violation"] for x in r]
            rows.append({
                "step": j["step"], "loss": j["loss"], "viol": sum(viol) / len(viol),
                "viol_max": max(viol), "idle": sum(x["idle_fraction"] for x in r) / len(r),
                "entropy": sum(x["load_entropy"] for x in r) / len(r),
                "aux": j.get("aux_loss", 0.0)})
    if base is None:
        base = rows
    if len(rows) != len(base):
        sys.exit("summarise.py: %s has %d steps, %s %d" % (m, len(rows), methods[0], len(base)))
    for r, b in zip(rows, base):
        r["diff"] = r["loss"] - b["loss"]
    with open(os.path.join(out, m + ".tsv"), "w") as f:
        f.write("# step\tloss\tviolation_mean\tviolation_max\tidle\tentropy\taux\tloss_avg20\t"
                "violation_avg20\tloss_diff_avg20\n")
        for i, r in enumerate(rows):
            w = rows[max(0, i - 19):i + 1]
            f.write("%d\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\n" % (
                r["step"], r["loss"], r["viol"], r["viol_max"], r["idle"], r["entropy"], r["aux"],
                sum(x["loss"] for x in w) / len(w), sum(x["viol"] for x in w) / len(w),
                sum(x["diff"] for x in w) / len(w)))
    mean = lambda key, rs: sum(x[key] for x in rs) / len(rs)
    last, last50 = rows[-100:], rows[-50:]
    d = mean("diff", last50)
    se = (sum((x["diff"] - d) ** 2 for x in last50) / (len(last50) - 1) / len(last50)) ** 0.5
    print("| %s | %.4f | %+.4f +- %.4f | %.3f / %.3f | %.3f | %.4f / %.4f | %.4f |" % (
        m, mean("loss", last50), d, se, mean("viol", rows), mean("viol", last),
        mean("viol_max", last), mean("idle", rows), mean("idle", last), mean("entropy", rows)))
