#!/usr/bin/python3
"""End-to-end test of gRPC Chat sessions (ChatRequest.session_id, DeleteSession) on loom-server.

One loom-server with --deterministic and both frontends; the Python client (clients/python):

  * a 3-turn session, each turn sending only its new user message, continues the whole kept
    history (usage.cached_tokens = the previous turn's prompt and reply tokens: nothing recomputed,
    the reply's ids as sampled) and, while every earlier reply re-tokenizes to its ids (one-token
    replies), gives exactly the tokens, text and token counts of sending the whole history in one
    Chat (and in one HTTP /v1/chat/completions); longer replies of this untrained model do not
    re-tokenize to themselves (bytes that are not whole characters, ids the tokenizer cannot
    spell), and the turns after them still continue, from the ids the model saw, where the whole
    history re-tokenized differs; every message carries the session id;
  * store = false sees the stored conversation but leaves it as it was;
  * DeleteSession frees the session (/metrics loom_sessions drops by one); deleting it again,
    deleting an unknown id and continuing a deleted or unknown one with session_must_exist give
    NOT_FOUND naming session_id; a deleted id can start over;
  * malformed session fields are INVALID_ARGUMENT naming the field, n > 1 on a session is refused
    with the engine's words; tool turns: a call, its result and the model's reply are kept, and the
    next user message continues them as the whole conversation would.

  /usr/bin/python3 grpc_sessions_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python
"""
import argparse
import http.client
import json
import sys

from checks import check, summary
from loom_server_process import LoomServer

ARGS = None
SYSTEM = {"role": "system", "content": "Be brief."}


def http_chat(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read().decode())
    conn.close()
    return r.status, data


def metric(port, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def retokenizes(client, ids):
    """Whether a reply's ids are what its text tokenizes to (as message text: special-token
    spellings are plain text). A last special id (the stop token) is the template's, not the
    text's."""
    import grpc
    try:
        if ids and client.detokenize(ids[-1:], skip_special_tokens=True) == "" and \
                client.detokenize(ids[-1:]) != "":
            ids = ids[:-1]
        return client.tokenize(client.detokenize(ids)) == ids
    except grpc.RpcError:
        return False  # an id the tokenizer cannot spell (the fixture's vocabulary is larger)


def conversation(client, port, session, users, max_tokens, seeds, what):
    """Runs a session turn per user text, each continuing the previous one and, while every earlier
    reply re-tokenizes, equal to the whole history sent at once. Returns the turns' cached_tokens,
    the history and whether every reply re-tokenizes to its ids."""
    history = [SYSTEM]
    cached = []
    canonical = True  # every earlier reply re-tokenizes to its ids
    previous_total = 0
    for k, (user, seed) in enumerate(zip(users, seeds)):
        new = ([SYSTEM] if k == 0 else []) + [{"role": "user", "content": user}]
        sampling = dict(seed=seed, temperature=0.8, max_tokens=max_tokens)
        msgs = list(client.chat(new, session_id=session, **sampling))
        turn = client.chat_reply(history + [{"role": "user", "content": user}], **sampling)[0]
        check(all(m.session_id == session for m in msgs),
              "%s turn %d: every message names the session" % (what, k))
        tokens = [t for m in msgs for t in m.token_ids]
        text = "".join(m.content for m in msgs)
        last = msgs[-1]
        cached.append(last.usage.cached_tokens)
        check(last.usage.cached_tokens == previous_total,
              "%s turn %d: continued %d tokens, not the whole kept history's %d" %
              (what, k, last.usage.cached_tokens, previous_total))
        previous_total = last.usage.prompt_tokens + last.usage.completion_tokens
        reply_canonical = retokenizes(client, tokens)
        if not canonical:
            # The session's prompt holds an earlier reply's ids as sampled; the whole history
            # re-tokenizes that reply's text to other ids.
            history.append({"role": "user", "content": user})
            history.append({"role": "assistant", "content": text})
            continue
        canonical = reply_canonical  # for the next turn
        check(tokens == turn["token_ids"],
              "%s turn %d: session tokens %s != whole history %s" % (what, k, tokens,
                                                                     turn["token_ids"]))
        check(text == turn["content"], "%s turn %d: text %r != %r" % (what, k, text,
                                                                      turn["content"]))
        check(last.usage.prompt_tokens == turn["prompt_tokens"],
              "%s turn %d: prompt tokens %d != %d" % (what, k, last.usage.prompt_tokens,
                                                      turn["prompt_tokens"]))
        check(last.usage.completion_tokens == turn["completion_tokens"],
              "%s turn %d: completion tokens" % (what, k))
        check(turn["cached_tokens"] == 0, "%s turn %d: no session, nothing cached" % (what, k))
        history.append({"role": "user", "content": user})
        # And HTTP's chat completions with the same messages.
        status, chat = http_chat(port, {"messages": history, "seed": seed, "temperature": 0.8,
                                        "max_tokens": max_tokens})
        if check(status == 200, "%s turn %d: http %d" % (what, k, status)):
            check(chat["choices"][0]["message"]["content"] == text,
                  "%s turn %d: http text %r != %r" % (what, k,
                                                      chat["choices"][0]["message"]["content"],
                                                      text))
            check(chat["usage"]["prompt_tokens"] == last.usage.prompt_tokens,
                  "%s turn %d: http prompt tokens" % (what, k))
        history.append({"role": "assistant", "content": text})
    return cached, history, canonical


def test_store_false(client, session, history):
    """A store = false turn sees the conversation and keeps nothing: the next stored turn is as if
    it never happened."""
    import grpc
    aside = client.chat_reply([{"role": "user", "content": "Aside"}], session_id=session,
                              store=False, seed=3, max_tokens=4)[0]
    whole = client.chat_reply(history + [{"role": "user", "content": "Aside"}], seed=3,
                              max_tokens=4)[0]
    check(aside["token_ids"] == whole["token_ids"], "store false: the whole history's tokens")
    check(aside["prompt_tokens"] == whole["prompt_tokens"], "store false: prompt tokens")
    nxt = client.chat_reply([{"role": "user", "content": "Next"}], session_id=session,
                            session_must_exist=True, seed=4, max_tokens=1)[0]
    want = client.chat_reply(history + [{"role": "user", "content": "Next"}], seed=4,
                             max_tokens=1)[0]
    check(nxt["token_ids"] == want["token_ids"] and nxt["prompt_tokens"] == want["prompt_tokens"],
          "after store false: %s/%d != %s/%d" % (nxt["token_ids"], nxt["prompt_tokens"],
                                                  want["token_ids"], want["prompt_tokens"]))
    try:
        client.chat_reply([{"role": "user", "content": "x"}], session_id="never-made",
                          session_must_exist=True, store=False, max_tokens=1)
        check(False, "store false on an unknown session with session_must_exist")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND, "store false unknown: %s" % e.code())


