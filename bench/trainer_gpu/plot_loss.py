#!/usr/bin/env python3
"""A PNG of training-loss curves from `loom-trainer train` runs' RUN/metrics.jsonl files.

    python3 bench/trainer_gpu/plot_loss.py --out curves.png [--title TEXT] [--window N] \\
        [--hline Y:LABEL ...] LABEL=RUN/metrics.jsonl [LABEL=...]

One panel (gnuplot pngcairo): each run's loss against its step, as the mean over a window of N
steps (default 20; 1 plots every step), on a log scale. --hline draws a reference level (chance,
for instance). Prints one JSON line per run: its steps, the first step whose windowed loss is
below 0.5 and 0.05 (null if none), and the mean loss of its first and last window. Needs gnuplot
(Debian gnuplot-nox or gnuplot); the Python standard library otherwise. Exit status 2 for a file
without step lines.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def read_losses(path):
    """(step, loss) of every line with both, in file order."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if "step" in d and "loss" in d:
                out.append((int(d["step"]), float(d["loss"])))
    return out


def windowed(points, n):
    """Means of consecutive windows of n points: (last step of the window, mean loss)."""
    out = []
    for i in range(0, len(points), n):
        w = points[i:i + n]
        out.append((w[-1][0], sum(l for _, l in w) / len(w)))
    return out


def first_below(curve, level):
    return next((s for s, l in curve if l < level), None)


def summarise(label, points, n):
    curve = windowed(points, n)
    return {"run": label, "steps": len(points), "window": n,
            "first_step_below_0.5": first_below(curve, 0.5),
            "first_step_below_0.05": first_below(curve, 0.05),
            "first_window_loss": curve[0][1], "last_window_loss": curve[-1][1]}


def quote(s):
    return "'" + "".join(c if c.isprintable() else " " for c in s).replace("'", "''") + "'"


def plot(runs, out, title, n, hlines):
    tmp = tempfile.mkdtemp(prefix="plot_loss_")
    try:
        series = []
        for i, (label, points) in enumerate(runs):
            path = os.path.join(tmp, "run%d.dat" % i)
            with open(path, "w") as f:
                for s, l in windowed(points, n):
                    f.write("%d %.9g\n" % (s, max(l, 1e-6)))
            series.append("%s using 1:2 with lines lw 2 title %s" % (quote(path), quote(label)))
        for y, label in hlines:
            series.append("%.9g with lines dt 2 lc rgb 'gray40' title %s" % (y, quote(label)))
        script = ["set terminal pngcairo size 900,560 font 'sans,10'", "set output %s" % quote(out),
                  "set title %s" % quote(title), "set xlabel 'step'",
                  "set ylabel 'loss (mean of %d steps)'" % n, "set logscale y", "set grid",
                  "set key bottom left", "plot " + ", ".join(series)]
        subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    finally:
        shutil.rmtree(tmp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="training loss")
    ap.add_argument("--window", type=int, default=20, help="steps per plotted mean")
    ap.add_argument("--hline", action="append", default=[], help="Y:LABEL, a reference level")
    ap.add_argument("runs", nargs="+", help="LABEL=RUN/metrics.jsonl")
    a = ap.parse_args(argv)
    if a.window < 1:
        ap.error("--window must be >= 1")
    hlines = []
    for h in a.hline:
        y, _, label = h.partition(":")
        try:
            hlines.append((float(y), label or y))
        except ValueError:
            ap.error("--hline %r: expected Y:LABEL" % h)
    runs = []
    for r in a.runs:
        label, sep, path = r.partition("=")
        if not sep or not label or not path:
            ap.error("%r: expected LABEL=RUN/metrics.jsonl" % r)
        points = read_losses(path)
        if not points:
            print("%s: no step lines with a loss" % path, file=sys.stderr)
            return 2
        runs.append((label, points))
    if shutil.which("gnuplot") is None:
        print("plot_loss.py: gnuplot is not installed (Debian: gnuplot-nox)", file=sys.stderr)
        return 1
    plot(runs, a.out, a.title, a.window, hlines)
    for label, points in runs:
        print(json.dumps(summarise(label, points, a.window)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
