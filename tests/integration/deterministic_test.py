"""loom-server --deterministic end to end, over HTTP and gRPC: a seeded request's tokens and
logprobs are identical alone and while 12 other requests of mixed lengths run beside it (an odd
token budget cuts every prompt at other places); its prompt shares a cached prefix with an earlier
request. With --compare-default the same run without the flag must differ somewhere (shows the
test can see a difference; not part of ctest, where it would depend on timing).

  /usr/bin/python3 deterministic_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python
"""

import argparse
import json
import random
import sys
import threading
import urllib.request

from loom_server_process import LoomServer
from checks import check, summary

ARGS = None


def post(port, path, body, timeout=120):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def target_body(prompt):
    return {"prompt": prompt, "max_tokens": 24, "temperature": 0.8, "top_p": 0.95, "seed": 4242,
            "logprobs": 3, "ignore_eos": True}


def http_trace(port, prompt):
    c = post(port, "/v1/completions", target_body(prompt))["choices"][0]
    lp = c["logprobs"]
    return (c["text"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])


def grpc_trace(client, prompt):
    out = client.generate_text(prompt, temperature=0.8, top_p=0.95, seed=4242, max_tokens=24,
                               logprobs=3, ignore_eos=True, timeout=120)[0]
    return (out["token_ids"], repr(out["logprobs"]))


def noise(port, rng, count):
    """Starts `count` concurrent requests of mixed lengths; returns the threads."""
    threads = []
    for i in range(count):
        body = {"prompt": [rng.randrange(3, 300) for _ in range(rng.randrange(1, 400))],
                "max_tokens": rng.randrange(1, 30), "temperature": 1.0, "ignore_eos": True}
        t = threading.Thread(target=post, args=(port, "/v1/completions", body), daemon=True)
        t.start()
        threads.append(t)
    return threads


def run(extra):
    sys.path.insert(0, ARGS.pythonpath)
    from loom_client import LoomClient  # noqa: E402 (generated stubs live in the build)

    rng = random.Random(99)
    base = [rng.randrange(3, 300) for _ in range(200)]
    prompt = base[:128] + [rng.randrange(3, 300) for _ in range(41)]
    results = {}
    # Alone: a fresh server, nothing else running, no cached prefix.
    with LoomServer(ARGS.server, ARGS.model, "--grpc_port", "0", "--max_num_batched_tokens", "37",
                    *extra) as s:
        with LoomClient("127.0.0.1:%d" % s.grpc_port) as g:
            results["http_alone"] = http_trace(s.port, prompt)
            results["grpc_alone"] = grpc_trace(g, prompt)
    # Under load, after `base` filled the prefix cache, on another fresh server.
    with LoomServer(ARGS.server, ARGS.model, "--grpc_port", "0", "--max_num_batched_tokens", "37",
                    *extra) as s:
        post(s.port, "/v1/completions", {"prompt": base, "max_tokens": 1})
        with LoomClient("127.0.0.1:%d" % s.grpc_port) as g:
            threads = noise(s.port, rng, 12)
            results["http_load"] = http_trace(s.port, prompt)
            threads += noise(s.port, rng, 12)
            results["grpc_load"] = grpc_trace(g, prompt)
            for t in threads:
                t.join(timeout=300)
            hits = g.stats().prefix_hit_tokens
    return results, hits


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--pythonpath", required=True)
    p.add_argument("--compare-default", action="store_true")
    ARGS = p.parse_args()
    det, hits = run(["--deterministic"])
    check(det["http_alone"] == det["http_load"], "HTTP: same tokens and logprobs alone and under load")
    check(det["grpc_alone"] == det["grpc_load"], "gRPC: same tokens and logprobs alone and under load")
    check(len(det["http_alone"][1]) == 24, "24 tokens")
    check(hits >= 128, "the target hit the cached prefix (%d tokens)" % hits)
    if ARGS.compare_default:
        fast, _ = run([])
        check(fast["http_alone"] != fast["http_load"] or fast["grpc_alone"] != fast["grpc_load"],
              "without --deterministic the traces differ (the test can see a difference)")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
