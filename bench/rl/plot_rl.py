#!/usr/bin/env python3
"""PNG plots of a `loom-trainer rl` run's main curves, from its RUN/metrics.jsonl.

    python3 bench/rl/plot_rl.py RUN/metrics.jsonl --out rl.png [--title TEXT]

One PNG (gnuplot pngcairo) of nine panels over the RL steps: task reward (mean, with the mean
+- the population std over the step's episodes), completion and final-answer shares, the policy
loss, KL to the reference (with grpo.kl_coef > 0; otherwise the mean |old - behaviour| logprob gap,
the engine/trainer mismatch), entropy (mean -logp of the sampled tokens), clip fraction, rollout
and training tokens/s, response length, and the warm-start loss per warm-start step (or, when the
run recorded routing, the share of MoE choices where the trainer's own top-k differs). Policy
panels show only steps that updated (a step whose groups were all dropped has no policy loss).

Prints one JSON line: the steps, and the means over the first and the last third of the steps
(at least one step each) of reward, completion, answered, malformed and response length, plus the
medians of rollout and training tokens/s and of the weight-sync time. Needs gnuplot (Debian
gnuplot-nox or gnuplot); the Python standard library otherwise. Exit status 2 for a file without
RL step lines.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

# Summarised as first-third and last-third means.
SUMMARY_KEYS = ["reward_mean", "completion", "answered", "malformed", "response_length"]


def read_metrics(path):
    steps, warm = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if "step" in j:
                steps.append(j)
            elif "warm_start_step" in j:
                warm.append(j)
    return steps, warm


def thirds(values):
    k = max(1, len(values) // 3)
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def summarise(steps):
    out = {"steps": len(steps)}
    for key in SUMMARY_KEYS:
        vals = [s[key] for s in steps if key in s]
        if vals:
            first, last = thirds(vals)
            out[key + "_first_third"] = first
            out[key + "_last_third"] = last
    out["first_reward"] = steps[0].get("reward_mean")
    out["last_reward"] = steps[-1].get("reward_mean")
    for key in ["rollout_tokens_per_s", "train_tokens_per_s", "weight_sync_s"]:
        vals = [s[key] for s in steps if key in s and (key != "weight_sync_s" or s.get("updated"))]
        if vals:
            out[key + "_median"] = statistics.median(vals)
    out["updated_steps"] = sum(1 for s in steps if s.get("updated"))
    return out


def gnuplot_quote(s):
    return "'" + "".join(c if c.isprintable() else " " for c in s).replace("'", "''") + "'"


def write_columns(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(" ".join("%.9g" % v for v in r) + "\n")


def panel(title, ylabel, series, xlabel="RL step", yrange=None):
    """series: list of (datafile, using, style, title); empty -> a panel saying there is no data.
    yrange: a gnuplot range ("[0:1]") or None (autoscale)."""
    lines = ["set title %s" % gnuplot_quote(title), "set xlabel %s" % gnuplot_quote(xlabel),
             "set ylabel %s" % gnuplot_quote(ylabel),
             "set yrange %s" % yrange if yrange else "set autoscale y"]
    if not series:
        lines += ["unset key", "set label 1 'no data in this run' at graph 0.3, 0.5",
                  "plot [0:1][0:1] NaN notitle", "unset label 1"]
        return lines
    lines.append("set key top left")
    lines.append("plot " + ", ".join("%s using %s with %s title %s" % (
        gnuplot_quote(d), u, style, gnuplot_quote(t)) for d, u, style, t in series))
    return lines


def plot(steps, warm, out, title):
    tmp = tempfile.mkdtemp(prefix="plot_rl_")
    try:
        f = lambda name: os.path.join(tmp, name)  # noqa: E731
        def col(s, key):
            return s.get(key, float("nan"))
        write_columns(f("all.dat"), [(s["step"], col(s, "reward_mean"), col(s, "reward_std"),
                                      col(s, "completion"), col(s, "answered"),
                                      col(s, "rollout_tokens_per_s"),
                                      col(s, "train_tokens_per_s"), col(s, "response_length"))
                                     for s in steps])
        updated = [s for s in steps if s.get("updated")]
        write_columns(f("upd.dat"), [(s["step"], col(s, "loss"), col(s, "entropy"),
                                      col(s, "clip_fraction"), col(s, "kl"),
                                      col(s, "logprob_mismatch")) for s in updated])
        has_kl = any("kl" in s for s in updated)
        routing = [s for s in steps if "routing_differing" in s]
        if routing:
            write_columns(f("route.dat"), [(s["step"], s["routing_differing"],
                                            s.get("routing_coverage", float("nan")))
                                           for s in routing])
        if warm:
            write_columns(f("warm.dat"), [(w["warm_start_step"], w["loss"]) for w in warm])
        all_dat, upd = f("all.dat"), f("upd.dat")
        lp = "linespoints pt 7 ps 0.5"
        script = ["set terminal pngcairo size 1500,1150 noenhanced font ',10'",
                  "set output %s" % gnuplot_quote(out), "set grid", "set format y '%g'",
                  "set multiplot layout 3,3 title %s" % gnuplot_quote(title)]
        script += panel("task reward", "reward", [
            (all_dat, "1:($2-$3):($2+$3)", "filledcurves fs transparent solid 0.2 noborder",
             "mean +- std"),
            (all_dat, "1:2", lp, "mean")])
        script += panel("episodes", "share", [(all_dat, "1:4", lp, "completion (rewarded)"),
                                              (all_dat, "1:5", lp, "ended with an answer")],
                        yrange="[0:1]")
        script += panel("policy loss (updating steps)", "loss",
                        [(upd, "1:2", lp, "token-mean GRPO objective")] if updated else [])
        if has_kl:
            script += panel("KL to the reference (k3)", "KL", [(upd, "1:5", lp, "kl")])
        else:
            script += panel("KL: no KL term (grpo.kl_coef 0); engine/trainer logprob gap",
                            "mean |old - behaviour|",
                            [(upd, "1:6", lp, "logprob mismatch")] if updated else [])
        script += panel("entropy (mean -logp of sampled tokens)", "nats",
                        [(upd, "1:3", lp, "entropy")] if updated else [])
        script += panel("clip fraction", "share", [(upd, "1:4", lp, "clipped")] if updated else [],
                        yrange="[0:1]")
        script += panel("throughput", "tokens/s", [(all_dat, "1:6", lp, "rollout (sampled)"),
                                                   (all_dat, "1:7", lp, "training")])
        script += panel("response length", "sampled tokens per episode",
                        [(all_dat, "1:8", lp, "response length")])
        if routing:
            script += panel("routing replay", "share",
                            [(f("route.dat"), "1:2", lp, "trainer top-k differs"),
                             (f("route.dat"), "1:3", lp, "positions recorded")], yrange="[0:1]")
        else:
            script += panel("warm start (supervised)", "loss",
                            [(f("warm.dat"), "1:2", lp, "loss")] if warm else [],
                            xlabel="warm-start step")
        script.append("unset multiplot")
        subprocess.run(["gnuplot"], input="\n".join(script).encode(), check=True)
    finally:
        shutil.rmtree(tmp)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="RUN/metrics.jsonl of loom-trainer rl")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default=None, help="plot title (default: the metrics path)")
    a = p.parse_args(argv)
    if not shutil.which("gnuplot"):
        p.error("needs gnuplot (Debian gnuplot-nox)")
    steps, warm = read_metrics(a.metrics)
    if not steps:
        print("plot_rl: %s has no RL step lines" % a.metrics, file=sys.stderr)
        return 2
    plot(steps, warm, a.out, a.title or a.metrics)
    print(json.dumps(summarise(steps), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
