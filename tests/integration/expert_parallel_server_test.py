"""loom-server --expert_parallel N end to end, over HTTP and gRPC (issue 16): N engine ranks in one
process (threads on the CPU), each its own requests, the experts split over them.

  * Under --deterministic every request's tokens and logprobs equal the one-rank server's, for
    2 ranks (all_gather) and 3 ranks (all_to_all, the load balancer re-placing every 2 steps with
    3 redundant experts): 8 seeded requests sent at once, half over HTTP and half over gRPC, so
    that they spread over the ranks; a gRPC Chat session's two turns and a /v1/responses chain's
    two turns (a session each, kept on one rank) equal the one-rank server's too.
  * /metrics has one loom_rank_* sample per rank (zero once idle), the ranks count and, with the
    balancer, the expert load balance in (0, 1] and re-placements > 0 (none without it; 1 on one
    rank). How requests spread over the ranks is engine_expert_parallel_test's.
  * Bad values are refused at start-up with a message naming the flag: 0, -1, more ranks than
    the model's 12 experts, --device cuda (NCCL ranks are not built), --redundant_experts
    without ranks, an unknown --expert_dispatch.
  * A rank that does not reach a collective within --expert_parallel_timeout_s fails the group,
    and the server exits with status 1 naming the rank and the collective.

  /usr/bin/python3 expert_parallel_server_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1 --pythonpath build/python
"""

import argparse
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

from loom_server_process import LoomServer
from checks import check, summary

ARGS = None
RANK_GAUGES = ("loom_rank_requests_running", "loom_rank_requests_waiting", "loom_rank_load_tokens")


def post(port, path, body, timeout=120):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        return r.read().decode()


def http_trace(port, prompt, seed):
    c = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0.8,
                                       "seed": seed, "logprobs": 2, "ignore_eos": True})
    c = c["choices"][0]
    lp = c["logprobs"]
    return (c["text"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])


def grpc_trace(client, prompt, seed):
    out = client.generate_text(prompt, temperature=0.8, seed=seed, max_tokens=12, logprobs=2,
                               ignore_eos=True, timeout=120)[0]
    return (out["token_ids"], repr(out["logprobs"]))


def chat_turns(client):
    """Two turns of a gRPC Chat session: their token ids."""
    out = []
    for text in ("Name a colour.", "And another one?"):
        r = client.chat_reply([{"role": "user", "content": text}], session_id="ep-chat",
                              temperature=0.0, max_tokens=8, timeout=120)[0]
        out.append((r["token_ids"], r["cached_tokens"] if "cached_tokens" in r else None))
    return out


def responses_turns(port):
    """Two turns of a /v1/responses chain (a session on the server): their output texts."""
    body = {"input": "Count to three.", "max_output_tokens": 8, "temperature": 0, "store": True}
    r1 = post(port, "/v1/responses", body)
    r2 = post(port, "/v1/responses", dict(body, input="Again.", previous_response_id=r1["id"]))
    # The texts (item ids differ from server to server).
    text = lambda r: [c["text"] for item in r["output"] for c in item["content"]]
    return [text(r1), text(r2), r2["usage"]["input_tokens_details"]["cached_tokens"] > 0]


