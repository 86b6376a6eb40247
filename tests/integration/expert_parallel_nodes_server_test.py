"""loom-server with its expert-parallel ranks on two nodes (issue 16: --expert_parallel 2
--nnodes 2 --node_rank r --coordinator HOST:PORT), both processes on localhost.

  * Each node serves its own ranks on its own frontend: seeded completions sent at once, half to
    each node, equal the one-rank server's tokens and logprobs under --deterministic, while the
    two nodes' ranks step in lockstep over TCP. Each node's /metrics counts its own rank.
  * A node killed (SIGKILL) makes the other exit with status 1, saying it lost that node.
  * Nodes that disagree (the exchange) are refused at the rendezvous, naming both; inconsistent
    node flags are refused at start-up.

  /usr/bin/python3 expert_parallel_nodes_server_test.py --server build/bin/loom-server \
      --model ../shared/fixtures/kimi_linear_s1
"""

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from loom_server_process import LoomServer
from checks import check, summary

ARGS = None
PROMPTS = ["The expert", "Tokens travel", "A rank with no work", "Lockstep", "Over TCP",
           "Node zero"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def trace(port, prompt, seed):
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/completions" % port,
        data=json.dumps({"prompt": prompt, "max_tokens": 10, "temperature": 0.8, "seed": seed,
                         "logprobs": 2, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=240) as r:
        c = json.loads(r.read())["choices"][0]
    return (c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"])


def workload(ports):
    """Every prompt at once, prompt i to ports[i % len(ports)]; returns {i: trace}."""
    out, threads = {}, []
    for i, p in enumerate(PROMPTS):
        def run(i=i, p=p):
            out[i] = trace(ports[i % len(ports)], p, 100 + i)
        threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out


def metric(port, name, labels=""):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + labels + " "):
                return float(line.split()[1])
    return None


def start_nodes(common, per_node):
    """Starts node 0 and node 1 (node 0 waits for node 1 at the rendezvous before it listens)."""
    port = free_port()
    servers, errors = [None, None], []

    def start(r):
        try:
            servers[r] = LoomServer(ARGS.server, ARGS.model, *common, "--nnodes", "2",
                                    "--node_rank", str(r), "--coordinator",
                                    "127.0.0.1:%d" % port, *per_node[r], startup_timeout_s=240)
        except RuntimeError as e:
            errors.append(str(e))
    threads = [threading.Thread(target=start, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return servers, errors


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ARGS = ap.parse_args()
    common = ["--deterministic", "--max_num_batched_tokens", "48"]

    with LoomServer(ARGS.server, ARGS.model, *common) as s:
        one = workload([s.port])

    ep = common + ["--expert_parallel", "2", "--expert_dispatch", "all_to_all"]
    servers, errors = start_nodes(ep, [[], []])
    check(not errors, "both nodes start: %s" % errors)
    if not errors:
        try:
            got = workload([servers[0].port, servers[1].port])
            for i in sorted(one):
                check(got.get(i) == one[i], "prompt %d (node %d) equals the one-rank server's"
                      % (i, i % 2))
            for r, s in enumerate(servers):
                check(metric(s.port, "loom_expert_parallel_ranks") == 1,
                      "node %d: /metrics counts its one rank" % r)
                # Its rank by its group rank: node 1 runs rank 1.
                check(metric(s.port, "loom_rank_load_tokens", '{rank="%d"}' % r) is not None and
                      metric(s.port, "loom_rank_load_tokens", '{rank="%d"}' % (1 - r)) is None,
                      "node %d: /metrics labels its rank %d" % (r, r))
            # Node 1 dies: node 0 loses it and exits with status 1.
            t0 = time.time()
            servers[1].proc.send_signal(signal.SIGKILL)
            servers[1].proc.wait(timeout=30)
            try:
                rc = servers[0].proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                rc = None
            err = "".join(servers[0].stderr_lines)
            check(rc == 1, "node 0 exits with status 1 when node 1 dies (%s)" % rc)
            check("lost node 1 (" in err, "node 0 says it lost node 1: %s" % err.strip()[-500:])
            print("node 0 exited %.1f s after node 1 was killed" % (time.time() - t0))
        finally:
            for s in servers:
                s.stop()

    # Nodes that disagree never serve: both exit, naming both nodes.
    port = free_port()
    procs = [subprocess.Popen([ARGS.server, "--model", ARGS.model, "--port", "0",
                               "--expert_parallel", "2", "--nnodes", "2", "--node_rank", str(r),
                               "--coordinator", "127.0.0.1:%d" % port, "--expert_dispatch",
                               ("all_to_all", "all_gather")[r]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        check(p.returncode not in (0, None) and "rendezvous refused" in err and
              "expert_dispatch=all_gather but node 0 (" in err,
              "exchange mismatch: node %d refused naming both (%s): %s" %
              (r, p.returncode, err.strip()[-400:]))
    for flags, needle in ((["--expert_parallel", "2", "--nnodes", "2"], "--coordinator"),
                          (["--expert_parallel", "3", "--nnodes", "2", "--coordinator",
                            "127.0.0.1:1"], "a multiple of --nnodes"),
                          (["--nnodes", "2", "--coordinator", "127.0.0.1:1"], "needs N >= 2")):
        p = subprocess.run([ARGS.server, "--model", ARGS.model, "--port", "0"] + flags,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode != 0 and needle in p.stderr,
              "%s refused (%d): %s" % (" ".join(flags), p.returncode, p.stderr.strip()))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
