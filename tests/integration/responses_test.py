#!/usr/bin/python3
"""End-to-end test of POST /v1/responses (the OpenAI Responses API) and GET / DELETE
/v1/responses/{id} on a real loom-server (Python standard library only).

With --deterministic and fixed seeds: each turn of a 3-turn conversation continued with
previous_response_id continues the whole kept history (usage.input_tokens_details.cached_tokens =
the previous turn's input and output tokens: nothing recomputed, the reply's ids as sampled) and,
while every earlier reply re-tokenizes to its ids (one-token replies), gives exactly the text and
token counts of sending the whole history in one request (as /v1/responses input items with
store: false, and as /v1/chat/completions messages); longer replies of this untrained model do not
re-tokenize to themselves (bytes that are not whole characters, ids the tokenizer cannot spell),
which shows as the whole history's input token count differing, and the turns after them still
continue, from the ids the model saw; unknown, deleted and store: false ids give
404 in OpenAI's error shape; the streaming event sequence (types in order, sequence numbers, deltas
adding up to the stored text); unsupported parameters give 400 naming them; the API key guards the
routes; /metrics shows the sessions.
"""
import argparse
import http.client
import json
import sys

from checks import check, summary
from loom_server_process import LoomServer

ARGS = None


def request(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, json.dumps(body) if body is not None else None, h)
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def post(port, body, **kw):
    return request(port, "POST", "/v1/responses", body, **kw)


def text_of(resp):
    return "".join(part["text"] for item in resp["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def is_openai_error(body, code=None):
    e = body.get("error") if isinstance(body, dict) else None
    return (isinstance(e, dict) and isinstance(e.get("message"), str) and "type" in e and
            (code is None or e.get("code") == code))


def conversation(port, turns, max_output_tokens, seeds, what):
    """Runs `turns` (user texts) continued with previous_response_id, then checks each turn
    against the whole history sent at once. Returns the turns' cached_tokens."""
    sampling = {"temperature": 0.8, "max_output_tokens": max_output_tokens}
    history_items, history_messages = [], []
    previous = None
    cached = []
    previous_total = 0
    canonical = True  # the whole history re-tokenizes to the ids the session holds
    for k, (user, seed) in enumerate(zip(turns, seeds)):
        body = dict(sampling, input=user, seed=seed, instructions="Be brief.")
        if previous:
            body["previous_response_id"] = previous
        status, resp = post(port, body)
        if not check(status == 200, "%s turn %d: %d %s" % (what, k, status, resp)):
            return cached
        check(resp["status"] in ("completed", "incomplete"), "%s turn %d status" % (what, k))
        check(resp["previous_response_id"] == previous, "%s turn %d echo" % (what, k))
        cached.append(resp["usage"]["input_tokens_details"]["cached_tokens"])
        check(cached[-1] == previous_total,
              "%s turn %d: continued %d tokens, not the whole kept history's %d" %
              (what, k, cached[-1], previous_total))
        previous_total = resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"]
        history_items.append({"role": "user", "content": user})
        history_messages.append({"role": "user", "content": user})
        # The whole history in one request: Responses input items, not stored.
        status, whole = post(port, dict(sampling, input=list(history_items), seed=seed,
                                        instructions="Be brief.", store=False))
        check(status == 200, "%s turn %d whole: %d" % (what, k, status))
        # (On this byte-level fixture a reply that does not re-tokenize changes the count: a
        # partial character becomes U+FFFD's 3 bytes, an id with no spelling none.)
        canonical = canonical and whole["usage"]["input_tokens"] == resp["usage"]["input_tokens"]
        if not canonical:
            history_items.append({"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": text_of(resp)}]})
            history_messages.append({"role": "assistant", "content": text_of(resp)})
            status, got = request(port, "GET", "/v1/responses/" + resp["id"])
            check(status == 200 and got == resp, "%s turn %d: GET differs" % (what, k))
            previous = resp["id"]
            continue
        check(text_of(whole) == text_of(resp),
              "%s turn %d: continued %r != whole history %r" % (what, k, text_of(resp),
                                                                text_of(whole)))
        for key in ("input_tokens", "output_tokens"):
            check(whole["usage"][key] == resp["usage"][key],
                  "%s turn %d %s: %d != %d" % (what, k, key, resp["usage"][key],
                                               whole["usage"][key]))
        # And as chat completions messages.
        status, chat = request(port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "system", "content": "Be brief."}] + history_messages,
            "seed": seed, "temperature": 0.8, "max_tokens": max_output_tokens})
        check(status == 200, "%s turn %d chat: %d" % (what, k, status))
        if status == 200:
            check(chat["choices"][0]["message"]["content"] == text_of(resp),
                  "%s turn %d: chat completions %r != %r" % (
                      what, k, chat["choices"][0]["message"]["content"], text_of(resp)))
            check(chat["usage"]["prompt_tokens"] == resp["usage"]["input_tokens"],
                  "%s turn %d: chat prompt tokens" % (what, k))
            check(chat["usage"]["completion_tokens"] == resp["usage"]["output_tokens"],
                  "%s turn %d: chat completion tokens" % (what, k))
        history_items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text_of(resp)}]})
        history_messages.append({"role": "assistant", "content": text_of(resp)})
        # GET returns the stored response as POST returned it.
        status, got = request(port, "GET", "/v1/responses/" + resp["id"])
        check(status == 200 and got == resp, "%s turn %d: GET differs" % (what, k))
        previous = resp["id"]
    return cached