def workload(server):
    """Every request of the test, the 8 generations at once; returns their traces by name."""
    sys.path.insert(0, ARGS.pythonpath)
    from loom_client import LoomClient  # noqa: E402 (generated stubs live in the build)

    rng = random.Random(16)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (70, 9, 33, 5, 50, 17, 26, 12)]
    results, threads = {}, []
    with LoomClient("127.0.0.1:%d" % server.grpc_port) as g:
        def one(i):
            if i % 2 == 0:
                results["http%d" % i] = http_trace(server.port, prompts[i], 100 + i)
            else:
                results["grpc%d" % i] = grpc_trace(g, prompts[i], 100 + i)
        for i in range(len(prompts)):
            t = threading.Thread(target=one, args=(i,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout=300)
        results["chat"] = chat_turns(g)
    results["responses"] = responses_turns(server.port)
    return results


def idle_metrics(port, names, ranks, timeout_s=20):
    """/metrics once every rank's `names` read 0: the engines publish their stats after a step, so
    a reply can reach the client before the snapshot that counts it done."""
    deadline = time.time() + timeout_s
    while True:
        m = get(port, "/metrics")
        if all(metric(m, n, '{rank="%d"}' % r) == 0 for n in names for r in range(ranks)) or \
                time.time() > deadline:
            return m
        time.sleep(0.05)


def metric(text, name, labels=""):
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def refused(*flags):
    """Starts loom-server with `flags`; returns (exit status, stderr) (it must not start)."""
    p = subprocess.run([ARGS.server, "--model", ARGS.model, "--port", "0"] + list(flags),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pythonpath", required=True)
    ARGS = ap.parse_args()

    common = ["--grpc_port", "0", "--deterministic", "--max_num_batched_tokens", "48"]
    with LoomServer(ARGS.server, ARGS.model, *common) as s:
        one = workload(s)
        m = idle_metrics(s.port, RANK_GAUGES, 1)
        check(metric(m, "loom_expert_parallel_ranks") == 1, "one rank: loom_expert_parallel_ranks 1")
        check(metric(m, "loom_expert_load_balance") == 1.0, "one rank: balance 1")
        check(metric(m, "loom_rank_requests_running", '{rank="0"}') == 0, "one rank: rank 0")
    check(len(one["http0"][1]) == 12, "12 tokens a request")

    for ranks, extra in ((2, ["--expert_dispatch", "all_gather"]),
                         (3, ["--expert_dispatch", "all_to_all", "--redundant_experts", "3",
                              "--eplb_interval_steps", "2"])):
        with LoomServer(ARGS.server, ARGS.model, *common, "--expert_parallel", str(ranks),
                        *extra) as s:
            got = workload(s)
            for name in sorted(one):
                check(got[name] == one[name],
                      "%d ranks: %s equals the one-rank server's" % (ranks, name))
            m = idle_metrics(s.port, RANK_GAUGES, ranks)
            check(metric(m, "loom_expert_parallel_ranks") == ranks, "%d ranks in /metrics" % ranks)
            for r in range(ranks):
                for name in RANK_GAUGES:
                    check(metric(m, name, '{rank="%d"}' % r) == 0,
                          "%s{rank=%d} is 0 once idle" % (name, r))
            check(metric(m, "loom_rank_requests_running", '{rank="%d"}' % ranks) is None,
                  "no rank %d" % ranks)
            balance = metric(m, "loom_expert_load_balance")
            if "--eplb_interval_steps" in extra:
                check(balance is not None and 0 < balance <= 1,
                      "%d ranks: expert load balance %s in (0, 1]" % (ranks, balance))
                check(metric(m, "loom_expert_replacements_total") > 0, "re-placements counted")
                print("%d ranks: expert load balance %.3f after %d re-placements" %
                      (ranks, balance, metric(m, "loom_expert_replacements_total")))
            else:
                check(balance is None, "no balance measured without the balancer")
            steps = metric(m, "loom_engine_steps_total")
            print("%d ranks: %d lockstep steps" % (ranks, steps))

    for flags, what in ((["--expert_parallel", "0"], "--expert_parallel: 0"),
                        (["--expert_parallel", "-1"], "--expert_parallel: -1"),
                        (["--expert_parallel", "13"], "at least one expert per rank"),
                        (["--expert_parallel", "2", "--device", "cuda"], "NCCL ranks"),
                        (["--redundant_experts", "2"], "--redundant_experts"),
                        (["--expert_parallel", "2", "--expert_dispatch", "ring"],
                         "--expert_dispatch")):
        rc, err = refused(*flags)
        check(rc != 0 and what in err, "%s refused (%d): %s" % (" ".join(flags), rc, err.strip()))
    # A rank late at a collective (here every rank: a 1 us timeout, which the idle ranks' agreement
    # passes, 20 ms apart, exceed at once) fails the group: the server says so and exits with 1.
    start = time.time()
    rc, err = refused("--expert_parallel", "2", "--expert_parallel_timeout_s", "0.000001")
    check(rc == 1 and "expert-parallel ranks failed" in err and "waited" in err,
          "a rank group failure ends the server (%d): %s" % (rc, err.strip()))
    check(time.time() - start < 30, "within %.1f s" % (time.time() - start))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