def expect_error(call, code, words, what):
    import grpc
    try:
        call()
    except grpc.RpcError as e:
        check(e.code() == code, "%s: %s %s (want %s)" % (what, e.code(), e.details(), code))
        check(words in e.details(), "%s: %r lacks %r" % (what, e.details(), words))
        return
    check(False, "%s: no error" % what)


def test_delete_and_not_found(client, port):
    import grpc
    user = [{"role": "user", "content": "Hi"}]
    nf = grpc.StatusCode.NOT_FOUND
    expect_error(lambda: client.delete_session("nobody"), nf, "session_id", "delete unknown")
    expect_error(lambda: client.chat_reply(user, session_id="nobody", session_must_exist=True,
                                           max_tokens=1),
                 nf, "no session 'nobody'", "continue unknown")
    before = metric(port, "loom_sessions")
    first = client.chat_reply(user, session_id="doomed", seed=1, max_tokens=2)[0]
    check(first["session_id"] == "doomed", "reply names the session")
    check(metric(port, "loom_sessions") == before + 1, "a session was made")
    client.delete_session("doomed")
    check(metric(port, "loom_sessions") == before, "DeleteSession frees the engine session")
    expect_error(lambda: client.delete_session("doomed"), nf, "doomed", "delete twice")
    expect_error(lambda: client.chat_reply(user, session_id="doomed", session_must_exist=True,
                                           max_tokens=1),
                 nf, "doomed", "continue deleted")
    # The id starts over: the same reply as the first turn, nothing remembered.
    again = client.chat_reply(user, session_id="doomed", seed=1, max_tokens=2)[0]
    check(again["token_ids"] == first["token_ids"] and
          again["prompt_tokens"] == first["prompt_tokens"] and again["cached_tokens"] == 0,
          "a deleted id starts over")
    client.delete_session("doomed")


