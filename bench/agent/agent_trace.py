#!/usr/bin/python3
"""Agent traces: long multi-turn tool-use conversations for the session benchmarks and tests.

A conversation is what a coding agent accumulates: a system prompt, a user task, then assistant
turns that each call one or two tools (read a file, search, run a command, list a directory),
the tools' results (a few hundred to tens of thousands of tokens each), and a final answer. Every
conversation is determined by its seed, its target length and its turn count; the text is ASCII
made of code-, log- and listing-like lines, so its byte count is its length under the byte-level
tokenizers of the bundled and fixture models.

Output: JSONL, one conversation per line, in OpenAI's chat format:
  {"id", "seed", "target_tokens", "turns", "chars_per_token", "approx_tokens",
   "tools": [{"type": "function", "function": {"name", "description", "parameters"}}],
   "messages": [{"role": "system"}, {"role": "user"},
                {"role": "assistant", "content": "...", "tool_calls": [{"id", "type", "function":
                 {"name", "arguments"}}]}, {"role": "tool", "tool_call_id", "content"}, ...,
                {"role": "assistant", "content": "final answer"}]}
`turns` is the number of assistant messages (turns - 1 with tool calls, then the answer);
`approx_tokens` is the characters of every content and tool-call argument string divided by
`chars_per_token` (chat-template tokens excluded), within 1% of `target_tokens` unless the target
is too small for the turns (an error).

  agent_trace.py --seed 1 --conversations 4 --turns 30 --target_tokens 65536 --out traces.jsonl

Python standard library only, like the other bench and integration scripts.
"""
import argparse
import json
import math
import random
import sys

TOOLS = [
    ("read_file", "Read a file of the repository.",
     {"path": {"type": "string", "description": "path relative to the repository root"}}),
    ("search", "Search the repository for a regular expression.",
     {"pattern": {"type": "string"}, "glob": {"type": "string"}}),
    ("run_command", "Run a shell command in the repository and return its output.",
     {"command": {"type": "string"}}),
    ("list_dir", "List a directory of the repository.",
     {"path": {"type": "string"}}),
]

WORDS = ("engine request batch token cache page slot state prefill decode layer expert router "
         "kernel tensor stream session turn prompt reply budget queue step rank shard weight "
         "config parser template tool call result error status check index offset length "
         "buffer arena scratch graph bucket metric counter gauge latency window chunk block hash "
         "prefix suffix history turn value field record entry").split()
DIRS = ["engine", "scheduler", "kernels/cpu", "server", "weights", "core", "trainer", "tests/unit"]
EXTS = [".cc", ".h", ".py", ".md", ".json"]

# Tool results are drawn log-uniformly between these (tokens), then scaled to the target: agent
# tool output is heavy-tailed (most reads are short, a few dump whole files or logs).
MIN_RESULT_TOKENS = 200
MAX_RESULT_TOKENS = 40000
# Below this a result is too short to be a plausible tool output.
FLOOR_RESULT_TOKENS = 64


def _ident(rng):
    return "_".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def _path(rng):
    return "%s/%s%s" % (rng.choice(DIRS), _ident(rng), rng.choice(EXTS))


