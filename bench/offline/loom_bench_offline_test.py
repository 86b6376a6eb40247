#!/usr/bin/env python3
"""`loom-bench offline` end to end on a fixture model (CPU, small sizes): the report's numbers
agree with each other (tokens/s is batch over time per output token, every figure beside a
positive roofline, the roofline's decode bytes grow with the batch), the PNG is written when
gnuplot is there, and bad flags are refused with the flag's name."""
import argparse
import json
import os
import shutil
import subprocess
import sys

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    out_json = os.path.join(a.tmp, "offline.json")
    png = os.path.join(a.tmp, "offline.png")
    for f in (out_json, png):
        if os.path.exists(f):
            os.remove(f)
    args = [a.bench, "offline", "--model", a.model, "--batches", "1,3", "--context", "40",
            "--decode_steps", "8", "--prefill", "100", "--long_context", "300",
            "--long_decode_steps", "3", "--json", out_json]
    have_gnuplot = shutil.which("gnuplot") is not None
    if have_gnuplot:
        args += ["--plot", png]
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    print(p.stdout)
    check(p.returncode == 0, "exit 0 (stderr: %r)" % p.stderr[-500:])
    r = json.load(open(out_json))
    check([d["batch"] for d in r["decode"]] == [1, 3], "one decode row per batch")
    for d in r["decode"]:
        check(d["tpot_ms"] > 0 and d["roofline_ms"] > 0, "batch %d: positive times" % d["batch"])
        tps = d["batch"] / (d["tpot_ms"] / 1e3)
        check(abs(d["tokens_per_s"] - tps) <= 1e-6 * tps,
              "batch %d: tokens/s = batch / TPOT" % d["batch"])
        check(abs(d["roofline_tokens_per_s"] - d["batch"] / (d["roofline_ms"] / 1e3))
              <= 1e-6 * d["roofline_tokens_per_s"], "batch %d: roofline tokens/s" % d["batch"])
    check(r["decode"][1]["roofline_ms"] > r["decode"][0]["roofline_ms"],
          "a larger batch reads more bytes a step")
    check(len(r["prefill"]) == 1 and r["prefill"][0]["ttft_ms"] > 0 and
          abs(r["prefill"][0]["tokens_per_s"] - 100 / (r["prefill"][0]["ttft_ms"] / 1e3)) < 1e-3,
          "prefill: tokens/s = prompt / TTFT")
    check(len(r["long_context"]) == 1 and r["long_context"][0]["tpot_ms"] > 0,
          "long context: TPOT measured")
    check(r["copy_gb_per_s"] > 0 and r["gemm_tflop_per_s"] > 0 and r["active_params"] > 0,
          "ceilings and active parameters")
    if have_gnuplot:
        check(os.path.getsize(png) > 1000, "PNG written")
        # --replot draws the same plot from the report alone (no model, nothing run).
        png2 = os.path.join(a.tmp, "replot.png")
        if os.path.exists(png2):
            os.remove(png2)
        p = subprocess.run([a.bench, "offline", "--replot", out_json, "--plot", png2],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0 and open(png2, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              "--replot writes a PNG (stderr: %r)" % p.stderr[-300:])
    bad = os.path.join(a.tmp, "not_a_report.json")
    with open(bad, "w") as f:
        f.write('{"decode": [{"batch": "one"}], "model": "m"}')
    empty = os.path.join(a.tmp, "empty_report.json")
    with open(empty, "w") as f:
        f.write('{"decode": [], "model": "m"}')
    for flags, needle in ((["--replot", out_json], "--plot"),
                          (["--replot", bad, "--plot", os.path.join(a.tmp, "x.png")],
                           "--replot"),
                          (["--replot", empty, "--plot", os.path.join(a.tmp, "x.png")],
                           "--replot")):
        p = subprocess.run([a.bench, "offline"] + flags, capture_output=True, text=True,
                           timeout=60)
        check(p.returncode != 0 and needle in p.stderr, "%s refused naming %s" % (flags, needle))
    for flags, needle in ((["--batches", "0"], "--batches"), (["--context", "0"], "--context"),
                          (["--prefill", "x"], "--prefill")):
        p = subprocess.run([a.bench, "offline", "--model", a.model] + flags, capture_output=True,
                           text=True, timeout=60)
        check(p.returncode != 0 and needle in p.stderr, "%s refused naming %s" % (flags, needle))
    p = subprocess.run([a.bench, "offline"], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "--model" in p.stderr, "no --model refused")
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
