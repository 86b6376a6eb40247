"""The bundled default model (weights/default) as `make run` serves it, over HTTP and gRPC.

It was trained by loom-trainer (weights/default/train.sh; bench/results/trainer.md) to retrieve a
passkey from long inputs and to follow the native tool-call format. Against one loom-server with
both frontends:

  * /v1/models does not mark it untrained;
  * completions: the passkey of the trainer's passkey text (instruction, filler, the key, filler,
    the question) comes back at several lengths (about 1,000 to 6,800 tokens, up to 6.6x its
    1,024-token training length) and depths;
  * chat with tools, HTTP and gRPC alike: the question gets an `add` call with the question's
    operands, parsed into tool_calls (finish_reason "tool_calls"); after the tool's result, the
    answer, which stops at the native end of turn (finish_reason "stop", no "<|end|>" in it).

  /usr/bin/python3 default_model_server_test.py --server build/bin/loom-server \
      --model weights/default --pythonpath build/python
"""

import argparse
import http.client
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loom_server_process import LoomServer  # noqa: E402

ARGS = None
DEADLINE = 120.0

# The trainer's passkey text (trainer/synthetic_tasks.cc, make_passkey).
INTRO = "There is a pass key hidden in this text. Find it and remember it."
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go again."
QUESTION = " What is the pass key? The pass key is"

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]


def passkey_prompt(key, before, after):
    return (INTRO + FILLER * before + " The pass key is %s. Remember it. %s is the pass key." %
            (key, key) + FILLER * after + QUESTION)


def http_json(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


class DefaultModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LoomServer(ARGS.server, ARGS.model, "--grpc_port", "0")
        status, body = http_json(cls.server.port, "GET", "/v1/models")
        assert status == 200, body
        cls.model = body["data"][0]["id"]
        cls.models_entry = body["data"][0]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_not_untrained(self):
        self.assertFalse(self.models_entry.get("loom_untrained", False), self.models_entry)

    def test_passkey_from_long_inputs(self):
        for key, before, after in (("40913", 5, 8), ("73914", 30, 20), ("58266", 10, 80)):
            prompt = passkey_prompt(key, before, after)
            status, body = http_json(self.server.port, "POST", "/v1/completions",
                                     {"model": self.model, "prompt": prompt, "max_tokens": 6,
                                      "temperature": 0})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["usage"]["prompt_tokens"], len(prompt.encode()))
            self.assertEqual(body["choices"][0]["text"], " %s" % key,
                             "%d-token prompt, key after %d fillers" % (len(prompt), before))

    def call_turn(self):
        return [{"role": "user", "content": "What is 12 plus 30?"}]

    def answer_turn(self):
        return self.call_turn() + [
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_0", "type": "function",
                             "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "42"}]

    def check_call(self, tool_calls, finish_reason, content):
        self.assertEqual(finish_reason, "tool_calls")
        self.assertEqual(len(tool_calls), 1, tool_calls)
        self.assertEqual(tool_calls[0]["function"]["name"], "add")
        self.assertEqual(json.loads(tool_calls[0]["function"]["arguments"]), {"a": 12, "b": 30})
        self.assertFalse(content, "no text beside the call")

    def test_http_chat_tool_call_and_answer(self):
        body = {"model": self.model, "tools": TOOLS, "max_tokens": 60, "temperature": 0}
        status, r = http_json(self.server.port, "POST", "/v1/chat/completions",
                              dict(body, messages=self.call_turn()))
        self.assertEqual(status, 200, r)
        c = r["choices"][0]
        self.check_call(c["message"].get("tool_calls") or [], c["finish_reason"],
                        c["message"].get("content"))
        status, r = http_json(self.server.port, "POST", "/v1/chat/completions",
                              dict(body, messages=self.answer_turn()))
        self.assertEqual(status, 200, r)
        c = r["choices"][0]
        self.assertEqual(c["finish_reason"], "stop")
        self.assertEqual(c["message"]["content"], "12 plus 30 is 42.")

    def test_grpc_chat_tool_call_and_answer(self):
        client = loom_client.LoomClient("127.0.0.1:%d" % self.server.grpc_port,
                                        timeout=DEADLINE)
        try:
            c = client.chat_reply(self.call_turn(), tools=TOOLS, max_tokens=60, temperature=0)[0]
            self.check_call(c["tool_calls"], c["finish_reason"], c["content"])
            c = client.chat_reply(self.answer_turn(), tools=TOOLS, max_tokens=60,
                                  temperature=0)[0]
            self.assertEqual(c["finish_reason"], "stop")
            self.assertEqual(c["content"], "12 plus 30 is 42.")
        finally:
            client.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True, help="dir with loom_client.py and *_pb2.py")
    ARGS, rest = ap.parse_known_args()
    sys.path.insert(0, ARGS.pythonpath)
    import loom_client  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