def test_validation(client):
    import grpc
    bad = grpc.StatusCode.INVALID_ARGUMENT
    user = [{"role": "user", "content": "Hi"}]
    expect_error(lambda: client.chat_reply(user, session_id="has space", max_tokens=1), bad,
                 "session_id", "a space in the id")
    expect_error(lambda: client.chat_reply(user, session_id="x" * 129, max_tokens=1), bad,
                 "session_id", "a 129-byte id")
    expect_error(lambda: client.chat_reply(user, store=False, max_tokens=1), bad, "store",
                 "store without a session")
    expect_error(lambda: client.chat_reply(user, session_must_exist=True, max_tokens=1), bad,
                 "session_must_exist", "session_must_exist without a session")
    expect_error(lambda: client.chat_reply(user, session_id="pair", n=2, max_tokens=1), bad,
                 "n must be 1", "n = 2 on a session")
    expect_error(lambda: client.delete_session(""), bad, "session_id", "delete an empty id")
    # A refused turn leaves no session behind.
    expect_error(lambda: client.delete_session("pair"), grpc.StatusCode.NOT_FOUND, "pair",
                 "a refused first turn makes no session")


def test_tool_turns(client):
    """Tool calls and results (and the reply's own calls, if any) are kept with the session."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    user = {"role": "user", "content": "Weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    result = {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}
    # Turn 1 sends the user message, a call and its result; turn 2 only a new user message.
    # (A one-token reply of a seed whose id re-tokenizes to itself, so that turn 2 equals the
    # whole conversation re-tokenized.)
    first = client.chat_reply([user, call, result], session_id="tools", tools=tools, seed=7,
                              max_tokens=1)[0]
    whole_first = client.chat_reply([user, call, result], tools=tools, seed=7, max_tokens=1)[0]
    check(first["token_ids"] == whole_first["token_ids"], "tool session turn 1")
    check(retokenizes(client, first["token_ids"]),
          "tool session turn 1's reply %s re-tokenizes to itself" % first["token_ids"])
    reply = {"role": "assistant", "content": first["content"]}
    if first["reasoning_content"]:
        reply["reasoning_content"] = first["reasoning_content"]
    if first["tool_calls"]:
        reply["tool_calls"] = first["tool_calls"]
    more = {"role": "user", "content": "And London?"}
    got = client.chat_reply([more], session_id="tools", tools=tools, seed=5, max_tokens=4)[0]
    want = client.chat_reply([user, call, result, reply, more], tools=tools, seed=5,
                             max_tokens=4)[0]
    check(got["token_ids"] == want["token_ids"] and got["prompt_tokens"] == want["prompt_tokens"],
          "tool session turn 2 %s/%d != whole %s/%d" % (got["token_ids"], got["prompt_tokens"],
                                                         want["token_ids"], want["prompt_tokens"]))
    check(got["cached_tokens"] == first["prompt_tokens"] + first["completion_tokens"],
          "tool session turn 2 continued %d tokens" % got["cached_tokens"])
    client.delete_session("tools")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True)
    ARGS = ap.parse_args()
    sys.path.insert(0, ARGS.pythonpath)
    from loom_client import LoomClient  # noqa: E402 (generated stubs live in the build)

    with LoomServer(ARGS.server, ARGS.model, "--deterministic", "--grpc_port", "0") as srv, \
            LoomClient("127.0.0.1:%d" % srv.grpc_port, timeout=120) as client:
        # One-token replies of seeds whose ids re-tokenize to themselves: turns continue the
        # kept cache and equal the whole history, and so does store = false after them.
        cached, history, canonical = conversation(client, srv.port, "short",
                                                  ["Hello", "And then?", "Why?"], 1, [1, 6, 7],
                                                  "short")
        print("short session: cached tokens per turn", cached)
        check(len(cached) == 3 and cached[0] == 0 and cached[1] > 0 and cached[2] > 0,
              "continued turns read the kept cache: %s" % cached)
        check(canonical, "the short session's replies re-tokenize to themselves")
        test_store_false(client, "short", history)
        # Longer replies of this untrained model do not re-tokenize the same: turns still
        # continue the kept cache, from the ids the model saw.
        cached, _, _ = conversation(client, srv.port, "long",
                                    ["Hello there", "Go on", "Once more"], 8, [7, 8, 9], "long")
        print("long session: cached tokens per turn", cached)
        check(len(cached) == 3 and cached[0] == 0 and cached[1] > 0 and cached[2] > 0,
              "long turns continue the kept cache: %s" % cached)
        test_delete_and_not_found(client, srv.port)
        test_validation(client)
        test_tool_turns(client)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
