"""End-to-end test of the rules loom-server applies to both frontends (HTTP and gRPC) alike.

One loom-server with HTTP and gRPC (--grpc_port 0), driven with the standard library (HTTP) and
grpcio (clients/python):

  * the API key: every gRPC method (Generate, Chat, Tokenize, Detokenize, GetModelInfo, GetStats and
    server reflection) answers UNAUTHENTICATED without `authorization: Bearer KEY`, HTTP answers
    401 with `WWW-Authenticate: Bearer`; gRPC health and /health stay open;
  * admission: N simultaneous generations against --max_num_seqs 1 --max_queue 2 admit exactly 3,
    over HTTP, over gRPC (Generate, and Chat among them) and mixed; the rest get 429 with
    Retry-After / RESOURCE_EXHAUSTED;
  * one sampling validation: temperature 3 is refused on both, naming the field;
  * admission and session limits again over --expert_parallel 2 (N x --max_num_seqs run);
  * sessions: --max_sessions counts /v1/responses chains and gRPC Chat sessions together and both
    refuse past it in the engine's words (429 / RESOURCE_EXHAUSTED); a session with a turn
    running refuses another on both (503 / UNAVAILABLE); DeleteSession and DELETE free slots;
  * the drain: on SIGTERM gRPC health is NOT_SERVING and /health 503 at once, new work is refused
    on both (UNAVAILABLE / 503); a gRPC and an HTTP stream started before the signal both finish
    when they fit in --drain_timeout_s; with a short timeout both are cut (gRPC UNAVAILABLE, the
    HTTP stream a final `abort` chunk and [DONE]) and the process exits within the timeout plus a
    small slack (measured).

  /usr/bin/python3 frontend_rules_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python
"""

import argparse
import http.client
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import unittest

ARGS = None
KEY = "sekret"
AUTH = {"Authorization": "Bearer " + KEY}
HTTP_LISTEN = re.compile(r"http listening on http://[^ ]+ \(port (\d+)\)")
GRPC_LISTEN = re.compile(r"grpc listening on (\S+):(\d+)")
DEADLINE = 60.0
# The process must be gone this long after the drain timeout ends (engine step, socket closes).
EXIT_SLACK_S = 1.5


