"""End-to-end test of loom-server's gRPC frontend with the Python client (clients/python).

Starts a server binary on a loopback port (--grpc_port 0; it prints
"loom-server: grpc listening on HOST:PORT"), runs the checks, and stops it. Bounded: every call has
a deadline and the server is killed if it does not exit. Run by ctest (tests/integration/grpc.cmake):

  /usr/bin/python3 grpc_server_test.py --server build/bin/loom-grpc-harness \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python [--extra-args "--port 0"]
"""

import argparse
import http.client
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ARGS = None
LISTEN = re.compile(r"loom-server: grpc listening on (\S+):(\d+)")
HTTP_LISTEN = re.compile(r"http listening on http://[^ ]+ \(port (\d+)\)")
DEADLINE = 60.0  # seconds, per call


class Server:
    def __init__(self, args, *more, model=None):
        cmd = [args.server, "--model", model or args.model, "--grpc_port", "0"] \
            + shlex.split(args.extra_args) + list(more)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        end = time.time() + 120
        self.target = None
        self.http_port = None  # loom-server's HTTP frontend (it prints that line first)
        while time.time() < end and self.target is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            m, h = LISTEN.search(line), HTTP_LISTEN.search(line)
            if h:
                self.http_port = int(h.group(1))
            if m:
                self.target = "%s:%s" % (m.group(1), m.group(2))
        if self.target is None:
            self.proc.kill()
            raise RuntimeError("the server did not print its gRPC port: %s" % cmd)

    def stop(self):
        """Closes stdin and sends SIGTERM; returns the exit code (kills after 20 s)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            for f in (self.proc.stdout, self.proc.stderr):
                try:
                    f.close()
                except (OSError, ValueError):
                    pass


class GrpcServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS)
        cls.client = loom_client.LoomClient(cls.server.target, timeout=DEADLINE)
        cls.info = cls.client.model_info()
        cls.initial = cls.client.stats()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.server.stop()
        if code != 0:
            raise AssertionError("the server exited with %r after SIGTERM" % code)

    def wait_released(self, timeout=20.0):
        """Polls GetStats until nothing is live; asserts every page and slot came back."""
        end = time.time() + timeout
        while True:
            st = self.client.stats()
            if st.running + st.waiting == 0 and st.pages_free == self.initial.pages_free \
                    and st.slots_free == self.initial.slots_free:
                return st
            if time.time() > end:
                self.fail("pools not released: %s vs initial %s" % (st, self.initial))
            time.sleep(0.05)

    def byte_ids(self, ids):
        return [t for t in ids if t < self.info.tokenizer_vocab_size]

    def test_health_and_reflection(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("loom.v1.Loom"), "SERVING")
        services = self.client.list_services()
        for s in ("loom.v1.Loom", "grpc.health.v1.Health",
                  "grpc.reflection.v1alpha.ServerReflection"):
            self.assertIn(s, services)
        # What grpcurl does without proto files: fetch the service's file descriptor.
        from google.protobuf import descriptor_pb2
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in self.client.file_containing_symbol("loom.v1.Loom")]
        loom_file = [f for f in files if f.package == "loom.v1"][0]
        methods = {m.name: m for s in loom_file.service if s.name == "Loom" for m in s.method}
        self.assertEqual(set(methods), {"Generate", "Chat", "DeleteSession", "Tokenize",
                                        "Detokenize", "GetModelInfo", "GetStats"})
        self.assertTrue(methods["Chat"].server_streaming)
        self.assertTrue(methods["Generate"].server_streaming)
        with self.assertRaises(LookupError):
            self.client.file_containing_symbol("no.such.Service")

    def test_model_info(self):
        i = self.info
        self.assertEqual(i.model_type, "kimi_linear")
        self.assertEqual(i.model_name, os.path.basename(os.path.normpath(ARGS.model)))
        self.assertEqual(i.vocab_size, 500)
        self.assertEqual(i.tokenizer_vocab_size, 260)
        self.assertGreater(i.max_model_len, 0)
        self.assertEqual(i.max_logprobs, 20)
        self.assertEqual(i.max_n, ARGS.max_n)  # the server's --max_n, which it enforces:
        with self.assertRaises(grpc.RpcError) as e:
            list(self.client.generate([1, 2], max_tokens=1, n=ARGS.max_n + 1))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(len(self.client.generate_text([1, 2], max_tokens=1, n=ARGS.max_n,
                                                       ignore_eos=True)), ARGS.max_n)

    def test_tokenize_round_trip(self):
        text = "Loom serves hybrid models \u2014 \u00fcn\u00efc\u00f6de \u2713 <|im_end|>"
        ids = self.client.tokenize(text)
        self.assertEqual(len(ids), len(text.encode("utf-8")))  # byte-level tokenizer
        self.assertEqual(self.client.detokenize(ids), text)
        special = self.client.tokenize("a<|im_end|>", parse_special_tokens=True)
        self.assertEqual(special, [ord("a"), 258])
        self.assertEqual(self.client.detokenize(special, skip_special_tokens=True), "a")
        with self.assertRaises(grpc.RpcError) as e:
            self.client.detokenize([1, 100000])
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_seeded_generate_is_reproducible_and_consistent(self):
        kw = dict(max_tokens=24, temperature=1.0, top_p=0.95, seed=1234, logprobs=2, ignore_eos=True)
        runs = []
        for _ in range(2):
            msgs = list(self.client.generate("The loom weaves", **kw))
            self.assertGreaterEqual(len(msgs), 1)
            finals = [m for m in msgs if m.finish_reason]
            self.assertEqual(len(finals), 1, "exactly one final message")
            self.assertIs(msgs[-1], finals[0])
            ids = [t for m in msgs for t in m.token_ids]
            text = "".join(m.text for m in msgs)
            lps = [lp for m in msgs for lp in m.logprobs]
            self.assertEqual(len(ids), 24)
            self.assertEqual(finals[0].finish_reason, loom_client.loom_pb2.FINISH_REASON_LENGTH)
            self.assertEqual(finals[0].usage.completion_tokens, 24)
            self.assertEqual(finals[0].usage.prompt_tokens,
                             len(self.client.tokenize("The loom weaves")))
            self.assertEqual([lp.token_id for lp in lps], ids)
            for lp in lps:
                self.assertLessEqual(lp.logprob, 0.0)
                self.assertEqual(len(lp.top), 2)
            # Text deltas are the detokenized ids (ids beyond the byte tokenizer carry no text).
            self.assertEqual(text, self.client.detokenize(self.byte_ids(ids)))
            runs.append((ids, text))
        self.assertEqual(runs[0], runs[1], "same seed, same output")
        # n = 2: choices interleave, each ends once; choice 0 keeps the seed's stream.
        choices = self.client.generate_text("The loom weaves", n=2, **kw)
        self.assertEqual(len(choices), 2)
        self.assertEqual(choices[0]["token_ids"], runs[0][0])
        for c in choices:
            self.assertEqual(c["finish_reason"], "length")
            self.assertEqual(len(c["token_ids"]), 24)
        # Token ids in, greedy: deterministic without a seed.
        prompt = self.client.tokenize("abc")
        g1 = self.client.generate_text(prompt, max_tokens=8, temperature=0.0)
        g2 = self.client.generate_text(prompt, max_tokens=8, temperature=0.0)
        self.assertEqual(g1[0]["token_ids"], g2[0]["token_ids"])
        self.wait_released()

    def test_logit_bias(self):
        # +100 on token 7 makes greedy decoding emit only 7; -100 on it with +60 on 9 gives 9s.
        kw = dict(max_tokens=5, temperature=0.0, ignore_eos=True)
        ids = [t for m in self.client.generate([1, 2, 3], logit_bias={7: 100.0}, **kw)
               for t in m.token_ids]
        self.assertEqual(ids, [7] * 5)
        ids = [t for m in self.client.generate([1, 2, 3], logit_bias={7: -100.0, 9: 60.0}, **kw)
               for t in m.token_ids]
        self.assertEqual(ids, [9] * 5)

    def test_concurrent_streams_match_sequential(self):
        kw = dict(max_tokens=12, seed=99, ignore_eos=True)
        alone = self.client.generate_text("concurrency", **kw)[0]["token_ids"]
        results = [None] * 6

        def run(i):
            results[i] = self.client.generate_text("concurrency", **kw)[0]["token_ids"]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        self.assertEqual(results, [alone] * 6)
        self.wait_released()

    def test_invalid_arguments(self):
        cases = [
            (dict(prompt="hi", max_tokens=0), "max_tokens"),
            (dict(prompt="hi", temperature=-1.0), "temperature"),
            (dict(prompt="hi", top_p=2.0), "top_p"),
            (dict(prompt="hi", logprobs=21), "logprobs"),
            (dict(prompt="hi", n=0), "n"),
            (dict(prompt=[1, 2, 999]), "token_ids"),
            (dict(prompt=[]), "prompt"),
            (dict(prompt="hi", max_tokens=self.info.max_model_len), "max_model_len"),
        ]
        for kw, field in cases:
            with self.subTest(kw=kw):
                prompt = kw.pop("prompt")
                with self.assertRaises(grpc.RpcError) as e:
                    list(self.client.generate(prompt, **kw))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(field, e.exception.details())
        self.assertEqual(self.client.health(), "SERVING")

    def test_malformed_protobuf_is_invalid_argument(self):
        """Bytes that are not the method's message: the client's mistake, INVALID_ARGUMENT."""
        for method in ("Generate", "DeleteSession", "Tokenize", "Detokenize", "GetModelInfo",
                       "GetStats"):
            with self.subTest(method=method):
                call = self.client.channel.unary_stream if method == "Generate" \
                    else self.client.channel.unary_unary
                rpc = call("/loom.v1.Loom/" + method, request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
                with self.assertRaises(grpc.RpcError) as e:
                    result = rpc(b"\xff\xff\xff\xff\x0f", timeout=DEADLINE)
                    if method == "Generate":
                        list(result)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("not a valid loom.v1.", e.exception.details())
        self.assertEqual(self.client.health(), "SERVING")

    def test_unknown_fields_are_invalid_argument(self):
        """A newer client's field (a number this server's loom.v1 lacks), at the top level or
        inside sampling: INVALID_ARGUMENT naming its number, not silently dropped."""
        pb = loom_client.loom_pb2
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]),
                                 sampling=pb.SamplingParams(max_tokens=1))
        wire = req.SerializeToString()
        cases = ((wire + b"\xa8\x06\x01", "loom.v1.GenerateRequest: unknown field number 101"),
                 (wire + b"\x1a\x03\xb8\x02\x07", "sampling: unknown field number 39"))
        rpc = self.client.channel.unary_stream("/loom.v1.Loom/Generate",
                                               request_serializer=lambda b: b,
                                               response_deserializer=pb.GenerateResponse.FromString)
        for data, expected in cases:
            with self.subTest(expected=expected):
                with self.assertRaises(grpc.RpcError) as e:
                    list(rpc(data, timeout=DEADLINE))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(expected, e.exception.details())
        msgs = list(rpc(wire, timeout=DEADLINE))  # the same without them: served
        self.assertEqual(sum(len(m.token_ids) for m in msgs), 1)
        self.assertEqual(msgs[-1].finish_reason, pb.FINISH_REASON_LENGTH)

    def test_cancel_frees_pages_and_slot(self):
        before = self.client.stats()
        call = self.client.generate("cancel me", max_tokens=5000, ignore_eos=True)
        got = 0
        for msg in call:
            got += len(msg.token_ids)
            if got >= 3:
                break
        self.assertEqual(self.client.stats().running, 1)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as e:
            for _ in call:
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
        st = self.wait_released()
        self.assertEqual(st.finished_cancelled, before.finished_cancelled + 1)
        self.assertLess(st.generated_tokens - before.generated_tokens, 5000)

    def test_deadline_cancels(self):
        before = self.client.stats()
        with self.assertRaises(grpc.RpcError) as e:
            for _ in self.client.generate("deadline", max_tokens=5000, ignore_eos=True,
                                          timeout=0.5):
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        st = self.wait_released()
        self.assertEqual(st.finished_cancelled, before.finished_cancelled + 1)


def http_post(port, path, body, stream=False):
    """POST a JSON body to loom-server's HTTP frontend: (status, parsed body or list of chunks)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read().decode()
    conn.close()
    if not stream or resp.status != 200:
        return resp.status, json.loads(raw)
    return resp.status, [json.loads(l[6:]) for l in raw.split("\n")
                         if l.startswith("data: ") and l != "data: [DONE]"]


