#!/usr/bin/python3
"""End to end: concurrent_sessions_bench.py against real loom-servers on a fixture model (ctest
concurrent_sessions_bench_e2e, label integration; Python standard library only).

Two short conversations (3 turns, ~1500 text tokens each) interleaved in all three modes with
--deterministic on a small cache: prefix and none see the same prompt sizes and give the same
replies for every conversation and turn (the same requests; only caching differs); none reads
nothing cached and computes every prompt token; every row's computed tokens are its prompt less
its cached ones; a session turn continues its conversation's whole previous prompt and reply,
some resume the parked cache (the engine computes none of it); the summary and the server counters are there, the
markdown holds the tables. Bad arguments exit 2 with the reason."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from checks import check, summary  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tmp", required=True)
    a = p.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    bench = [sys.executable, os.path.join(HERE, "concurrent_sessions_bench.py"), "--server",
             a.server, "--model", a.model]
    out_json = os.path.join(a.tmp, "concurrent.json")
    out_md = os.path.join(a.tmp, "concurrent.md")
    if os.path.exists(out_md):
        os.remove(out_md)
    convs, turns = 2, 3
    run = subprocess.run(bench + ["--conversations", str(convs), "--turns", str(turns),
                                  "--target_tokens", "1500", "--cache_budget_mb", "3",
                                  "--server_args", "--max_num_seqs 4", "--deterministic",
                                  "--json", out_json, "--markdown", out_md],
                         capture_output=True, text=True, timeout=600)
    print(run.stderr[-3000:])
    check(run.returncode == 0, "bench exit %d" % run.returncode)
    with open(out_json) as f:
        res = json.load(f)
    rows = res["rows"]
    by = {(r["mode"], r["conversation"], r["turn"]): r for r in rows}
    check(len(rows) == convs * turns * 3 and len(by) == len(rows),
          "%d conversations x %d turns x 3 modes: %d rows" % (convs, turns, len(rows)))
    check(res["failure"] is None, "no failure")
    continued = 0
    for c in range(convs):
        for t in range(turns):
            s, pf, n = by[("sessions", c, t)], by[("prefix", c, t)], by[("none", c, t)]
            where = "conversation %d turn %d" % (c, t)
            check(pf["prompt_tokens"] == n["prompt_tokens"] and pf["reply"] == n["reply"],
                  "%s: prefix and none agree" % where)
            check(n["cached_tokens"] == 0, "%s: none caches nothing" % where)
            for r in (s, pf, n):
                check(r["computed_tokens"] == r["prompt_tokens"] - r["cached_tokens"] and
                      0 < r["ttft_s"] <= r["latency_s"] and r["output_tokens"] == 1,
                      "%s %s row consistent" % (where, r["mode"]))
            if t > 0:
                prev = by[("sessions", c, t - 1)]
                whole = prev["prompt_tokens"] + prev["output_tokens"]
                check(s["session_cached_tokens"] in (0, whole),
                      "%s: a session continues its whole history or starts over" % where)
                check(s["cached_tokens"] <= whole, "%s: a session reads at most its history" % where)
                if s["cached_tokens"] == whole - 1:  # parked: all but the unfed stop token
                    continued += 1
    check(continued > 0, "some session turn continued (%d)" % continued)
    summ = res["summary"]
    check(summ["sessions"]["continued_turns"] == continued, "summary counts the continued turns")
    check(summ["none"]["computed_tokens"] == summ["none"]["prompt_tokens"] > 0,
          "none computes every prompt token")
    for mode in ("sessions", "prefix", "none"):
        check("loom_prefix_cache_hit_tokens_total" in res["counters"].get(mode, {}),
              "%s: server counters read" % mode)
    check(res["counters"]["none"]["loom_prefix_cache_hit_tokens_total"] == 0,
          "none: no prefix-cache hits")
    with open(out_md) as f:
        md = f.read()
    check(md.count("\n| sessions |") == 1 and md.count("\n| 2 |") == 1, "markdown tables")

    for extra, words in [(["--modes", "sessions,bogus"], "--modes"),
                         (["--conversations", "0"], "--conversations"),
                         (["--turns", "30", "--target_tokens", "100"], "too small")]:
        bad = subprocess.run(bench + extra, capture_output=True, text=True, timeout=60)
        check(bad.returncode == 2 and words in bad.stderr,
              "%s: exit %d %s" % (extra, bad.returncode, bad.stderr[-200:]))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