class Server:
    """loom-server with both frontends on free loopback ports."""

    def __init__(self, *extra):
        cmd = [ARGS.server, "--model", ARGS.model, "--host", "127.0.0.1", "--port", "0",
               "--grpc_port", "0"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [self.stderr.append(l) for l in self.proc.stderr],
                         daemon=True).start()
        self.port = self.target = None
        end = time.time() + 120
        while time.time() < end and (self.port is None or self.target is None):
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if m := HTTP_LISTEN.search(line):
                self.port = int(m.group(1))
            if m := GRPC_LISTEN.search(line):
                self.target = "%s:%s" % (m.group(1), m.group(2))
        if self.port is None or self.target is None:
            self.stop()
            raise RuntimeError("loom-server did not report its ports: %s\n%s" %
                               (cmd, "".join(self.stderr[-20:])))

    def client(self, api_key=KEY):
        return loom_client.LoomClient(self.target, timeout=DEADLINE, api_key=api_key)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def http_request(port, method, path, body=None, headers=None):
    """(status, parsed JSON body or None, headers dict with lower-case names)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        return resp.status, parsed, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


class HttpStream:
    """A streaming completion on its own connection: status and headers at once, then events."""

    def __init__(self, port, body, headers=AUTH):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
        h = {"Content-Type": "application/json"}
        h.update(headers)
        self.conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                          headers=h)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}

    def events(self):
        """The data: payloads until [DONE] or the end of the body (parsed, except "[DONE]")."""
        out = []
        for raw in self.resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
            if data == "[DONE]":
                break
        return out

    def close(self):
        self.conn.close()


class AuthAndValidationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--api_key", KEY)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_grpc_needs_the_key_everywhere_but_health(self):
        for key in (None, "wrong", KEY[:-1]):
            with self.subTest(key=key), self.server.client(api_key=key) as c:
                calls = {
                    "Generate": lambda: list(c.generate("hi", max_tokens=2)),
                    "Chat": lambda: list(c.chat([{"role": "user", "content": "hi"}],
                                                max_tokens=2)),
                    "Tokenize": lambda: c.tokenize("hi"),
                    "Detokenize": lambda: c.detokenize([104]),
                    "GetModelInfo": c.model_info,
                    "GetStats": c.stats,
                    "DeleteSession": lambda: c.delete_session("s"),
                    "reflection": c.list_services,
                }
                for name, call in calls.items():
                    with self.assertRaises(grpc.RpcError, msg=name) as e:
                        call()
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, name)
                self.assertEqual(c.health(), "SERVING")
        with self.server.client() as c:
            self.assertEqual(len(list(c.generate("hi", max_tokens=2))) >= 1, True)
            self.assertEqual(c.detokenize(c.tokenize("hi")), "hi")
            self.assertIn("loom.v1.Loom", c.list_services())
            self.assertGreater(c.model_info().vocab_size, 0)
            c.stats()

    def test_http_needs_the_key_everywhere_but_health_and_metrics(self):
        for path, body in (("/v1/completions", {"prompt": "a", "max_tokens": 1}),
                           ("/v1/responses", {"input": "a", "max_output_tokens": 1}),
                           ("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [97]})):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                status, parsed, h = http_request(self.server.port, "POST", path, body, headers)
                self.assertEqual(status, 401, path)
                self.assertEqual(parsed["error"]["code"], "invalid_api_key")
                self.assertEqual(h.get("www-authenticate"), "Bearer", path)
            status, _, _ = http_request(self.server.port, "POST", path, body, AUTH)
            self.assertEqual(status, 200, path)
        status, _, _ = http_request(self.server.port, "GET", "/v1/models")
        self.assertEqual(status, 401)
        self.assertEqual(http_request(self.server.port, "GET", "/health")[0], 200)
        self.assertEqual(http_request(self.server.port, "GET", "/metrics")[0], 200)

    def test_one_sampling_validation(self):
        """The same out-of-range value is refused by both frontends, naming the field."""
        for field, value in (("temperature", 3.0), ("temperature", -1.0), ("top_p", 1.5),
                             ("presence_penalty", 2.5), ("min_p", 1.5)):
            with self.subTest(field=field, value=value):
                status, parsed, _ = http_request(self.server.port, "POST", "/v1/completions",
                                                 {"prompt": "a", "max_tokens": 1, field: value},
                                                 AUTH)
                self.assertEqual(status, 400)
                self.assertEqual(parsed["error"]["param"], field)
                with self.server.client() as c, self.assertRaises(grpc.RpcError) as e:
                    list(c.generate("a", max_tokens=1, **{field: value}))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(field, e.exception.details())
        # The largest temperature both accept.
        self.assertEqual(http_request(self.server.port, "POST", "/v1/completions",
                                      {"prompt": "a", "max_tokens": 1, "temperature": 2.0},
                                      AUTH)[0], 200)
        with self.server.client() as c:
            self.assertGreaterEqual(len(list(c.generate("a", max_tokens=1, temperature=2.0))), 1)


class AdmissionTest(unittest.TestCase):
    """--max_num_seqs 1 --max_queue 2: exactly 3 generations are in flight at any time, counted
    over both frontends; more simultaneous ones are refused at once."""

    N = 10
    ADMITTED = 3
    LONG = {"prompt": "queue", "max_tokens": 5000, "ignore_eos": True}

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max_num_seqs", "1", "--max_queue", "2")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def run_round(self, kinds):
        """Starts len(kinds) generations at once ("http" or "grpc"); returns (admitted, refused),
        then cancels everything admitted and waits until nothing is in flight."""
        results = [None] * len(kinds)  # "admitted" or "refused"
        http_streams, grpc_calls = [], []
        lock = threading.Lock()
        start = threading.Barrier(len(kinds))
        client = self.server.client()

        def run(i, kind):
            start.wait()
            if kind == "http":
                s = HttpStream(self.server.port, self.LONG)
                with lock:
                    http_streams.append(s)
                if s.status == 200:
                    results[i] = "admitted"
                else:
                    self.assertEqual(s.status, 429)
                    self.assertEqual(s.headers.get("retry-after"), "1")
                    results[i] = "refused"
                return
            if kind == "grpc_chat":
                call = client.chat([{"role": "user", "content": "queue"}], max_tokens=5000,
                                   ignore_eos=True)
            else:
                call = client.generate("queue", max_tokens=5000, ignore_eos=True)
            with lock:
                grpc_calls.append(call)
            try:
                for _ in call:
                    break
                results[i] = "admitted"  # got a token
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    results[i] = "refused"
                elif e.code() == grpc.StatusCode.CANCELLED:
                    results[i] = "admitted"  # queued until we cancelled it
                else:
                    results[i] = "error %s" % e.code()

        threads = [threading.Thread(target=run, args=(i, k)) for i, k in enumerate(kinds)]
        for t in threads:
            t.start()
        # Refusals come back at once; admitted gRPC calls that wait in the queue answer nothing
        # until cancelled.
        end = time.time() + 30
        while time.time() < end and sum(r == "refused" for r in results) < len(kinds) - self.ADMITTED:
            time.sleep(0.02)
        time.sleep(0.5)  # no late extra refusal
        refused = sum(r == "refused" for r in results)
        for c in grpc_calls:
            c.cancel()
        for s in http_streams:
            s.close()
        for t in threads:
            t.join(DEADLINE)
        client.close()
        admitted = sum(r == "admitted" for r in results)
        self.assertEqual(admitted + refused, len(kinds), results)
        # Everything is released before the next round.
        with self.server.client() as c:
            end = time.time() + 20
            while time.time() < end:
                st = c.stats()
                if st.running + st.waiting == 0:
                    break
                time.sleep(0.05)
        time.sleep(0.3)  # HTTP sessions notice their closed connections
        return admitted, refused

    def check_rounds(self, kinds):
        for round_ in range(3):
            admitted, refused = self.run_round(kinds)
            self.assertEqual((admitted, refused), (self.ADMITTED, len(kinds) - self.ADMITTED),
                             "round %d of %s" % (round_, kinds[:2]))

    def test_http(self):
        self.check_rounds(["http"] * self.N)

    def test_grpc(self):
        self.check_rounds(["grpc"] * self.N)

    def test_mixed(self):
        self.check_rounds(["http", "grpc"] * (self.N // 2))

    def test_chat_counts_like_generate(self):
        # gRPC Chat goes through the same gate: chats, generations and HTTP requests together.
        self.check_rounds(["grpc_chat", "grpc", "http"] * 3 + ["grpc_chat"])


class SessionLimitsTest(unittest.TestCase):
    """Sessions are one engine resource refused alike over both frontends (server/chat_session.h):
    --max_sessions counts HTTP /v1/responses chains and gRPC Chat sessions together and both get
    the engine's words (429 / RESOURCE_EXHAUSTED); a session whose turn still runs refuses a second
    turn on both (503 / UNAVAILABLE); deleting on either side frees the slot."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max_sessions", "2")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def respond(self, body):
        return http_request(self.server.port, "POST", "/v1/responses", body, AUTH)

    def test_max_sessions_and_busy_sessions(self):
        user = [{"role": "user", "content": "hi"}]
        status, a, _ = self.respond({"input": "hi", "max_output_tokens": 1})
        self.assertEqual(status, 200, a)
        with self.server.client() as c:
            c.chat_reply(user, session_id="g1", max_tokens=1)
            # Two live sessions (one per frontend): a third is refused on both, in the same words.
            status, refused, headers = self.respond({"input": "hi", "max_output_tokens": 1})
            self.assertEqual(status, 429, refused)
            self.assertIn("keeps at most 2 sessions", refused["error"]["message"])
            with self.assertRaises(grpc.RpcError) as e:
                c.chat_reply(user, session_id="g2", max_tokens=1)
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("keeps at most 2 sessions", e.exception.details())
            # Continuing either existing session is not a new one.
            status, body, _ = self.respond({"input": "more", "previous_response_id": a["id"],
                                            "max_output_tokens": 1})
            self.assertEqual(status, 200, body)
            c.chat_reply(user, session_id="g1", session_must_exist=True, max_tokens=1)
            # A turn still running: a second turn of the same session is refused on both.
            call = c.chat(user, session_id="g1", max_tokens=5000, ignore_eos=True)
            next(iter(call))
            with self.assertRaises(grpc.RpcError) as e:
                c.chat_reply(user, session_id="g1", max_tokens=1)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("turn in progress", e.exception.details())
            call.cancel()
            stream = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=DEADLINE)
            stream.request("POST", "/v1/responses", body=json.dumps({
                "input": "long", "previous_response_id": body["id"], "max_output_tokens": 5000,
                "stream": True}), headers=dict(AUTH, **{"Content-Type": "application/json"}))
            resp = stream.getresponse()
            self.assertEqual(resp.status, 200)
            resp.readline()  # the turn has started
            status, busy, _ = self.respond({"input": "x", "previous_response_id": body["id"],
                                            "max_output_tokens": 1})
            self.assertEqual(status, 503, busy)
            self.assertIn("turn in progress", busy["error"]["message"])
            stream.close()
            # Deleting frees a slot, on either side.
            c.delete_session("g1")
            c.chat_reply(user, session_id="g2", max_tokens=1)
            status, refused, _ = self.respond({"input": "hi", "max_output_tokens": 1})
            self.assertEqual(status, 429, refused)