def model_folder(template):
    """A temporary model folder: the fixture model with a real checkpoint chat template
    (../shared/fixtures/chat_templates/<template>), as tests/integration/chat_template_server_test.py
    makes them."""
    # Absolute: the links live in a temporary folder, so a relative --model would dangle.
    model = os.path.abspath(ARGS.model)
    templates = os.path.join(os.path.dirname(model), "chat_templates")
    d = tempfile.mkdtemp(prefix="loom-grpc-chat-")
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if os.path.exists(os.path.join(model, f)):
            os.symlink(os.path.join(model, f), os.path.join(d, f))
    for f in ("chat_template.jinja", "tokenizer_config.json"):
        os.symlink(os.path.join(templates, template, f), os.path.join(d, f))
    return d


USER = {"role": "user", "content": "What time is it in Paris?"}
TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone.",
    "parameters": {"type": "object", "required": ["tz"],
                   "properties": {"tz": {"type": "string", "maxLength": 8}}}}}]
# An earlier turn of the agent: a call and its result.
HISTORY = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "12:00"},
]


class GrpcChatTest(unittest.TestCase):
    """Chat over gRPC on a model folder with Qwen3-Next's own chat template (tool calls in its
    <tool_call> syntax). Against loom-server, every answer is compared with HTTP's
    /v1/chat/completions for the same request on the same process: the prompt the template renders
    (tools and history included), the greedy reply (content, tool calls reassembled from the
    streamed deltas, finish reason, usage, logprobs), and the refusals (same words; gRPC
    INVALID_ARGUMENT where HTTP answers 400). The untrained model writes noise, never a valid call,
    so the reassembly of real calls is proved in server/grpc_convert_test.cc."""

    @classmethod
    def setUpClass(cls):
        cls.folder = model_folder("qwen3_next")
        cls.server = Server(ARGS, model=cls.folder)
        cls.client = loom_client.LoomClient(cls.server.target, timeout=DEADLINE)
        cls.max_model_len = cls.client.model_info().max_model_len

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        shutil.rmtree(cls.folder, ignore_errors=True)

    def http(self):
        if self.server.http_port is None:
            self.skipTest("no HTTP frontend (loom-grpc-harness)")
        return self.server.http_port

    def test_template_renders_the_tools_and_history(self):
        reply = self.client.chat_reply(HISTORY, tools=TOOLS, max_tokens=1, temperature=0)[0]
        plain = self.client.chat_reply([USER], max_tokens=1, temperature=0)[0]
        self.assertGreater(reply["prompt_tokens"], plain["prompt_tokens"] + 100)
        if self.server.http_port is None:
            return
        status, tok = http_post(self.http(), "/tokenize", {"messages": HISTORY, "tools": TOOLS})
        self.assertEqual(status, 200, tok)
        self.assertEqual(reply["prompt_tokens"], tok["count"])
        status, text = http_post(self.http(), "/detokenize", {"tokens": tok["tokens"]})
        prompt = text["prompt"]
        # Qwen3-Next's template: the tool's schema as written (tojson, key order kept), the call
        # in <tool_call> syntax and the result as a tool response.
        self.assertIn('"name": "get_time"', prompt)
        self.assertIn('"required": ["tz"], "properties"', prompt)
        self.assertIn("<tool_call>", prompt)
        self.assertIn("<tool_response>\n12:00\n</tool_response>", prompt)

    def test_greedy_reply_matches_http(self):
        port = self.http()
        body = {"messages": HISTORY, "tools": TOOLS, "tool_choice": "auto", "temperature": 0,
                "seed": 11, "max_tokens": 12, "logprobs": True, "top_logprobs": 2}
        status, h = http_post(port, "/v1/chat/completions", body)
        self.assertEqual(status, 200, h)
        status, chunks = http_post(port, "/v1/chat/completions", dict(body, stream=True), True)
        self.assertEqual(status, 200)
        g = self.client.chat_reply(HISTORY, tools=TOOLS, tool_choice="auto", temperature=0,
                                   seed=11, max_tokens=12, logprobs=2)[0]
        choice = h["choices"][0]
        self.assertEqual(g["content"], choice["message"]["content"] or "")
        self.assertEqual(g["tool_calls"], choice["message"].get("tool_calls", []))
        self.assertEqual(g["finish_reason"], choice["finish_reason"])
        self.assertEqual(g["prompt_tokens"], h["usage"]["prompt_tokens"])
        self.assertEqual(g["completion_tokens"], h["usage"]["completion_tokens"])
        http_lps = choice["logprobs"]["content"]
        self.assertEqual(len(g["logprobs"]), len(http_lps))
        for a, b in zip(g["logprobs"], http_lps):
            self.assertAlmostEqual(a.logprob, b["logprob"], places=5)
            self.assertEqual(len(a.top), len(b["top_logprobs"]))
        # HTTP's stream, reassembled the same way, agrees too.
        content, calls = "", {}
        for c in chunks:
            for ch in c["choices"]:
                content += ch["delta"].get("content") or ""
                for d in ch["delta"].get("tool_calls", []):
                    calls.setdefault(d["index"], []).append(d)
        self.assertEqual(g["content"], content)
        self.assertEqual(len(g["tool_calls"]), len(calls))

    def test_invalid_requests_use_https_words(self):
        cases = [
            ("unknown role", [{"role": "robot", "content": "hi"}], {}),
            ("tool message without tool_call_id", [USER, {"role": "tool", "content": "12:00"}], {}),
            ("bad tool schema", [USER], {"tools": [{"type": "function", "function": {
                "name": "get_time", "parameters": "a string, not a schema"}}]}),
            ("tool_choice naming an unknown function", [USER],
             {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ("tool_choice required", [USER], {"tools": TOOLS, "tool_choice": "required"}),
            ("too long a prompt", [{"role": "user", "content": "a" * (self.max_model_len + 1)}],
             {}),
        ]
        for what, messages, extra in cases:
            with self.subTest(what):
                grpc_extra = dict(extra)
                if "tools" in extra and isinstance(extra["tools"][0]["function"]["parameters"], str):
                    # Over gRPC the schema is JSON text: send the same (a JSON string).
                    grpc_extra["tools"] = [{"name": "get_time", "parameters": json.dumps(
                        extra["tools"][0]["function"]["parameters"])}]
                with self.assertRaises(grpc.RpcError) as e:
                    self.client.chat_reply(messages, max_tokens=2, **grpc_extra)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                                 e.exception.details())
                if self.server.http_port is None:
                    continue
                status, h = http_post(self.server.http_port, "/v1/chat/completions",
                                      dict(extra, messages=messages, max_tokens=2))
                self.assertEqual(status, 400, h)
                self.assertEqual(e.exception.details(), h["error"]["message"])

    def test_api_key(self):
        server = Server(ARGS, "--api_key", "sekret", model=self.folder)
        try:
            for key, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                              ("wrong", grpc.StatusCode.UNAUTHENTICATED), ("sekret", None)):
                with loom_client.LoomClient(server.target, timeout=DEADLINE, api_key=key) as c:
                    if code is None:
                        self.assertEqual(len(c.chat_reply([USER], max_tokens=1)), 1)
                        continue
                    with self.assertRaises(grpc.RpcError) as e:
                        c.chat_reply([USER], max_tokens=1)
                    self.assertEqual(e.exception.code(), code)
        finally:
            server.stop()