def stream_events(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read().decode()
    conn.close()
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        name = lines[0][len("event: "):] if lines[0].startswith("event: ") else None
        data = [l[len("data: "):] for l in lines if l.startswith("data: ")]
        events.append((name, json.loads(data[0]) if data else None))
    return r.status, r.getheader("Content-Type"), events


def test_streaming(port):
    body = {"input": "Tell me", "seed": 5, "temperature": 0.8, "max_output_tokens": 12}
    status, ctype, events = stream_events(port, dict(body, stream=True))
    check(status == 200 and ctype.startswith("text/event-stream"), "stream status %d" % status)
    types = [e[1]["type"] for e in events]
    check(all(name == data["type"] for name, data in events), "event: names = data types")
    check([e[1]["sequence_number"] for e in events] == list(range(len(events))),
          "sequence numbers 0..n-1")
    check(types[:2] == ["response.created", "response.in_progress"], "stream head %s" % types[:2])
    check(types[-1] in ("response.completed", "response.incomplete"), "stream end %s" % types[-1])
    deltas = "".join(e[1]["delta"] for e in events if e[1]["type"] == "response.output_text.delta")
    final = events[-1][1]["response"]
    check(deltas == text_of(final), "deltas add up to the final text")
    if deltas:
        want = ["response.output_item.added", "response.content_part.added"]
        check(types[2:4] == want, "message opened: %s" % types[2:4])
        check(types[-5:-1] == ["response.output_text.done", "response.content_part.done",
                               "response.output_item.done"][-4:] or
              types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                               "response.output_item.done"], "message closed: %s" % types[-5:])
    # Stored and equal to the same request not streamed.
    status, got = request(port, "GET", "/v1/responses/" + final["id"])
    check(status == 200 and text_of(got) == deltas, "streamed response stored")
    status, plain = post(port, dict(body, store=False))
    check(status == 200 and text_of(plain) == deltas,
          "streamed %r != not streamed %r" % (deltas, text_of(plain)))
    check(plain["usage"]["output_tokens"] == final["usage"]["output_tokens"], "stream usage")


def test_ids(port):
    status, body = post(port, {"input": "x", "previous_response_id": "resp_nope"})
    check(status == 404 and is_openai_error(body, "previous_response_not_found"),
          "unknown previous_response_id: %d %s" % (status, body))
    status, body = request(port, "GET", "/v1/responses/resp_nope")
    check(status == 404 and is_openai_error(body), "GET unknown: %d" % status)
    status, body = request(port, "DELETE", "/v1/responses/resp_nope")
    check(status == 404 and is_openai_error(body), "DELETE unknown: %d" % status)
    # store: false is neither retrievable nor continuable.
    status, r = post(port, {"input": "x", "store": False, "max_output_tokens": 2})
    check(status == 200 and r["store"] is False, "store false: %d" % status)
    status, body = request(port, "GET", "/v1/responses/" + r["id"])
    check(status == 404, "store false retrievable: %d" % status)
    status, body = post(port, {"input": "y", "previous_response_id": r["id"]})
    check(status == 404 and is_openai_error(body, "previous_response_not_found"),
          "store false continued: %d" % status)
    # Delete.
    status, r = post(port, {"input": "x", "max_output_tokens": 2})
    status, body = request(port, "DELETE", "/v1/responses/" + r["id"])
    check(status == 200 and body == {"id": r["id"], "object": "response", "deleted": True},
          "DELETE: %d %s" % (status, body))
    status, body = request(port, "GET", "/v1/responses/" + r["id"])
    check(status == 404, "GET after DELETE: %d" % status)
    status, body = request(port, "DELETE", "/v1/responses/" + r["id"])
    check(status == 404, "DELETE twice: %d" % status)
    status, body = post(port, {"input": "y", "previous_response_id": r["id"]})
    check(status == 404, "continue deleted: %d" % status)
    status, body = request(port, "PUT", "/v1/responses/" + r["id"], {})
    check(status == 405, "PUT: %d" % status)