class ExpertParallelAdmissionTest(AdmissionTest):
    """The same gate over --expert_parallel 2 (thread ranks): each rank runs --max_num_seqs, so
    2 x 1 + --max_queue 2 = 4 generations are in flight, over both frontends."""

    ADMITTED = 4

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max_num_seqs", "1", "--max_queue", "2", "--expert_parallel", "2")


class ExpertParallelSessionLimitsTest(SessionLimitsTest):
    """--max_sessions counts every rank's sessions, refused alike on both frontends."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max_sessions", "2", "--expert_parallel", "2")


class DrainTest(unittest.TestCase):
    def start_streams(self, server, max_tokens):
        """A gRPC and an HTTP stream, both producing tokens; returns their collectors."""
        out = {"grpc_tokens": 0, "grpc_final": None, "grpc_status": None}
        client = server.client()
        call = client.generate("drain grpc", max_tokens=max_tokens, ignore_eos=True)
        first = threading.Event()

        def read_grpc():
            try:
                for m in call:
                    out["grpc_tokens"] += len(m.token_ids)
                    first.set()
                    if m.finish_reason:
                        out["grpc_final"] = loom_client.finish_reason_name(m.finish_reason)
                out["grpc_status"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                out["grpc_status"] = e.code()
                out["grpc_details"] = e.details()
            first.set()

        stream = HttpStream(server.port, {"prompt": "drain http", "max_tokens": max_tokens,
                                          "ignore_eos": True, "stream_options": {"include_usage": True}})
        self.assertEqual(stream.status, 200)

        def read_http():
            out["http_events"] = stream.events()

        threads = [threading.Thread(target=read_grpc), threading.Thread(target=read_http)]
        for t in threads:
            t.start()
        self.assertTrue(first.wait(30))
        return out, threads, client, stream

    def check_refused_during_drain(self, server):
        """Right after SIGTERM: both health checks say so and new work is refused on both."""
        with server.client() as c:
            end = time.time() + 2
            while c.health() != "NOT_SERVING" and time.time() < end:
                time.sleep(0.01)
            self.assertEqual(c.health(), "NOT_SERVING")
            self.assertEqual(c.health("loom.v1.Loom"), "NOT_SERVING")
            with self.assertRaises(grpc.RpcError) as e:
                list(c.generate("late", max_tokens=2))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(grpc.RpcError) as e:
                c.tokenize("late")
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(grpc.RpcError) as e:
                list(c.chat([{"role": "user", "content": "late"}], session_id="late",
                            max_tokens=2))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(grpc.RpcError) as e:
                c.delete_session("late")
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(http_request(server.port, "GET", "/health")[0], 503)
        self.assertEqual(http_request(server.port, "POST", "/v1/responses",
                                      {"input": "late", "max_output_tokens": 2}, AUTH)[0], 503)
        self.assertEqual(http_request(server.port, "DELETE", "/v1/responses/resp_x",
                                      headers=AUTH)[0], 503)
        self.assertEqual(http_request(server.port, "POST", "/v1/completions",
                                      {"prompt": "late", "max_tokens": 2}, AUTH)[0], 503)

    def http_usage(self, events):
        usage = [e["usage"] for e in events if e != "[DONE]" and e.get("usage")]
        return usage[-1]["completion_tokens"] if usage else None

    def test_streams_that_fit_finish(self):
        server = Server("--api_key", KEY, "--drain_timeout_s", "60")
        try:
            out, threads, client, stream = self.start_streams(server, max_tokens=1500)
            t0 = time.time()
            server.proc.send_signal(signal.SIGTERM)
            self.check_refused_during_drain(server)
            for t in threads:
                t.join(120)
            self.assertEqual(out["grpc_status"], grpc.StatusCode.OK, out.get("grpc_details"))
            self.assertEqual(out["grpc_tokens"], 1500)
            self.assertEqual(out["grpc_final"], "length")
            events = out["http_events"]
            self.assertEqual(events[-1], "[DONE]")
            finals = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
            self.assertEqual(finals[-1], "length")
            self.assertEqual(self.http_usage(events), 1500)
            rc = server.proc.wait(timeout=60)
            took = time.time() - t0
            print("drain with streams that fit: exit %.2f s after SIGTERM" % took, file=sys.stderr)
            self.assertEqual(rc, 0)
            client.close()
            stream.close()
        finally:
            server.stop()

    def test_timeout_cuts_both_and_exits_in_time(self):
        timeout_s = 2.0
        server = Server("--api_key", KEY, "--drain_timeout_s", str(timeout_s))
        try:
            out, threads, client, stream = self.start_streams(server, max_tokens=5000)
            t0 = time.time()
            server.proc.send_signal(signal.SIGTERM)
            self.check_refused_during_drain(server)
            rc = server.proc.wait(timeout=30)
            took = time.time() - t0
            print("drain cut at --drain_timeout_s %.1f: exit %.2f s after SIGTERM" % (timeout_s, took),
                  file=sys.stderr)
            self.assertEqual(rc, 0)
            self.assertGreaterEqual(took, timeout_s - 0.1)  # the streams had their time
            self.assertLess(took, timeout_s + EXIT_SLACK_S)
            for t in threads:
                t.join(30)
            # gRPC: a final status saying why, after the tokens it got.
            self.assertEqual(out["grpc_status"], grpc.StatusCode.UNAVAILABLE)
            self.assertIn("drain timeout", out["grpc_details"])
            self.assertGreater(out["grpc_tokens"], 0)
            self.assertLess(out["grpc_tokens"], 5000)
            # HTTP: the stream ends properly, its choice finished as aborted.
            events = out["http_events"]
            self.assertEqual(events[-1], "[DONE]")
            finals = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
            self.assertEqual(finals[-1], "abort")
            self.assertLess(self.http_usage(events), 5000)
            client.close()
            stream.close()
        finally:
            server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True, help="dir with loom_client.py and *_pb2.py")
    ARGS, rest = ap.parse_known_args()
    sys.path.insert(0, ARGS.pythonpath)
    import grpc  # noqa: E402
    import loom_client  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
