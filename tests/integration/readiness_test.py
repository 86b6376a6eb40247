#!/usr/bin/env python3
"""Readiness apart from liveness, on a real loom-server with both frontends (ctest readiness_e2e).

  * started: GET /ready is 200 with every start-up check passed and its detail taken from what
    the server printed (model type, cache budget, CUDA graphs, the ports it listens on); /ready,
    /health and gRPC health need no API key, other routes do; gRPC health SERVING for the server
    as a whole and for loom.v1.Loom;
  * SIGTERM with a generation in flight: /ready 503 {"status": "draining"}, gRPC Check
    NOT_SERVING, an open gRPC Watch stream hears NOT_SERVING; the generation still finishes and
    the process exits 0.

Not covered here: "not ready while loading", since loom-server only listens once the model is
loaded (a probe gets a refused connection then); server/readiness_test.cc and
server/health_grpc_test.cc cover the 503 / NOT_SERVING answers before the checks pass.

  python3 tests/integration/readiness_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python
"""
import argparse
import http.client
import json
import os
import queue
import signal
import sys
import threading
import time
import unittest

KEY = "sekret"
AUTH = {"Authorization": "Bearer " + KEY}
DEADLINE = 60.0


def http_get(port, path, headers=None):
    """(status, parsed JSON body or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, None
    finally:
        conn.close()


class ReadinessTest(unittest.TestCase):
    def start(self, *extra):
        server = LoomServer(ARGS.server, ARGS.model, "--grpc_port", "0", "--api_key", KEY, *extra)
        self.addCleanup(server.stop)
        return server

    def watch(self, server, service=""):
        """A grpc.health.v1 Watch stream: a queue of the statuses it hears, and its call."""
        channel = grpc.insecure_channel("127.0.0.1:%d" % server.grpc_port)
        self.addCleanup(channel.close)
        method = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        call = method(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE)
        heard = queue.Queue()

        def read():
            try:
                for resp in call:
                    heard.put(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        self.addCleanup(call.cancel)
        return heard

    def test_ready_once_started(self):
        server = self.start()
        status, body = http_get(server.port, "/ready")  # no key: a probe carries none
        self.assertEqual(status, 200, body)
        self.assertEqual(body["status"], "ready")
        self.assertNotIn("reason", body)
        checks = body["checks"]
        self.assertEqual(sorted(checks), ["cuda_graphs", "frontends", "model", "workspace"])
        for name, check in checks.items():
            self.assertTrue(check["passed"], name)
        # The details say what the server itself printed and the fixture says.
        with open(os.path.join(ARGS.model, "config.json")) as f:
            model_type = json.load(f)["model_type"]
        self.assertTrue(checks["model"]["detail"].startswith(model_type + ":"), checks["model"])
        startup = "".join(server.startup_lines)
        budget_mib = int(startup.split("caches: ")[1].split(" MiB")[0].rsplit(" ", 1)[1])
        self.assertEqual(checks["workspace"]["detail"], "cache budget given: %d MiB" % budget_mib)
        self.assertEqual(checks["cuda_graphs"]["detail"], "none on cpu")
        self.assertEqual(checks["frontends"]["detail"], "http 127.0.0.1:%d, grpc 127.0.0.1:%d" %
                         (server.port, server.grpc_port))
        # Liveness apart, and the key still guards the API.
        self.assertEqual(http_get(server.port, "/health")[0], 200)
        self.assertEqual(http_get(server.port, "/v1/models")[0], 401)
        self.assertEqual(http_get(server.port, "/v1/models", AUTH)[0], 200)
        with loom_client.LoomClient("127.0.0.1:%d" % server.grpc_port, timeout=DEADLINE) as c:
            self.assertEqual(c.health(), "SERVING")
            self.assertEqual(c.health("loom.v1.Loom"), "SERVING")

    def test_drain_turns_both_not_ready(self):
        server = self.start("--drain_timeout_s", "60")
        heard = self.watch(server)
        self.assertEqual(heard.get(timeout=DEADLINE), "SERVING")
        # A streaming generation in flight across the signal.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=DEADLINE)
        self.addCleanup(conn.close)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": "drain", "max_tokens": 300, "ignore_eos": True,
                                      "stream": True}),
                     headers=dict(AUTH, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.readline().startswith(b"data: "))
        server.proc.send_signal(signal.SIGTERM)

        self.assertEqual(heard.get(timeout=DEADLINE), "NOT_SERVING")
        status, body = http_get(server.port, "/ready")
        self.assertEqual(status, 503, body)
        self.assertEqual(body["status"], "draining")
        self.assertIn("draining", body["reason"])
        self.assertTrue(all(c["passed"] for c in body["checks"].values()))
        with loom_client.LoomClient("127.0.0.1:%d" % server.grpc_port, timeout=DEADLINE) as c:
            self.assertEqual(c.health(), "NOT_SERVING")
            self.assertEqual(c.health("loom.v1.Loom"), "NOT_SERVING")
        # The generation admitted before the signal runs to its end.
        events = [l for l in resp.read().decode().splitlines() if l.startswith("data: ")]
        self.assertEqual(events[-1], "data: [DONE]")
        finals = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]]
        self.assertEqual(finals[-1], "length")
        self.assertEqual(server.proc.wait(timeout=DEADLINE), 0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True, help="dir with loom_client.py and *_pb2.py")
    ARGS, rest = ap.parse_known_args()
    sys.path.insert(0, ARGS.pythonpath)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import grpc  # noqa: E402
    import health_pb2  # noqa: E402
    import loom_client  # noqa: E402
    from loom_server_process import LoomServer  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
