#!/usr/bin/python3
"""Agent traces against loom-server: time to first token per turn with sessions, with the prefix
cache only, and with neither.

One conversation of an agent trace (agent_trace.py) is replayed turn by turn. Turn k asks the
model for the assistant message k of the trace; its new items are what follows the previous
assistant message (turn 0: the system prompt and the task; later turns: the trace's scripted tool
call of assistant message k-1, with its thought, and the tool results). The model's own reply of
each turn (greedy, --output_tokens long) stays in the history before the scripted call, in every
mode, so all modes see the same tokens. Modes, each on its own fresh loom-server this script
starts, run interleaved turn by turn (turn k in every mode, then turn k + 1), so load from
elsewhere on a shared machine falls on all of them alike:

  sessions  POST /v1/responses, stream, previous_response_id: only the new items are sent; the
            server tokenizes only the new text after the ids the model saw (replies as
            sampled) and the engine continues from the session's kept cache (cached =
            usage.input_tokens_details.cached_tokens).
  prefix    POST /v1/chat/completions, stream, the whole history every turn; the prefix cache
            serves what earlier turns computed (cached = the growth of
            loom_prefix_cache_hit_tokens_total in /metrics over the turn).
  none      as prefix, on a server started with --enable_prefix_cache=false.

Per turn: TTFT (to the first streamed text or tool-call delta; a turn whose reply has no text,
as an untrained model's one token beyond the tokenizer's vocabulary, uses the end of the stream,
marked), total latency, prompt tokens, cached tokens, and the reply. Writes --json, --markdown
(appended) and --plot (gnuplot pngcairo). Exit status: 0 when every run turn succeeded, 1 when
one failed, 2 for bad arguments.

  agent_sessions_bench.py --server build/bin/loom-server --model ../shared/fixtures/kimi_linear_s1 \\
      --turns 30 --target_tokens 16384 --json out.json --markdown out.md --plot out.png

Python standard library only.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import agent_trace  # noqa: E402
from loom_server_process import LoomServer  # noqa: E402

MODES = ("sessions", "prefix", "none")
HIT_METRIC = re.compile(r"^loom_prefix_cache_hit_tokens_total\s+([0-9.eE+]+)", re.M)


def turn_inputs(messages):
    """The trace's messages split into turns: turn k asks for assistant message k; its new
    messages are the scripted assistant message k-1 (its thought and tool calls) and the tool
    results after it (turn 0: the system prompt and the task). The model's own reply to turn
    k-1 precedes them in the history. Returns [(new_messages, scripted assistant message k)]."""
    turns, pending = [], []
    for m in messages:
        if m["role"] == "assistant":
            turns.append((pending, m))
            # A scripted tool call opens the next turn's new messages, before its results.
            pending = [m] if m.get("tool_calls") else []
        else:
            pending.append(m)
    return turns


def as_items(messages):
    """Chat messages as Responses input items. A scripted assistant tool call becomes a message
    item with its thought followed by function_call items, which the server joins into one
    assistant message with tool_calls (server/responses_request.cc), as chat mode sends it."""
    items = []
    for m in messages:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})
        elif m.get("tool_calls"):
            items.append({"type": "message", "role": "assistant", "content": m["content"]})
            for c in m["tool_calls"]:
                items.append({"type": "function_call", "call_id": c["id"],
                              "name": c["function"]["name"],
                              "arguments": c["function"]["arguments"]})
        else:
            items.append({"type": "message", "role": m["role"], "content": m["content"]})
    return items


def responses_tools(tools):
    return [{"type": "function", "name": t["function"]["name"],
             "description": t["function"]["description"],
             "parameters": t["function"]["parameters"]} for t in tools]


def sse_events(resp):
    """Yields (event name or None, parsed data or the raw string) of a text/event-stream."""
    name, data = None, []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                yield name, (text if text == "[DONE]" else json.loads(text))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def prefix_hits(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    m = HIT_METRIC.search(body)
    if not m:
        raise RuntimeError("/metrics has no loom_prefix_cache_hit_tokens_total")
    return int(float(m.group(1)))


def stream_turn(port, path, body, timeout_s):
    """POSTs a streaming request; returns a dict with the timings, the reply and usage, or raises
    RuntimeError with the server's words."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    t0 = time.monotonic()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("%s: HTTP %d %s" % (path, resp.status, resp.read()[:500]))
    out = {"ttft_s": None, "text": "", "tool_calls": [], "usage": None, "response": None}
    calls = {}
    for name, data in sse_events(resp):
        now = time.monotonic() - t0
        if data == "[DONE]":
            break
        if isinstance(data, dict) and data.get("error"):
            raise RuntimeError("%s: error mid-stream: %s" % (path, data["error"]))
        if path == "/v1/responses":
            delta = data.get("delta") if name in ("response.output_text.delta",
                                                  "response.function_call_arguments.delta") else None
            if name == "response.output_text.delta":
                out["text"] += delta
            if name in ("response.completed", "response.incomplete"):
                out["response"] = data["response"]
                out["usage"] = data["response"]["usage"]
            if name == "response.failed":
                raise RuntimeError("response.failed: %s" % data)
        else:
            delta = None
            for choice in data.get("choices", []):
                d = choice.get("delta", {})
                if d.get("content"):
                    delta = d["content"]
                    out["text"] += d["content"]
                for tc in d.get("tool_calls") or []:
                    delta = delta or "tool"
                    c = calls.setdefault(tc["index"], {"id": "", "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
                    c["id"] = tc.get("id") or c["id"]
                    f = tc.get("function", {})
                    c["function"]["name"] += f.get("name") or ""
                    c["function"]["arguments"] += f.get("arguments") or ""
            if data.get("usage"):
                out["usage"] = data["usage"]
        if delta and out["ttft_s"] is None:
            out["ttft_s"] = now
    out["latency_s"] = time.monotonic() - t0
    conn.close()
    if out["usage"] is None:
        raise RuntimeError("%s: the stream ended without usage" % path)
    if path == "/v1/responses":
        for item in out["response"]["output"]:
            if item["type"] == "function_call":
                out["tool_calls"].append({"id": item["call_id"], "type": "function",
                                          "function": {"name": item["name"],
                                                       "arguments": item["arguments"]}})
    else:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


class ModeReplay:
    """One mode's replay of the conversation on its own loom-server (started here, stopped by
    close()). turn(k) runs turn k and returns its row."""

    def __init__(self, mode, conv, args):
        extra = ["--max_model_len", "0", "--seed", "1"]
        if args.deterministic:
            extra.append("--deterministic")
        if mode == "none":
            extra.append("--enable_prefix_cache=false")
        extra += args.server_args.split()
        self.mode, self.conv, self.args = mode, conv, args
        self.server = LoomServer(args.server, args.model, *extra, startup_timeout_s=300)
        self.previous_id, self.history = None, []
        self.busy_s = 0.0  # time spent in this mode's turns, for --mode_budget_s
        self.stopped = False

    def close(self):
        self.server.stop()

    def turn(self, k, new_msgs):
        port, args, conv = self.server.port, self.args, self.conv
        self.history += new_msgs
        hits_before = prefix_hits(port)
        sampling = {"temperature": 0, "seed": 1, "stream": True}
        if self.mode == "sessions":
            body = dict(sampling, input=as_items(new_msgs), tools=responses_tools(conv["tools"]),
                        max_output_tokens=args.output_tokens)
            if self.previous_id:
                body["previous_response_id"] = self.previous_id
            r = stream_turn(port, "/v1/responses", body, args.timeout_s)
            self.previous_id = r["response"]["id"]
            prompt = r["usage"]["input_tokens"]
            session_cached = r["usage"]["input_tokens_details"]["cached_tokens"]
            output = r["usage"]["output_tokens"]
        else:
            body = dict(sampling, messages=self.history, tools=conv["tools"],
                        max_tokens=args.output_tokens, stream_options={"include_usage": True})
            r = stream_turn(port, "/v1/chat/completions", body, args.timeout_s)
            prompt = r["usage"]["prompt_tokens"]
            session_cached = 0
            output = r["usage"]["completion_tokens"]
        hits = prefix_hits(port) - hits_before
        self.busy_s += r["latency_s"]
        reply = {"role": "assistant", "content": r["text"]}
        if r["tool_calls"]:
            reply["tool_calls"] = r["tool_calls"]
        self.history.append(reply)
        # What the engine did not compute: a session resumed from its parked cache counts its
        # kept tokens as prefix-cache hits, a session that starts over (a template that renders
        # the reply differently, a parked cache evicted under memory pressure) counts what the
        # prefix cache served. usage's cached_tokens counts the history the session continued
        # from its kept cache (on the device or restored from the offload tier), and after an
        # eviction only what the prefix cache held.
        cached = hits
        return {"mode": self.mode, "turn": k, "prompt_tokens": prompt, "cached_tokens": cached,
                "session_cached_tokens": session_cached, "prefix_hit_tokens": hits,
                "computed_tokens": prompt - cached, "output_tokens": output,
                "ttft_s": r["ttft_s"] if r["ttft_s"] is not None else r["latency_s"],
                "ttft_from_end": r["ttft_s"] is None, "latency_s": r["latency_s"],
                "reply": r["text"]}


def run_modes(modes, conv, args, log):
    """Replays the conversation in every mode, interleaved turn by turn (turn k in each mode,
    then turn k + 1), so that load from elsewhere on a shared machine falls on all modes alike.
    Returns (rows, failure message or None)."""
    replays, rows = [], []
    try:
        for mode in modes:
            replays.append(ModeReplay(mode, conv, args))
        for k, (new_msgs, _) in enumerate(turn_inputs(conv["messages"])):
            if k >= args.turns_limit:
                break
            for rep in replays:
                if rep.stopped:
                    continue
                if args.mode_budget_s and rep.busy_s > args.mode_budget_s:
                    log("%s: stopping after %d turns (--mode_budget_s %g)" % (
                        rep.mode, k, args.mode_budget_s))
                    rep.stopped = True
                    continue
                try:
                    row = rep.turn(k, new_msgs)
                except (RuntimeError, OSError) as e:
                    return rows, "%s turn %d: %s" % (rep.mode, k, e)
                rows.append(row)
                log("%-8s turn %2d: prompt %6d cached %6d ttft %8.1f ms latency %8.1f ms" % (
                    rep.mode, k, row["prompt_tokens"], row["cached_tokens"], row["ttft_s"] * 1e3,
                    row["latency_s"] * 1e3))
    except (RuntimeError, OSError) as e:
        return rows, "starting loom-server: %s" % e
    finally:
        for rep in replays:
            rep.close()
    return rows, None


def least_squares(xs, ys):
    """Coefficients b of y ~ X b (normal equations, Gaussian elimination; X is small)."""
    n = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] + [sum(x[i] * y for x, y in zip(xs, ys))]
         for i in range(n)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p] = a[p], a[i]
        if abs(a[i][i]) < 1e-300:
            return None
        for r in range(n):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [u - f * v for u, v in zip(a[r], a[i])]
    return [a[i][n] / a[i][i] for i in range(n)]


