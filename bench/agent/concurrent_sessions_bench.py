#!/usr/bin/python3
"""Concurrent agent conversations against loom-server: where sessions and the prefix cache differ.

N conversations of agent traces (agent_trace.py, seeds --seed .. --seed + N - 1) run interleaved
on one server per mode: turn k of conversation 0, 1, ..., N - 1, then turn k + 1, so between two
turns of one conversation the other N - 1 run theirs. With a --cache_budget_mb that cannot hold
every conversation's history in the prefix cache as well as what the running turn needs, the
prefix cache evicts; a session's parked cache (its KV pages and its linear-attention state at
exactly the end of its last turn) is evicted only after unused prefix-cache entries
(scheduler/parked_sequences.h). Modes, as in agent_sessions_bench.py (whose turn code this
reuses): sessions (POST /v1/responses with previous_response_id, only the new items), prefix
(/v1/chat/completions with the whole history) and none (the same without the prefix cache). The
modes run turn by turn interleaved too (each request in every mode before the next), so load from
elsewhere falls on all alike.

Per turn: TTFT, prompt, cached (what the engine did not compute: the growth of
loom_prefix_cache_hit_tokens_total, which counts a resumed session's parked tokens too) and
computed (prompt - cached) tokens. Summary per mode: computed tokens and TTFT summed over turns
1.. (turn 0 computes everything in every mode), mean TTFT per turn, the turns that resumed a
session's parked cache (not every session turn does: usage's cached_tokens counts the history a
session continued even when its parked cache was evicted and recomputed), and the server's
counters.
Writes --json and --markdown (appended). Exit 0 when every turn ran, 1 when one failed, 2 for bad
arguments.

  concurrent_sessions_bench.py --server build/bin/loom-server \\
      --model ../shared/fixtures/kimi_linear_s1 --conversations 4 --turns 8 \\
      --target_tokens 8192 --cache_budget_mb 8 --markdown out.md

Python standard library only.
"""
import argparse
import http.client
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import agent_sessions_bench as asb  # noqa: E402
import agent_trace  # noqa: E402
from loom_server_process import LoomServer  # noqa: E402

MODES = asb.MODES
# Counters read from /metrics at the end of a mode's run (absent ones are left out).
COUNTERS = ("loom_prefix_cache_hit_tokens_total", "loom_session_evictions_total",
            "loom_preemptions_total")


class Conversation(asb.ModeReplay):
    """One conversation's replay on a server shared with the others of its mode."""

    def __init__(self, mode, conv, args, server):  # pylint: disable=super-init-not-called
        self.mode, self.conv, self.args, self.server = mode, conv, args, server
        self.previous_id, self.history = None, []
        self.busy_s, self.stopped = 0.0, False


def start_server(mode, args):
    extra = ["--max_model_len", "0", "--seed", "1", "--cache_budget_mb", str(args.cache_budget_mb)]
    if args.deterministic:
        extra.append("--deterministic")
    if mode == "none":
        extra.append("--enable_prefix_cache=false")
    extra += args.server_args.split()
    return LoomServer(args.server, args.model, *extra, startup_timeout_s=300)


def counters(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for name in COUNTERS:
        m = re.search(r"^%s\s+([0-9.eE+]+)" % name, body, re.M)
        if m:
            out[name] = int(float(m.group(1)))
    return out


def run(convs, modes, args, log):
    """Returns (rows, counters per mode, failure message or None)."""
    servers, rows, stats = {}, [], {}
    try:
        for mode in modes:
            servers[mode] = start_server(mode, args)
        replays = {(mode, c): Conversation(mode, conv, args, servers[mode])
                   for mode in modes for c, conv in enumerate(convs)}
        turns = [asb.turn_inputs(conv["messages"]) for conv in convs]
        for k in range(min(args.turns, min(len(t) for t in turns))):
            for c in range(len(convs)):
                for mode in modes:
                    try:
                        row = replays[(mode, c)].turn(k, turns[c][k][0])
                    except (RuntimeError, OSError) as e:
                        return rows, stats, "%s conversation %d turn %d: %s" % (mode, c, k, e)
                    row["conversation"] = c
                    rows.append(row)
                    log("%-8s conv %d turn %2d: prompt %6d cached %6d ttft %8.1f ms" % (
                        mode, c, k, row["prompt_tokens"], row["cached_tokens"],
                        row["ttft_s"] * 1e3))
        for mode in modes:
            stats[mode] = counters(servers[mode].port)
    except (RuntimeError, OSError) as e:
        return rows, stats, "loom-server: %s" % e
    finally:
        for s in servers.values():
            s.stop()
    return rows, stats, None


def summarize(rows, modes):
    out = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode and r["turn"] > 0]
        prev = {}  # conversation -> previous turn's prompt + output
        continued = 0
        for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["turn"]):
            c = r["conversation"]
            # Resumed: the engine continued the session's parked cache, the whole previous
            # prompt and reply (a session whose cache was evicted continues its token history,
            # usage's cached_tokens, but recomputes what the prefix cache does not hold).
            if r["turn"] > 0 and r["prefix_hit_tokens"] == prev.get(c):
                continued += 1
            # A turn's last token (the reply's stop token) was sampled, never fed: the parked
            # cache holds the rest.
            prev[c] = r["prompt_tokens"] + r["output_tokens"] - 1
        out[mode] = {
            "turns": len(mine),
            "computed_tokens": sum(r["computed_tokens"] for r in mine),
            "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
            "ttft_s": sum(r["ttft_s"] for r in mine),
            "mean_ttft_ms": 1e3 * sum(r["ttft_s"] for r in mine) / max(1, len(mine)),
            "continued_turns": continued,
        }
    return out


