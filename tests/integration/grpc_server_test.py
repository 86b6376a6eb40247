"""End-to-end test of loom-server's gRPC frontend with the Python client (clients/python).

Starts a server binary on a loopback port (--grpc_port 0; it prints
"loom-server: grpc listening on HOST:PORT"), runs the checks, and stops it. Bounded: every call has
a deadline and the server is killed if it does not exit. Run by ctest (tests/integration/grpc.cmake):

  /usr/bin/python3 grpc_server_test.py --server build/bin/loom-grpc-harness \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python [--extra-args "--port 0"]
"""

import argparse
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
import unittest

ARGS = None
LISTEN = re.compile(r"loom-server: grpc listening on (\S+):(\d+)")
DEADLINE = 60.0  # seconds, per call


class Server:
    def __init__(self, args, *more):
        cmd = [args.server, "--model", args.model, "--grpc_port", "0"] + shlex.split(args.extra_args) \
            + list(more)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        end = time.time() + 120
        self.target = None
        while time.time() < end and self.target is None:
            try:
                m = LISTEN.search(lines.get(timeout=1))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
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
        self.assertEqual(set(methods), {"Generate", "Tokenize", "Detokenize", "GetModelInfo",
                                        "GetStats"})
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
        for method in ("Generate", "Tokenize", "Detokenize", "GetModelInfo", "GetStats"):
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
                for _ in call:
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
