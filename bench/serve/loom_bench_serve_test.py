#!/usr/bin/python3
"""End-to-end test of `loom-bench serve` (Python standard library only).

Starts loom-server on a fixture model on a free loopback port, runs loom-bench against it with
small sizes and checks the numbers it reports: every request ok, exact output token counts,
ordered percentiles that agree with the per-request numbers (recomputed here), throughput equal to
tokens / wall time, the Markdown table, the PNG. Then the failure paths: requests the server
rejects are counted as failed (non-zero exit), bad flags, an unknown subcommand, an unreachable
server and a missing gnuplot all exit non-zero with a message naming the problem. Every wait is
bounded; the server is always killed.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
from checks import check, summary  # noqa: E402
from loom_server_process import LoomServer  # noqa: E402

ARGS = None
BENCH_TIMEOUT_S = 120



def Server(*extra):
    return LoomServer(ARGS.server, ARGS.model, *extra)


def bench(*args, env=None):
    """Runs loom-bench; returns (exit status, stdout, stderr)."""
    p = subprocess.run([ARGS.bench] + list(args), capture_output=True, text=True,
                       timeout=BENCH_TIMEOUT_S, env=env)
    return p.returncode, p.stdout, p.stderr


def percentile(values, q):
    """numpy's default (linear) percentile, written out independently of the C++ code."""
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def close(a, b, rel=1e-6, abs_tol=1e-6):
    return abs(a - b) <= max(abs_tol, rel * max(abs(a), abs(b)))


def check_summary(name, s, level_c, samples=None):
    if not check(s is not None, "c=%d %s present" % (level_c, name)):
        return
    check(s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"],
          "c=%d %s ordered: %s" % (level_c, name, s))
    check(s["min"] <= s["mean"] <= s["max"], "c=%d %s mean within range: %s" % (level_c, name, s))
    if samples is not None:
        check(s["count"] == len(samples), "c=%d %s count %d == %d" % (level_c, name, s["count"],
                                                                       len(samples)))
        for q in (50, 90, 99):
            want = percentile(samples, q)
            check(close(s["p%d" % q], want), "c=%d %s p%d %g == %g" % (level_c, name, q,
                                                                       s["p%d" % q], want))
        check(close(s["mean"], sum(samples) / len(samples)), "c=%d %s mean" % (level_c, name))