def analyse(rows):
    """Per mode: a fit of TTFT on the computed tokens and on computed x history (the new
    tokens' attention over what came before), and TTFT per computed token early and late."""
    out = {}
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode and r["turn"] > 0]
        if len(rs) < 4:
            continue
        xs = [[1.0, r["computed_tokens"],
               r["computed_tokens"] * (r["prompt_tokens"] - r["computed_tokens"]) / 1e3]
              for r in rs]
        if all(x[2] == 0 for x in xs):
            # Nothing is ever cached (mode none): the history term is not identifiable.
            fit = least_squares([x[:2] for x in xs], [r["ttft_s"] for r in rs])
            fit = fit + [float("nan")] if fit else None
        else:
            fit = least_squares(xs, [r["ttft_s"] for r in rs])
        half = len(rs) // 2
        per_tok = lambda sub: (sum(r["ttft_s"] for r in sub) /
                               max(1, sum(r["computed_tokens"] for r in sub)))
        out[mode] = {
            "fit_ms": {"base": fit[0] * 1e3, "per_computed_token": fit[1] * 1e3,
                       "per_computed_token_per_1k_history": fit[2] * 1e3} if fit else None,
            "ms_per_computed_token_first_half": per_tok(rs[:half]) * 1e3,
            "ms_per_computed_token_second_half": per_tok(rs[half:]) * 1e3,
            "ttft_ms_sum": sum(r["ttft_s"] for r in rows if r["mode"] == mode) * 1e3,
        }
    return out


