#!/usr/bin/python3
"""End-to-end test of loom-cli against a real loom-server on a fixture model.

Every generation loom-cli prints is compared with what the server answers to the same request
sent directly over HTTP (greedy decoding with fixed seeds, so both are deterministic): one-shot
completions streamed and not, chat with a system message, a two-turn conversation read from
stdin (and /reset), tokenize/detokenize round trips, models and health; then the failure paths
(server-side 400 and 401 messages, an unreachable server, flags that do not apply, bad usage)
give the documented exit codes and messages.
"""
import argparse
import http.client
import json
import subprocess
import sys

from checks import check, summary
from loom_server_process import LoomServer

ARGS = None



def cli(url, *args, stdin=None, extra_env=None):
    cmd = [ARGS.cli, "--url", url] + list(args)
    r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode("utf-8", errors="surrogateescape"), r.stderr.decode()


def post(port, path, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw)


def completion_text(port, prompt, **params):
    status, body = post(port, "/v1/completions", dict(prompt=prompt, **params))
    assert status == 200, body
    return body["choices"][0]["text"].encode("utf-8", errors="surrogateescape").decode(
        "utf-8", errors="surrogateescape")


def chat_text(port, messages, **params):
    status, body = post(port, "/v1/chat/completions", dict(messages=messages, **params))
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


GREEDY = ["--temperature", "0", "--seed", "7", "--max_tokens", "12"]
GREEDY_BODY = dict(temperature=0, seed=7, max_tokens=12)


def test_complete(s):
    expected = completion_text(s.port, "The cat sat on", **GREEDY_BODY)
    rc, out, err = cli(s.url, "complete", *GREEDY, "The", "cat", "sat", "on")
    check(rc == 0, "complete exits 0 (%d: %s)" % (rc, err))
    check(out == expected + "\n", "streamed completion equals the server's: %r vs %r" % (out, expected))
    rc, out, _ = cli(s.url, "complete", "--nostream", *GREEDY, "The cat sat on")
    check(rc == 0 and out == expected + "\n", "non-streamed completion equals the server's")
    rc, out, err = cli(s.url, "complete", "--usage", "--ignore_eos", "--max_tokens", "9",
                       "--temperature", "0", "hello")
    check(rc == 0 and "[finish length | prompt " in err and "| completion 9 tokens |" in err and
          "first token" in err, "--usage line on stderr: %r" % err)
    rc, out, _ = cli(s.url, "complete", "--raw", *GREEDY, "The cat sat on")
    body = json.loads(out)
    check(rc == 0 and body["object"] == "text_completion" and
          body["choices"][0]["text"] == expected and body["usage"]["completion_tokens"] >= 1,
          "--raw prints the server's JSON")


def test_chat(s):
    sys_msg = "You are terse."
    expected = chat_text(s.port, [{"role": "system", "content": sys_msg},
                                  {"role": "user", "content": "Hi there"}], **GREEDY_BODY)
    rc, out, err = cli(s.url, "chat", "--system", sys_msg, *GREEDY, "Hi there")
    check(rc == 0 and out == expected + "\n", "one-shot chat equals the server's (%r vs %r, %s)" %
          (out, expected, err))

    # A conversation from stdin: turn 2 carries turn 1's reply as history; /reset forgets it.
    first = chat_text(s.port, [{"role": "user", "content": "one"}], **GREEDY_BODY)
    second = chat_text(s.port, [{"role": "user", "content": "one"},
                                {"role": "assistant", "content": first},
                                {"role": "user", "content": "two"}], **GREEDY_BODY)
    fresh = chat_text(s.port, [{"role": "user", "content": "three"}], **GREEDY_BODY)
    rc, out, err = cli(s.url, "chat", *GREEDY, stdin=b"one\ntwo\n\n/reset\nthree\n/exit\nfour\n")
    check(rc == 0, "conversation exits 0 (%s)" % err)
    check(out == first + "\n" + second + "\n" + fresh + "\n",
          "conversation turns equal the server's with history: %r" % out)
    check(err == "", "no prompt printed when stdin is not a terminal: %r" % err)


def test_tokens(s):
    status, body = post(s.port, "/tokenize", {"prompt": "Hello world"})
    rc, out, _ = cli(s.url, "tokenize", "Hello", "world")
    check(rc == 0 and out.split() == [str(t) for t in body["tokens"]],
          "tokenize equals /tokenize: %r vs %r" % (out, body["tokens"]))
    rc, out, _ = cli(s.url, "detokenize", *[str(t) for t in body["tokens"]])
    check(rc == 0 and out == "Hello world\n", "detokenize round trip: %r" % out)
    rc, out, _ = cli(s.url, "models")
    check(rc == 0 and out.split("\t")[0].strip() == "kimi_linear_s1", "models lists the model: %r" % out)
    rc, out, _ = cli(s.url, "health")
    check(rc == 0 and out == "ok\n", "health")


def test_errors(s):
    rc, _, err = cli(s.url, "complete", "--max_tokens", "0", "hi")
    check(rc == 1 and "HTTP 400" in err and "max_tokens" in err,
          "a request the server rejects: exit 1 with its message (%d: %r)" % (rc, err))
    rc, _, err = cli(s.url, "detokenize", "1", "x")
    check(rc == 1 and "not a token id" in err, "bad token id: %r" % err)
    rc, _, err = cli(s.url, "tokenize", "--max_tokens", "3", "hi")
    check(rc == 2 and "--max_tokens does not apply to `tokenize`" in err, "flag that does not apply: %r" % err)
    rc, _, err = cli(s.url, "complete", "--system", "x", "hi")
    check(rc == 2 and "--system does not apply" in err, "--system outside chat: %r" % err)
    rc, _, err = cli(s.url, "frobnicate")
    check(rc == 2 and "unknown command" in err, "unknown command: %r" % err)
    rc, _, err = cli(s.url, "complete")
    check(rc == 2 and "needs text" in err, "complete without text: %r" % err)
    rc, _, err = cli("https://127.0.0.1:1", "health")
    check(rc == 2 and "https is not supported" in err, "https rejected: %r" % err)
    # Port 1 on loopback: nothing listens there.
    rc, _, err = cli("http://127.0.0.1:1", "health")
    check(rc == 1 and "connect to 127.0.0.1:1" in err, "unreachable server: %r" % err)


def test_api_key(server_bin, model):
    with LoomServer(server_bin, model, "--api_key", "sekret") as s:
        rc, _, err = cli(s.url, "complete", "--max_tokens", "2", "hi")
        check(rc == 1 and "HTTP 401" in err, "missing key: 401 (%r)" % err)
        rc, out, err = cli(s.url, "--api_key", "sekret", "complete", "--max_tokens", "2", "hi")
        check(rc == 0 and out.endswith("\n"), "--api_key accepted (%s)" % err)
        env_rc = subprocess.run([ARGS.cli, "--url", s.url, "complete", "--max_tokens", "2", "hi"],
                                capture_output=True, timeout=60,
                                env={"LOOM_API_KEY": "sekret"}).returncode
        check(env_rc == 0, "$LOOM_API_KEY accepted")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--model", required=True)
    ARGS = p.parse_args()
    with LoomServer(ARGS.server, ARGS.model) as s:
        for test in (test_complete, test_chat, test_tokens, test_errors):
            print("==", test.__name__, flush=True)
            test(s)
    print("== test_api_key", flush=True)
    test_api_key(ARGS.server, ARGS.model)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