def test_validation(port):
    bad = [
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": "x", "frobnicate": 1}, "frobnicate"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "input[0].content[0].type"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({}, "input"),
        ({"input": "x", "model": "other"}, "model"),
    ]
    for body, param in bad:
        status, reply = post(port, body)
        want = 404 if param == "model" else 400
        check(status == want and is_openai_error(reply) and reply["error"].get("param") == param,
              "%s: %d %s" % (body, status, reply))
    # Function tools and tool items go through the chat path's template and parser.
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_0", "name": "get_weather",
              "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_0", "output": "sunny"}]
    status, r = post(port, {"input": items, "tools": tools, "seed": 3, "max_output_tokens": 6})
    check(status == 200, "tools: %d %s" % (status, r))
    status, chat = request(port, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "call_0", "type": "function", "function": {
                             "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}],
        "tools": [{"type": "function", "function": {k: v for k, v in tools[0].items()
                                                    if k != "type"}}],
        "seed": 3, "max_tokens": 6})
    check(status == 200 and chat["usage"]["prompt_tokens"] == r["usage"]["input_tokens"],
          "tool items render as the chat messages do")


def test_metrics(port):
    status, text = request(port, "GET", "/metrics")
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for name in ("loom_sessions", "loom_sessions_resident", "loom_session_history_tokens",
                 "loom_session_kv_pages", "loom_session_state_slots", "loom_session_cache_bytes",
                 "loom_session_evictions_total", "loom_sessions_expired_total"):
        check(name in values, "/metrics lacks %s" % name)
    check(values.get("loom_sessions", 0) >= 1, "sessions kept: %s" % values.get("loom_sessions"))
    check(values.get("loom_session_history_tokens", 0) > 0, "session history tokens")
    return values


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ARGS = ap.parse_args()
    with LoomServer(ARGS.server, ARGS.model, "--deterministic") as srv:
        port = srv.port
        # One-token replies that re-tokenize to themselves: the turns continue the kept cache.
        cached = conversation(port, ["Hello", "And then?", "Why?"], 1, [1, 6, 5], "short")
        print("short conversation: cached tokens per turn", cached)
        check(len(cached) == 3 and cached[0] == 0 and cached[1] > 0 and cached[2] > 0,
              "continued turns read the session's kept cache: %s" % cached)
        # Longer noise replies: their tokens do not re-tokenize the same; turns still continue.
        cached = conversation(port, ["Hello there", "Go on", "Once more"], 8, [7, 8, 9], "long")
        print("long conversation: cached tokens per turn", cached)
        check(len(cached) == 3 and cached[0] == 0 and cached[1] > 0 and cached[2] > 0,
              "long turns continue the kept cache: %s" % cached)
        test_streaming(port)
        test_ids(port)
        test_validation(port)
        before = test_metrics(port)
        status, r = post(port, {"input": "x", "max_output_tokens": 2})
        after = test_metrics(port)
        request(port, "DELETE", "/v1/responses/" + r["id"])
        deleted = test_metrics(port)
        check(deleted["loom_sessions"] == after["loom_sessions"] - 1,
              "DELETE frees the session: %s -> %s" % (after["loom_sessions"],
                                                      deleted["loom_sessions"]))
        check(after["loom_sessions"] == before["loom_sessions"] + 1, "a new session per chain")
    with LoomServer(ARGS.server, ARGS.model, "--api_key", "sekret") as srv:
        status, body = post(srv.port, {"input": "x"})
        check(status == 401 and is_openai_error(body), "no key: %d" % status)
        status, body = request(srv.port, "GET", "/v1/responses/resp_x")
        check(status == 401, "GET without key: %d" % status)
        status, body = post(srv.port, {"input": "x", "max_output_tokens": 1},
                            headers={"Authorization": "Bearer sekret"})
        check(status == 200, "with key: %d" % status)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