class GrpcDrainTest(unittest.TestCase):
    """SIGTERM drains: health turns NOT_SERVING and new calls get UNAVAILABLE at once, a stream
    still running when --drain_timeout_s ends gets UNAVAILABLE (and is cancelled in the engine),
    and the server exits 0 right after the timeout. (tests/integration/frontend_rules_test.py
    checks the drain of loom-server's two frontends together.)"""

    def test_sigterm_drains(self):
        timeout_s = 1.0
        server = Server(ARGS, "--drain_timeout_s", str(timeout_s))
        try:
            client = loom_client.LoomClient(server.target, timeout=DEADLINE)
            call = client.generate("drain", max_tokens=5000, ignore_eos=True)
            next(iter(call))
            chat = client.chat([USER], max_tokens=5000, ignore_eos=True)
            next(iter(chat))
            t0 = time.time()
            server.proc.terminate()
            end = time.time() + 2
            while client.health() != "NOT_SERVING" and time.time() < end:
                time.sleep(0.01)
            self.assertEqual(client.health(), "NOT_SERVING")
            with self.assertRaises(grpc.RpcError) as e:
                list(client.generate("late", max_tokens=2))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(grpc.RpcError) as e:
                client.chat_reply([USER], max_tokens=2)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            for stream in (call, chat):
                with self.assertRaises(grpc.RpcError) as e:
                    for _ in stream:
                        pass
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertIn("drain timeout", e.exception.details())
            self.assertEqual(server.proc.wait(timeout=30), 0)
            self.assertLess(time.time() - t0, timeout_s + 1.5)
            client.close()
        finally:
            server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True, help="dir with loom_client.py and *_pb2.py")
    ap.add_argument("--extra-args", default="", help="more server flags, e.g. '--port 0'")
    ap.add_argument("--max-n", type=int, default=16,
                    help="the server's --max_n (GetModelInfo must report it)")
    ARGS, rest = ap.parse_known_args()
    sys.path.insert(0, ARGS.pythonpath)
    import grpc  # noqa: E402
    import loom_client  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