def _line(rng, kind):
    """One line of tool output, ASCII, never empty."""
    if kind == "read_file":
        indent = " " * (2 * rng.randint(0, 3))
        pick = rng.random()
        if pick < 0.4:
            return "%sint64_t %s = %s(%s, %d);" % (indent, _ident(rng), _ident(rng),
                                                   _ident(rng), rng.randint(0, 4096))
        if pick < 0.6:
            return "%s// %s" % (indent, " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))))
        if pick < 0.8:
            return "%sif (%s.%s() > %d) return %s;" % (indent, _ident(rng), _ident(rng),
                                                      rng.randint(0, 512), _ident(rng))
        return "%s}" % indent
    if kind == "search":
        return "%s:%d: %s %s" % (_path(rng), rng.randint(1, 2000), _ident(rng),
                                 " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))))
    if kind == "run_command":
        return "[%6.3fs] %s %s: %s=%d" % (rng.random() * 100, rng.choice(["INFO", "WARN", "TEST"]),
                                          _ident(rng), _ident(rng), rng.randint(0, 99999))
    return "%s %8d %s" % (rng.choice(["-rw-r--r--", "drwxr-xr-x"]), rng.randint(0, 10 ** 6),
                          _path(rng))


def _text_of_length(rng, kind, chars):
    """Lines of `kind` joined by newlines, exactly `chars` characters (chars >= 1)."""
    lines, size = [], 0
    while size < chars:
        line = _line(rng, kind)
        lines.append(line)
        size += len(line) + 1
    text = "\n".join(lines)
    return text[:chars]


def _arguments(rng, name):
    if name == "read_file" or name == "list_dir":
        return {"path": _path(rng)}
    if name == "search":
        return {"pattern": _ident(rng), "glob": "*" + rng.choice(EXTS)}
    return {"command": "ctest -R %s --output-on-failure" % _ident(rng)}


def _sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def generate(seed, target_tokens, turns, chars_per_token=1.0, conversation_id=None):
    """One conversation (a dict, see the module doc), determined by the arguments.

    Raises ValueError when the target cannot hold the turns' fixed messages plus a
    FLOOR_RESULT_TOKENS result per tool call."""
    if turns < 1:
        raise ValueError("turns must be >= 1, got %d" % turns)
    if not chars_per_token > 0:
        raise ValueError("chars_per_token must be positive, got %r" % chars_per_token)
    rng = random.Random("agent-trace/%d" % seed)
    tools = [{"type": "function",
              "function": {"name": n, "description": d,
                           "parameters": {"type": "object", "properties": p,
                                          "required": sorted(p)[:1]}}}
             for n, d, p in TOOLS]
    task = "In the repository, %s Then %s Report what you changed." % (
        _sentence(rng, 8, 16), _sentence(rng, 6, 12).lower())
    messages = [
        {"role": "system",
         "content": "You are a coding agent working in a C++ repository. Use the tools to read, "
                    "search and run commands; answer when the task is done. " +
                    _sentence(rng, 20, 40)},
        {"role": "user", "content": task},
    ]
    # The assistant turns first (their sizes are fixed), then the results share what is left.
    calls_per_turn = []
    for t in range(turns - 1):
        calls = []
        for c in range(2 if rng.random() < 0.2 else 1):
            name = rng.choice(TOOLS)[0]
            calls.append({"id": "call_%d_%d_%d" % (seed, t, c), "type": "function",
                          "function": {"name": name,
                                       "arguments": json.dumps(_arguments(rng, name))}})
        calls_per_turn.append(calls)
    thoughts = [_sentence(rng, 3, 10) for _ in range(turns - 1)]
    answer = "Done. " + " ".join(_sentence(rng, 6, 14) for _ in range(rng.randint(2, 5)))

    def chars_of(msgs):
        n = 0
        for m in msgs:
            n += len(m.get("content") or "")
            for call in m.get("tool_calls", []):
                n += len(call["function"]["arguments"])
        return n

    fixed = messages + [{"role": "assistant", "content": th, "tool_calls": calls}
                        for th, calls in zip(thoughts, calls_per_turn)]
    fixed.append({"role": "assistant", "content": answer})
    target_chars = int(round(target_tokens * chars_per_token))
    n_results = sum(len(c) for c in calls_per_turn)
    budget = target_chars - chars_of(fixed)
    floor_chars = int(math.ceil(FLOOR_RESULT_TOKENS * chars_per_token))
    if budget < n_results * floor_chars:
        raise ValueError(
            "target_tokens %d is too small for %d turns: their fixed messages take %d tokens and "
            "each of the %d tool results needs at least %d" % (
                target_tokens, turns, int(chars_of(fixed) / chars_per_token), n_results,
                FLOOR_RESULT_TOKENS))
    sizes = []
    if n_results:
        raw = [math.exp(rng.uniform(math.log(MIN_RESULT_TOKENS), math.log(MAX_RESULT_TOKENS)))
               for _ in range(n_results)]
        scale = budget / sum(raw)
        sizes = [max(floor_chars, int(r * scale)) for r in raw]
        # Flooring and rounding leave the sum off by a little: settle it on the largest result.
        sizes[sizes.index(max(sizes))] += budget - sum(sizes)
    k = 0
    for thought, calls in zip(thoughts, calls_per_turn):
        messages.append({"role": "assistant", "content": thought, "tool_calls": calls})
        for call in calls:
            kind = call["function"]["name"]
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": _text_of_length(rng, kind, sizes[k])})
            k += 1
    if turns == 1:
        # No tool calls: the answer carries the whole budget.
        answer += "\n" + _text_of_length(rng, "read_file", max(1, budget - 1))
    messages.append({"role": "assistant", "content": answer})
    return {
        "id": conversation_id if conversation_id is not None else "agent-%d" % seed,
        "seed": seed,
        "target_tokens": target_tokens,
        "turns": turns,
        "chars_per_token": chars_per_token,
        "approx_tokens": int(round(chars_of(messages) / chars_per_token)),
        "tools": tools,
        "messages": messages,
    }


def check_conversation(conv):
    """Raises ValueError unless `conv` is a well-formed trace: system then user first, every
    assistant message but the last has tool_calls each answered, in order, by one tool message
    right after it, the last message is an assistant answer without tool calls, and `turns`
    counts the assistant messages."""
    msgs = conv["messages"]
    if len(msgs) < 3 or msgs[0]["role"] != "system" or msgs[1]["role"] != "user":
        raise ValueError("a trace starts with a system and a user message")
    names = {t["function"]["name"] for t in conv["tools"]}
    i, assistants = 2, 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant":
            raise ValueError("message %d: expected an assistant message, got %s" % (i, m["role"]))
        assistants += 1
        calls = m.get("tool_calls") or []
        if not calls:
            if i != len(msgs) - 1:
                raise ValueError("message %d: an assistant answer ends the trace" % i)
            if not m["content"]:
                raise ValueError("the final answer is empty")
            break
        for j, call in enumerate(calls):
            if call["type"] != "function" or call["function"]["name"] not in names:
                raise ValueError("message %d: call %d names no declared tool" % (i, j))
            json.loads(call["function"]["arguments"])
            result = msgs[i + 1 + j] if i + 1 + j < len(msgs) else None
            if not result or result["role"] != "tool" or result["tool_call_id"] != call["id"]:
                raise ValueError("message %d: call %s is not answered next" % (i, call["id"]))
            if not result["content"]:
                raise ValueError("message %d: empty tool result" % (i + 1 + j))
        i += 1 + len(calls)
    if assistants != conv["turns"]:
        raise ValueError("%d assistant messages, turns says %d" % (assistants, conv["turns"]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the first conversation; "
                   "conversation i uses seed + i")
    p.add_argument("--conversations", type=int, default=1)
    p.add_argument("--turns", type=int, default=30, help="assistant messages per conversation")
    p.add_argument("--target_tokens", type=int, default=65536,
                   help="length of each conversation in tokens (chat-template tokens excluded)")
    p.add_argument("--chars_per_token", type=float, default=1.0,
                   help="characters per token of the target tokenizer: 1 for byte-level "
                   "tokenizers (the bundled and fixture models), about 4 for BPE tokenizers")
    p.add_argument("--out", default="-", help="JSONL file; - is stdout")
    a = p.parse_args(argv)
    if a.conversations < 1:
        p.error("--conversations must be >= 1")
    try:
        convs = [generate(a.seed + i, a.target_tokens, a.turns, a.chars_per_token)
                 for i in range(a.conversations)]
    except ValueError as e:
        p.error(str(e))
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    for c in convs:
        out.write(json.dumps(c) + "\n")
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