def markdown(conv, rows, summary, args, header):
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    by = {(r["mode"], r["turn"]): r for r in rows}
    turns = sorted({r["turn"] for r in rows})
    lines = [header, ""]
    cols = ["turn", "new msgs tokens~"]
    for m in modes:
        cols += ["%s prompt" % m, "%s cached" % m, "%s TTFT ms" % m, "%s latency ms" % m]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    news = [sum(len(x.get("content") or "") + sum(len(c["function"]["arguments"])
                                                   for c in x.get("tool_calls", []))
                for x in new) for new, _ in turn_inputs(conv["messages"])]
    for t in turns:
        cells = [str(t), str(int(news[t] / conv["chars_per_token"]))]
        for m in modes:
            r = by.get((m, t))
            if r is None:
                cells += ["-"] * 4
            else:
                kept = " (kept)" if r["session_cached_tokens"] else ""
                cells += [str(r["prompt_tokens"]), str(r["cached_tokens"]) + kept,
                          "%.0f%s" % (r["ttft_s"] * 1e3, "*" if r["ttft_from_end"] else ""),
                          "%.0f" % (r["latency_s"] * 1e3)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("`*`: the reply had no text (an untrained model's token the tokenizer cannot "
                 "spell), so TTFT is the end of the stream; with one output token the two agree.")
    lines.append("Sessions `(kept)`: the turn continued the session's kept cache "
                 "(usage.input_tokens_details.cached_tokens); otherwise the session started over "
                 "(before 8309e97: the previous reply did not re-tokenize to itself), reading "
                 "the prefix cache up to the last whole 64-token block before it.")
    lines.append("")
    lines.append("Fits over turns 1.. (TTFT = base + a * computed + b * computed * history / 1k; "
                 "computed = prompt - cached):")
    lines.append("")
    lines.append("| mode | base ms | a: ms per computed token | b: ms per computed token per 1k "
                 "history tokens | ms per computed token, first half | second half | sum of "
                 "TTFT s |")
    lines.append("|---|---|---|---|---|---|---|")
    for m, s in summary.items():
        f = s["fit_ms"] or {"base": float("nan"), "per_computed_token": float("nan"),
                            "per_computed_token_per_1k_history": float("nan")}
        lines.append("| %s | %.1f | %.3f | %.4f | %.3f | %.3f | %.1f |" % (
            m, f["base"], f["per_computed_token"], f["per_computed_token_per_1k_history"],
            s["ms_per_computed_token_first_half"], s["ms_per_computed_token_second_half"],
            s["ttft_ms_sum"] / 1e3))
    return "\n".join(lines) + "\n"


def gnuplot_quote(s):
    return "'" + "".join(c if c.isprintable() else " " for c in s).replace("'", "''") + "'"


def plot(rows, path, title):
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    data = path + ".dat"
    with open(data, "w") as f:
        for m in modes:
            f.write("# %s\n" % m)
            for r in rows:
                if r["mode"] == m:
                    f.write("%d %d %.6f\n" % (r["turn"], r["prompt_tokens"], r["ttft_s"]))
            f.write("\n\n")
    script = "\n".join([
        "set terminal pngcairo size 900,540 noenhanced",  # names keep their _ and ~
        "set output %s" % gnuplot_quote(path),
        "set title %s" % gnuplot_quote(title),
        "set xlabel 'turn'", "set ylabel 'time to first token (s)'", "set logscale y",
        "set key top left", "set grid",
        "plot " + ", ".join("%s index %d using 1:3 with linespoints title %s" % (
            gnuplot_quote(data), i, gnuplot_quote(m)) for i, m in enumerate(modes)),
    ])
    subprocess.run(["gnuplot"], input=script.encode(), check=True)
    os.remove(data)


def merge_runs(a, p):
    """--merge: the rows of earlier runs' JSON outputs as one result. The runs must have replayed
    the same trace (same id, seed, size and turns) and no mode twice."""
    runs = []
    for path in a.merge:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            p.error("--merge %s: %s" % (path, e))
    trace = runs[0]["trace"]
    rows, modes, failed = [], [], []
    for path, r in zip(a.merge, runs):
        if r["trace"] != trace:
            p.error("--merge %s: another trace (%r, not %r)" % (path, r["trace"], trace))
        dup = [m for m in r["settings"]["modes"] if m in modes]
        if dup:
            p.error("--merge %s: mode %s is in an earlier run too" % (path, ",".join(dup)))
        modes += r["settings"]["modes"]
        rows += r["turns"]
        if r["failed"]:
            failed.append(r["failed"])
    conv = agent_trace.generate(trace["seed"], trace["target_tokens"], trace["turns"],
                                trace["chars_per_token"])
    if conv["id"] != trace["id"]:
        p.error("--merge: the trace's conversation could not be regenerated (a --trace file's?)")
    summary = analyse(rows)
    result = {"trace": trace, "merged": [dict(r["settings"], wall_s=r["wall_s"]) for r in runs],
              "wall_s": sum(r["wall_s"] for r in runs), "failed": "; ".join(failed) or None,
              "prompt_mismatches": [m for r in runs for m in r["prompt_mismatches"]],
              "summary": summary, "turns": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    model = os.path.basename(runs[0]["settings"]["model"].rstrip("/"))
    title = "%s, %d-turn agent trace of ~%d tokens" % (model, trace["turns"],
                                                       trace["approx_tokens"])
    text = markdown(conv, rows, summary, a, "### " + title)
    if a.markdown:
        with open(a.markdown, "a") as f:
            f.write(text)
    if a.plot and rows:
        plot(rows, a.plot, title)
    print(text)
    return 1 if failed else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", help="the loom-server binary")
    p.add_argument("--model", help="model directory it serves")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="no replay: one table, fit and plot from the --json outputs of earlier "
                   "runs of the same trace (e.g. one mode a run where one device holds one "
                   "server at a time); writes --json, --markdown, --plot")
    p.add_argument("--server_args", default="", help="more loom-server flags (space-separated)")
    p.add_argument("--trace", help="agent_trace.py JSONL; default: generate one from the flags below")
    p.add_argument("--conversation", type=int, default=0, help="line of --trace to replay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--target_tokens", type=int, default=65536)
    p.add_argument("--chars_per_token", type=float, default=1.0)
    p.add_argument("--turns_limit", type=int, default=1 << 30,
                   help="replay only the first N turns")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--output_tokens", type=int, default=1,
                   help="greedy tokens per reply (1: an untrained model's longer replies do not "
                   "re-tokenize to themselves, so the whole-history modes' prompts would "
                   "differ from the session's; docs/api.md)")
    p.add_argument("--deterministic", action="store_true",
                   help="start the servers with --deterministic (bit-identical replies in every mode)")
    p.add_argument("--mode_budget_s", type=float, default=0,
                   help="stop a mode's replay once its turns have taken this long in all (0: no "
                   "limit); its later turns are reported as not run")
    p.add_argument("--timeout_s", type=float, default=1800, help="per request")
    p.add_argument("--json")
    p.add_argument("--markdown", help="results file to append a section to")
    p.add_argument("--plot", help="PNG of TTFT per turn (gnuplot pngcairo)")
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error("--modes takes a comma-separated subset of %s, got %r" % (",".join(MODES), a.modes))
    if a.output_tokens < 1:
        p.error("--output_tokens must be >= 1")
    if a.plot and not shutil.which("gnuplot"):
        p.error("--plot needs gnuplot (Debian gnuplot-nox)")
    if a.merge:
        return merge_runs(a, p)
    if not a.server or not a.model:
        p.error("--server and --model are required (unless --merge)")
    if not os.access(a.server, os.X_OK):
        p.error("--server %s is not an executable" % a.server)
    try:
        if a.trace:
            with open(a.trace) as f:
                lines = [l for l in f if l.strip()]
            if not 0 <= a.conversation < len(lines):
                p.error("--conversation %d: %s has %d" % (a.conversation, a.trace, len(lines)))
            conv = json.loads(lines[a.conversation])
        else:
            conv = agent_trace.generate(a.seed, a.target_tokens, a.turns, a.chars_per_token)
        agent_trace.check_conversation(conv)
    except ValueError as e:
        p.error(str(e))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    rows, failed = run_modes(modes, conv, a, log)
    if failed:
        log("FAILED " + failed)
    wall = time.monotonic() - t0
    summary = analyse(rows)
    # The whole-history modes compute over the same tokens: their prompt sizes must agree turn by
    # turn. So must sessions', except after a reply that does not re-tokenize to itself: a session
    # continues from the reply's ids as sampled (its turn reads the whole kept history), where the
    # whole history encodes the reply's text anew.
    mismatch = []
    by = {(r["mode"], r["turn"]): r for r in rows}
    for r in rows:
        other = [o for o in rows if o["turn"] == r["turn"] and o["mode"] < r["mode"]]
        for o in other:
            if o["prompt_tokens"] == r["prompt_tokens"]:
                continue
            s = r if r["mode"] == "sessions" else o if o["mode"] == "sessions" else None
            prev = by.get(("sessions", r["turn"] - 1))
            if s is not None and prev is not None and s["session_cached_tokens"] == \
                    prev["prompt_tokens"] + prev["output_tokens"]:
                continue
            mismatch.append((r["turn"], o["mode"], o["prompt_tokens"], r["mode"],
                             r["prompt_tokens"]))
    for m in mismatch:
        log("turn %d: %s prompt %d != %s prompt %d" % m)
    result = {"trace": {k: conv[k] for k in ("id", "seed", "target_tokens", "turns",
                                              "chars_per_token", "approx_tokens")},
              "settings": {"model": a.model, "output_tokens": a.output_tokens,
                           "deterministic": a.deterministic, "server_args": a.server_args,
                           "modes": modes, "turns_limit": a.turns_limit,
                           "mode_budget_s": a.mode_budget_s},
              "wall_s": wall, "failed": failed, "prompt_mismatches": mismatch,
              "summary": summary, "turns": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    title = "%s, %d-turn agent trace of ~%d tokens" % (os.path.basename(a.model.rstrip("/")),
                                                       conv["turns"], conv["approx_tokens"])
    if a.markdown:
        with open(a.markdown, "a") as f:
            f.write(markdown(conv, rows, summary, a, "### " + title))
    if a.plot and rows:
        plot(rows, a.plot, title)
    print(markdown(conv, rows, summary, a, "### " + title))
    print("wall %.1f s" % wall)
    return 1 if failed or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
