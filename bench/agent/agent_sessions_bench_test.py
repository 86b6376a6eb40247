#!/usr/bin/python3
"""End to end: agent_sessions_bench.py against real loom-servers on a fixture model (ctest
agent_sessions_bench_e2e, label integration; Python standard library only).

A short trace (4 turns, ~2500 tokens) in all three modes with --deterministic: the prefix and
none modes see the same prompt sizes and give the same replies turn by turn, and so does the
sessions mode except after a reply that does not re-tokenize to itself (it then continues from the
reply's ids as sampled); mode none reads nothing cached;
from turn 1 on, prefix and sessions read cached tokens, sessions at least as many as the prefix
cache (a continued session reads its whole history, one that starts over reads the prefix cache);
a continued session's cached tokens are exactly the previous turn's prompt and reply, and some
turn does continue (seed 0 under --deterministic: its turn-1 reply re-tokenizes to itself); the
JSON and markdown outputs hold the rows. Bad arguments exit 2 with the reason."""
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
    bench = [sys.executable, os.path.join(HERE, "agent_sessions_bench.py"), "--server", a.server,
             "--model", a.model]
    out_json = os.path.join(a.tmp, "agent.json")
    out_md = os.path.join(a.tmp, "agent.md")
    if os.path.exists(out_md):
        os.remove(out_md)
    run = subprocess.run(bench + ["--turns", "4", "--target_tokens", "2500", "--seed", "0",
                                  "--deterministic", "--json", out_json, "--markdown", out_md],
                         capture_output=True, text=True, timeout=600)
    print(run.stderr[-3000:])
    check(run.returncode == 0, "bench exit %d" % run.returncode)
    with open(out_json) as f:
        res = json.load(f)
    rows = res["turns"]
    by = {(r["mode"], r["turn"]): r for r in rows}
    check(len(rows) == 12, "4 turns x 3 modes: %d rows" % len(rows))
    check(res["prompt_mismatches"] == [] and res["failed"] is None, "no mismatch, no failure")
    for t in range(4):
        s, pf, n = by[("sessions", t)], by[("prefix", t)], by[("none", t)]
        check(pf["prompt_tokens"] == n["prompt_tokens"], "turn %d prompt tokens agree" % t)
        check(pf["reply"] == n["reply"], "turn %d replies agree" % t)
        # A session continues from its replies' ids as sampled; where one of them does not
        # re-tokenize to itself the whole history is encoded differently (then the session must
        # have continued its whole kept history, checked below).
        if s["prompt_tokens"] == pf["prompt_tokens"]:
            check(s["reply"] == pf["reply"], "turn %d session reply agrees" % t)
        else:
            check(t > 0 and s["session_cached_tokens"] > 0,
                  "turn %d: a session prompt that differs continued its kept ids" % t)
        check(n["cached_tokens"] == 0, "turn %d: none caches nothing" % t)
        for r in (s, pf, n):
            check(r["computed_tokens"] == r["prompt_tokens"] - r["cached_tokens"] and
                  0 < r["ttft_s"] <= r["latency_s"] and r["output_tokens"] == 1,
                  "turn %d %s row consistent" % (t, r["mode"]))
        if t == 0:
            check(s["cached_tokens"] == pf["cached_tokens"] == 0, "turn 0 computes everything")
            continue
        check(pf["cached_tokens"] > 0 and pf["cached_tokens"] % 64 == 0,
              "turn %d: prefix cache hits whole blocks (%d)" % (t, pf["cached_tokens"]))
        check(s["cached_tokens"] >= pf["cached_tokens"],
              "turn %d: sessions %d >= prefix %d" % (t, s["cached_tokens"], pf["cached_tokens"]))
        prev = by[("sessions", t - 1)]
        if s["session_cached_tokens"]:
            check(s["session_cached_tokens"] == prev["prompt_tokens"] + prev["output_tokens"],
                  "turn %d: a continued session reads its whole history" % t)
    check(any(by[("sessions", t)]["session_cached_tokens"] > 0 for t in range(1, 4)),
          "some turn continued the session")
    with open(out_md) as f:
        md = f.read()
    check(md.count("\n| 3 |") == 1 and "sessions TTFT ms" in md, "markdown table")

    # --merge: the run split into one JSON a mode (as runs on a device that holds one server at a
    # time write them) gives back the same rows, fits and table.
    parts = []
    for m in ("sessions", "prefix", "none"):
        part = dict(res, turns=[r for r in rows if r["mode"] == m],
                    settings=dict(res["settings"], modes=[m]))
        parts.append(os.path.join(a.tmp, "agent-%s.json" % m))
        with open(parts[-1], "w") as f:
            json.dump(part, f)
    merged_json = os.path.join(a.tmp, "merged.json")
    merged = subprocess.run(bench + ["--merge"] + parts + ["--json", merged_json],
                            capture_output=True, text=True, timeout=60)
    check(merged.returncode == 0, "merge exit %d %s" % (merged.returncode, merged.stderr[-300:]))
    with open(merged_json) as f:
        mres = json.load(f)
    check(sorted(map(json.dumps, mres["turns"])) == sorted(map(json.dumps, rows)), "merged rows")
    check(mres["summary"] == res["summary"], "merged fits")
    check(md.split("### ")[1].split("\n", 1)[1] in merged.stdout, "merged table")
    twice = subprocess.run(bench + ["--merge", parts[0], parts[0]], capture_output=True, text=True,
                           timeout=60)
    check(twice.returncode == 2 and "earlier run" in twice.stderr, "a mode merged twice")
    other = dict(json.load(open(parts[1])), trace=dict(res["trace"], seed=7))
    with open(parts[1], "w") as f:
        json.dump(other, f)
    diff = subprocess.run(bench + ["--merge", parts[0], parts[1]], capture_output=True, text=True,
                          timeout=60)
    check(diff.returncode == 2 and "another trace" in diff.stderr, "runs of another trace")

    for extra, words in [(["--modes", "sessions,bogus"], "--modes"),
                         (["--turns", "30", "--target_tokens", "100"], "too small"),
                         (["--output_tokens", "0"], "--output_tokens")]:
        bad = subprocess.run(bench + extra, capture_output=True, text=True, timeout=60)
        check(bad.returncode == 2 and words in bad.stderr,
              "%s: exit %d %s" % (extra, bad.returncode, bad.stderr[-200:]))
    bad = subprocess.run([sys.executable, os.path.join(HERE, "agent_sessions_bench.py"),
                          "--server", os.path.join(a.tmp, "missing"), "--model", a.model],
                         capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "not an executable" in bad.stderr, "missing server")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