def markdown(rows, summary, stats, modes, args, header):
    lines = [header, ""]
    lines.append("| mode | turns 1.. | prompt tokens | computed tokens | computed / prompt | "
                 "sum of TTFT s | mean TTFT ms | turns resuming a parked session | counters |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        s = summary[mode]
        lines.append("| %s | %d | %d | %d | %.3f | %.1f | %.0f | %s | %s |" % (
            mode, s["turns"], s["prompt_tokens"], s["computed_tokens"],
            s["computed_tokens"] / max(1, s["prompt_tokens"]), s["ttft_s"], s["mean_ttft_ms"],
            s["continued_turns"] if mode == "sessions" else "-",
            ", ".join("%s %d" % (k.replace("loom_", ""), v)
                      for k, v in sorted(stats.get(mode, {}).items())) or "-"))
    lines += ["", "Per turn, over the %d conversations: mean TTFT ms (computed tokens summed)." %
              args.conversations, ""]
    lines.append("| turn | " + " | ".join(modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    for k in sorted({r["turn"] for r in rows}):
        cells = []
        for mode in modes:
            rs = [r for r in rows if r["mode"] == mode and r["turn"] == k]
            if not rs:
                cells.append("-")
                continue
            cells.append("%.0f (%d)" % (1e3 * sum(r["ttft_s"] for r in rs) / len(rs),
                                        sum(r["computed_tokens"] for r in rs)))
        lines.append("| %d | %s |" % (k, " | ".join(cells)))
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="the loom-server binary")
    p.add_argument("--model", required=True, help="model directory it serves")
    p.add_argument("--server_args", default="", help="more loom-server flags (space-separated)")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--target_tokens", type=int, default=8192, help="text tokens per conversation")
    p.add_argument("--cache_budget_mb", type=int, default=8, help="loom-server --cache_budget_mb")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--output_tokens", type=int, default=1)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--timeout_s", type=float, default=1800, help="per request")
    p.add_argument("--json")
    p.add_argument("--markdown", help="results file to append a section to")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print("--modes: unknown %s (known: %s)" % (bad or "(none)", ",".join(MODES)),
              file=sys.stderr)
        return 2
    if not (os.path.isfile(args.server) and os.access(args.server, os.X_OK)):
        print("--server %s is not an executable" % args.server, file=sys.stderr)
        return 2
    if args.conversations < 1 or args.turns < 1 or args.cache_budget_mb < 1:
        print("--conversations, --turns and --cache_budget_mb must be >= 1", file=sys.stderr)
        return 2
    try:
        convs = [agent_trace.generate(args.seed + i, args.target_tokens, args.turns)
                 for i in range(args.conversations)]
    except ValueError as e:
        print("trace: %s" % e, file=sys.stderr)
        return 2

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    rows, stats, failure = run(convs, modes, args, log)
    summary = summarize(rows, modes)
    header = ("### %d conversations x %d turns, %d text tokens each, --cache_budget_mb %d "
              "(seed %d, %s)" % (args.conversations, args.turns, args.target_tokens,
                                 args.cache_budget_mb, args.seed,
                                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))))
    text = markdown(rows, summary, stats, modes, args, header)
    sys.stdout.write(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "summary": summary, "counters": stats,
                       "failure": failure, "wall_s": time.time() - t0}, f, indent=1)
    if failure:
        print("FAILED: %s" % failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