def test_measures(server, tmp):
    out_json = os.path.join(tmp, "run.json")
    out_md = os.path.join(tmp, "run.md")
    out_png = os.path.join(tmp, "run.png")
    requests, input_len, output_len = 6, 20, 8
    started = time.time()
    rc, out, err = bench("serve", "--url", server.url, "--concurrency", "1,3", "--requests",
                         str(requests), "--input_len", str(input_len), "--output_len",
                         str(output_len), "--seed", "7", "--json", out_json, "--markdown", out_md,
                         "--plot", out_png, "--timeout_s", "60")
    print(out, err, sep="\n", flush=True)
    if not check(rc == 0, "loom-bench serve exits 0 (got %d)" % rc):
        return
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
        model_id = json.load(r)["data"][0]["id"]
    with open(out_json) as f:
        report = json.load(f)
    # Distinct random prompts: nothing the server has cached may be reused.
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        metrics = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                       if line and not line.startswith("#"))
    check(float(metrics.get("loom_prefix_cache_hit_tokens_total", "0")) == 0,
          "no prefix-cache hits: %s" % metrics.get("loom_prefix_cache_hit_tokens_total"))
    check(report["model"] == model_id, "JSON model %r == /v1/models id %r" % (report["model"],
                                                                             model_id))
    s = report["settings"]
    check(s["concurrency"] == [1, 3] and s["requests"] == requests and
          s["input_len"] == input_len and s["output_len"] == output_len and s["seed"] == 7,
          "JSON settings echo the flags: %s" % s)
    # The fixture's tokenizer has 260 ids (its model 500): the prompt range must be the former.
    check(s["vocab_lo"] == 0 and s["vocab_hi"] == 260, "vocab range from /v1/models: %s" % s)
    levels = report["levels"]
    check([l["concurrency"] for l in levels] == [1, 3], "one JSON level per concurrency")
    elapsed = time.time() - started
    for l in levels:
        c = l["concurrency"]
        check(l["requests"] == requests and l["ok"] == requests and l["failed"] == 0 and
              l["errors"] == [], "c=%d every request ok: %s" % (c, l["errors"]))
        check(l["output_tokens"] == requests * output_len,
              "c=%d output tokens %d == %d" % (c, l["output_tokens"], requests * output_len))
        wall = l["wall_s"]
        check(0 < wall < elapsed, "c=%d wall %g s within the run's %g s" % (c, wall, elapsed))
        check(close(l["output_throughput_tok_s"], l["output_tokens"] / wall),
              "c=%d output throughput == tokens / wall" % c)
        check(close(l["request_throughput_req_s"], l["ok"] / wall),
              "c=%d request throughput == ok / wall" % c)
        per = l["per_request"]
        check(len(per) == requests and all(p["ok"] and p["output_tokens"] == output_len
                                           for p in per),
              "c=%d per-request records ok with %d tokens" % (c, output_len))
        # Tokens the fixture's tokenizer cannot decode stream no text; such requests are ok but
        # have no TTFT (and so no ITL or TPOT).
        texty = [p for p in per if p["ttft_ms"] is not None]
        check(len(texty) + l["no_text"] == l["ok"] and
              all(p["text_chunks"] == 0 for p in per if p["ttft_ms"] is None),
              "c=%d requests without text are counted: %d" % (c, l["no_text"]))
        ttft = [p["ttft_ms"] for p in texty]
        e2e = [p["e2e_ms"] for p in per]
        tpot = [(p["e2e_ms"] - p["ttft_ms"]) / (p["output_tokens"] - 1) for p in texty]
        check(all(t > 0 for t in ttft), "c=%d every TTFT > 0" % c)
        check(all(0 < p["ttft_ms"] <= p["e2e_ms"] for p in texty), "c=%d TTFT <= e2e" % c)
        check(max(e2e) <= wall * 1e3 * (1 + 1e-6), "c=%d no request outlasts the level" % c)
        # A closed loop of c workers keeps at most c requests in flight.
        check(sum(e2e) <= c * wall * 1e3 * (1 + 1e-6),
              "c=%d busy time %g ms <= c * wall %g ms" % (c, sum(e2e), c * wall * 1e3))
        check_summary("e2e_ms", l["e2e_ms"], c, e2e)
        if not check(texty, "c=%d some request streamed text" % c):
            continue
        check_summary("ttft_ms", l["ttft_ms"], c, ttft)
        check_summary("tpot_ms", l["tpot_ms"], c, tpot)
        gaps = sum(p["text_chunks"] - 1 for p in texty)
        itl = l["itl_ms"]
        check((itl is None and gaps == 0) or (itl is not None and itl["count"] == gaps),
              "c=%d one ITL gap per pair of successive text chunks (%d)" % (c, gaps))
        if itl is not None:
            check_summary("itl_ms", itl, c)
            # A request's gaps lie between its first text chunk and its end.
            check(itl["mean"] * itl["count"] <=
                  sum(p["e2e_ms"] - p["ttft_ms"] for p in texty) * (1 + 1e-6),
                  "c=%d ITL gaps fit between first text and end" % c)
    # The stdout table: a header and a row per level starting with the concurrency.
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s", line)]
    check([r[0] for r in rows] == ["1", "3"] and all(r[1] == str(requests) and r[2] == "0"
                                                     for r in rows),
          "stdout table has one row per level with %d ok, 0 failed: %s" % (requests, rows))
    with open(out_md) as f:
        md = f.read()
    md_rows = [line for line in md.splitlines() if re.match(r"^\| \d+ \|", line)]
    check(len(md_rows) == 2 and md_rows[0].startswith("| 1 |") and md_rows[1].startswith("| 3 |"),
          "markdown has a row per level: %s" % md_rows)
    check(model_id in md and "| conc |" in md, "markdown names the model and has a header")
    with open(out_png, "rb") as f:
        png = f.read()
    check(len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n", "plot is a PNG (%d bytes)" % len(png))


def test_logprobs_time_every_request(server, tmp):
    # With --logprobs every token streams a chunk, so requests whose tokens the fixture's
    # tokenizer cannot decode are timed too: no level reports requests without text.
    out_json = os.path.join(tmp, "logprobs.json")
    requests, output_len = 6, 8
    rc, out, err = bench("serve", "--url", server.url, "--concurrency", "2", "--requests",
                         str(requests), "--input_len", "12", "--output_len", str(output_len),
                         "--seed", "3", "--logprobs", "--json", out_json, "--timeout_s", "60")
    print(out, err, sep="\n", flush=True)
    if not check(rc == 0, "loom-bench serve --logprobs exits 0 (got %d)" % rc):
        return
    with open(out_json) as f:
        report = json.load(f)
    check(report["settings"]["logprobs"] is True, "JSON settings say logprobs")
    for l in report["levels"]:
        per = l["per_request"]
        check(l["ok"] == requests and l["no_text"] == 0,
              "every request timed with logprobs: ok %d, no_text %d" % (l["ok"], l["no_text"]))
        # At most a chunk per token (tokens the pump delivers together share one), plus one for
        # text held back until the end (an unfinished UTF-8 sequence, flushed with the finish).
        check(all(p["ttft_ms"] is not None and 0 < p["ttft_ms"] <= p["e2e_ms"] and
                  1 <= p["text_chunks"] <= output_len + 1 for p in per),
              "each request has a TTFT within its e2e and 1..%d chunks: %s" %
              (output_len + 1,
               [(p["ttft_ms"], p["e2e_ms"], p["text_chunks"]) for p in per]))
        check(l["tpot_ms"] is not None, "TPOT reported")


def test_failed_requests_are_counted(server, tmp):
    # Prompt ids beyond the vocabulary: the server answers 400. With a warm-up that is reported at
    # once; without, every measured request is a counted failure and the exit status is 1.
    rc, out, err = bench("serve", "--url", server.url, "--concurrency", "2", "--requests", "3",
                         "--input_len", "4", "--output_len", "2", "--vocab_lo", "100000",
                         "--vocab_hi", "100001")
    check(rc != 0 and "warm-up request failed" in err and "outside" in err,
          "a rejected warm-up request stops the run: rc=%d %s" % (rc, err))
    out_json = os.path.join(tmp, "fail.json")
    rc, out, err = bench("serve", "--url", server.url, "--concurrency", "2", "--requests", "3",
                         "--input_len", "4", "--output_len", "2", "--vocab_lo", "100000",
                         "--vocab_hi", "100001", "--warmup", "0", "--json", out_json)
    check(rc == 1 and "3 request(s) failed" in err, "failed requests give exit 1: rc=%d %s" %
          (rc, err))
    with open(out_json) as f:
        level = json.load(f)["levels"][0]
    check(level["ok"] == 0 and level["failed"] == 3 and level["errors"][0]["count"] == 3 and
          level["ttft_ms"] is None and level["output_throughput_tok_s"] == 0,
          "failures are reported, not dropped: %s" % {k: level[k] for k in ("ok", "failed",
                                                                            "errors")})


def test_long_prompt(server, tmp):
    # More than 64 prompt ids (loom-server's prompts-per-request limit, which a flat id list runs
    # into) and the default request count: max(4 * 2, 16) = 16.
    out_json = os.path.join(tmp, "long.json")
    rc, out, err = bench("serve", "--url", server.url, "--concurrency", "2", "--input_len",
                         "300", "--output_len", "2", "--warmup", "0", "--json", out_json)
    check(rc == 0, "a 300-token prompt is accepted: rc=%d %s" % (rc, err))
    if rc == 0:
        with open(out_json) as f:
            level = json.load(f)["levels"][0]
        check(level["requests"] == 16 and level["ok"] == 16 and level["output_tokens"] == 32,
              "default request count 16 at concurrency 2, all ok: %s" %
              {k: level[k] for k in ("requests", "ok", "output_tokens")})


def test_bad_usage(tmp):
    for flags, needle in ((["--concurrency", "0"], "--concurrency"),
                          (["--concurrency", "1,x"], "--concurrency"),
                          (["--output_len", "0"], "--output_len"),
                          (["--timeout_s", "0"], "--timeout_s"),
                          (["--json", "/nonexistent-dir/x.json"], "--json")):
        rc, out, err = bench("serve", "--url", "http://127.0.0.1:9", *flags)
        check(rc != 0 and needle in err, "%s: non-zero exit naming %s: rc=%d %r" %
              (flags, needle, rc, err))
    rc, out, err = bench("kernels")
    check(rc != 0 and "loom-bench-kernels" in err and "loom-bench-engine" in err,
          "unknown subcommand names the other benchmarks: %r" % err)
    rc, out, err = bench()
    check(rc != 0 and "serve" in err, "no subcommand: %r" % err)
    # No gnuplot on PATH: refused before any request is sent.
    empty = os.path.join(tmp, "empty-path")
    os.makedirs(empty, exist_ok=True)
    rc, out, err = bench("serve", "--url", "http://127.0.0.1:9", "--plot",
                         os.path.join(tmp, "x.png"), env={"PATH": empty})
    check(rc != 0 and "gnuplot" in err, "missing gnuplot is a clear error: %r" % err)


def test_unreachable(tmp):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    url = "http://127.0.0.1:%d" % port
    started = time.time()
    rc, out, err = bench("serve", "--url", url, "--concurrency", "1", "--requests", "1",
                         "--timeout_s", "5")
    check(rc != 0 and "cannot use the server at " + url in err,
          "unreachable server: non-zero exit naming it: rc=%d %r" % (rc, err))
    check(time.time() - started < 30, "unreachable server fails fast")


def test_api_key(tmp):
    server = Server("--api_key", "sekret")
    try:
        common = ["serve", "--url", server.url, "--concurrency", "1", "--requests", "1",
                  "--input_len", "4", "--output_len", "2", "--warmup", "0"]
        rc, out, err = bench(*common, env={"PATH": os.environ.get("PATH", ""), "LOOM_API_KEY": ""})
        check(rc != 0 and ("401" in err or "key" in err.lower()),
              "no API key: clear refusal: rc=%d %r" % (rc, err))
        rc, out, err = bench(*(common + ["--api_key", "sekret"]))
        check(rc == 0, "with the API key the run succeeds: rc=%d %r" % (rc, err))
    finally:
        server.stop()


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tmp", default="/tmp")
    ARGS = p.parse_args()
    os.makedirs(ARGS.tmp, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="loom_bench_serve_", dir=ARGS.tmp)
    server = None
    try:
        print("== test_bad_usage", flush=True)
        test_bad_usage(tmp)
        print("== test_unreachable", flush=True)
        test_unreachable(tmp)
        server = Server()  # defaults, prefix cache on: random prompts must not hit it
        print("== test_measures", flush=True)
        test_measures(server, tmp)
        print("== test_logprobs_time_every_request", flush=True)
        test_logprobs_time_every_request(server, tmp)
        print("== test_long_prompt", flush=True)
        test_long_prompt(server, tmp)
        print("== test_failed_requests_are_counted", flush=True)
        test_failed_requests_are_counted(server, tmp)
        print("== test_api_key", flush=True)
        test_api_key(tmp)
    finally:
        if server:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
