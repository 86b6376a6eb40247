"""loom-conformance with expert-parallel ranks in several processes (issue 16: --nnodes,
--node_rank, --coordinator), the nodes on localhost at a free port, each running its share of
--expert_parallel N as threads and exchanging over TCP.

  --mode results (one fixture): under --deterministic, the prompt lines the nodes print together
    (each prints the prompts its ranks ran) equal, field for field and logits digest for digest,
    those of one process running all N ranks as threads, and those of one rank (N = 1): 2 nodes x 1
    rank (all_to_all), 3 nodes x 1 rank (all_gather, --batch: one node's ranks have no prompt),
    2 nodes x 2 ranks with the load balancer (2 redundant experts, re-placing every step, weights
    moved between processes). Every node exits 0 and reports only its own ranks.
  --mode failures (one fixture): a node that SIGKILLs itself mid-run (a non-coordinator, and the
    coordinator) makes every other node exit non-zero at once naming the lost node, well inside
    --expert_parallel_timeout_s; a node that SIGSTOPs itself mid-run makes them exit non-zero
    naming it once the (short) timeout has passed; nodes disagreeing on the exchange or the model
    are refused at the rendezvous with a message naming both nodes; inconsistent flags refused.

  python3 expert_parallel_nodes_test.py --conformance build/bin/loom-conformance \
      --fixture ../shared/fixtures/kimi_linear_s1 --mode results
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from checks import check, summary  # noqa: E402

ARGS = None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def env():
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"  # several processes share the CI machine's 2 cores
    return e


def run_one(args, timeout=600):
    p = subprocess.run([ARGS.conformance, "--fixture", ARGS.fixture] + args, capture_output=True,
                       text=True, timeout=timeout, env=env())
    return p.returncode, p.stdout, p.stderr


def start_nodes(args_per_node, port):
    procs = []
    for r, args in enumerate(args_per_node):
        procs.append(subprocess.Popen(
            [ARGS.conformance, "--fixture", ARGS.fixture, "--nnodes", str(len(args_per_node)),
             "--node_rank", str(r), "--coordinator", "127.0.0.1:%d" % port] + args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()))
    return procs


def run_nodes(args_per_node, timeout=600):
    """Runs one process per node; returns [(rc, stdout, stderr)] in node order. A port another
    test took between free_port() and node 0's bind shows as node 0 failing to listen: retried."""
    for _ in range(3):
        procs = start_nodes(args_per_node, free_port())
        out = []
        for p in procs:
            try:
                o, e = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
                e += "\n(killed by the test after %d s)" % timeout
            out.append((p.returncode, o, e))
        if "cannot listen on port" not in out[0][2]:
            return out
    return out


def prompt_lines(stdout):
    lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    return {l["prompt"]: l for l in lines if "prompt" in l}, [l for l in lines if "fixture" in l]


def check_results(name, world, nnodes, flags):
    rc, out, err = run_one(["--expert_parallel", str(world)] + flags)
    check(rc == 0, "%s: one process of %d ranks exits 0 (%d: %s)" % (name, world, rc, err[-400:]))
    want, _ = prompt_lines(out)
    single = [f for f in flags if not f.startswith("--expert_dispatch") and f not in
              ("all_gather", "all_to_all")]
    # The load balancer's flags need ranks: one rank runs without them.
    for k in ("--redundant_experts", "--eplb_interval_steps"):
        if k in single:
            i = single.index(k)
            del single[i:i + 2]
    rc1, out1, err1 = run_one(single)
    check(rc1 == 0, "%s: one rank exits 0 (%d: %s)" % (name, rc1, err1[-400:]))
    one_rank, _ = prompt_lines(out1)
    per = world // nnodes
    results = run_nodes([["--expert_parallel", str(world)] + flags] * nnodes)
    got = {}
    for node, (rc, out, err) in enumerate(results):
        check(rc == 0, "%s: node %d exits 0 (%d: %s)" % (name, node, rc, err[-600:]))
        lines, summaries = prompt_lines(out)
        for i, l in lines.items():
            check(i not in got, "%s: prompt %d reported by one node only" % (name, i))
            got[i] = l
        if check(len(summaries) == 1, "%s: node %d prints one summary" % (name, node)):
            s = summaries[0]
            check(s.get("ok") is True and s.get("nnodes") == nnodes and
                  s.get("node_rank") == node and s.get("expert_parallel") == world,
                  "%s: node %d summary: ok, its node and the group size (%s)" % (name, node, s))
            ranks = [r["rank"] for r in s.get("ranks", [])]
            check(ranks == list(range(node * per, (node + 1) * per)),
                  "%s: node %d reports its own ranks %s" % (name, node, ranks))
    check(sorted(got) == sorted(want), "%s: the nodes together ran every prompt (%s of %s)" %
          (name, sorted(got), sorted(want)))
    for i in sorted(want):
        check(got.get(i) == want[i],
              "%s prompt %d: the nodes' line equals one process's\n  nodes: %s\n  one:   %s" %
              (name, i, got.get(i), want[i]))
        check(got.get(i, {}).get("logits_digest") == one_rank.get(i, {}).get("logits_digest"),
              "%s prompt %d: the same logits bits as one rank" % (name, i))
    print("%s: %d nodes x %d ranks, %d prompts, digests %s" %
          (name, nnodes, per, len(got), [got[i]["logits_digest"] for i in sorted(got)]),
          flush=True)


def results():
    det = ["--deterministic", "--expert_parallel_timeout_s", "120"]
    check_results("2x1 all_to_all", 2, 2, ["--expert_dispatch", "all_to_all"] + det)
    check_results("3x1 all_gather batch", 3, 3, ["--expert_dispatch", "all_gather", "--batch"] + det)
    check_results("2x2 all_to_all balanced batch", 4, 2,
                  ["--expert_dispatch", "all_to_all", "--batch", "--redundant_experts", "2",
                   "--eplb_interval_steps", "1"] + det)


def expect_failure(name, results, victim, needle, rc_victim=None):
    for node, (rc, out, err) in enumerate(results):
        if node == victim:
            if rc_victim is not None:
                check(rc == rc_victim, "%s: node %d (the victim) ends by signal (%d)" %
                      (name, node, rc))
            continue
        check(rc not in (0, None), "%s: node %d exits non-zero (%s)" % (name, node, rc))
        check(needle in err, "%s: node %d says %r (stderr: %s)" % (name, node, needle,
                                                                 err.strip()[-600:]))


def failures():
    base = ["--expert_dispatch", "all_to_all", "--deterministic"]
    # A non-coordinator dies at its 5th step: nodes 0 and 2 lose it at once (end of stream), far
    # inside the 120 s timeout.
    t0 = time.time()
    r = run_nodes([["--expert_parallel", "3", "--expert_parallel_timeout_s", "120"] + base] * 1 +
                  [["--expert_parallel", "3", "--expert_parallel_timeout_s", "120",
                    "--inject_fault", "kill:5"] + base] +
                  [["--expert_parallel", "3", "--expert_parallel_timeout_s", "120"] + base])
    took = time.time() - t0
    expect_failure("node 1 killed", r, 1, "lost node 1 (", -signal.SIGKILL)
    check(took < 60, "node 1 killed: the others exited in %.1f s, not after the timeout" % took)
    # The coordinator dies: the other node loses it.
    t0 = time.time()
    r = run_nodes([["--expert_parallel", "2", "--expert_parallel_timeout_s", "120",
                    "--inject_fault", "kill:3"] + base] +
                  [["--expert_parallel", "2", "--expert_parallel_timeout_s", "120"] + base])
    took = time.time() - t0
    expect_failure("node 0 killed", r, 0, "lost node 0 (", -signal.SIGKILL)
    check(took < 60, "node 0 killed: node 1 exited in %.1f s, not after the timeout" % took)
    # A node hangs (stopped, its connection open): the other fails once the 3 s timeout passed.
    port = free_port()
    procs = start_nodes([["--expert_parallel", "2", "--expert_parallel_timeout_s", "3"] + base,
                         ["--expert_parallel", "2", "--expert_parallel_timeout_s", "3",
                          "--inject_fault", "stop:4"] + base], port)
    try:
        o, e = procs[0].communicate(timeout=300)
        check(procs[0].returncode not in (0, None), "node 1 hung: node 0 exits non-zero")
        check("node 1 (" in e and ("waited 3s" in e or "nothing from node 1" in e),
              "node 1 hung: node 0 names it and the timeout (%s)" % e.strip()[-600:])
    finally:
        procs[1].kill()
        procs[1].communicate()
    # Disagreements refused at the rendezvous, naming both nodes.
    r = run_nodes([["--expert_parallel", "2", "--expert_dispatch", "all_to_all"],
                   ["--expert_parallel", "2", "--expert_dispatch", "all_gather"]], timeout=120)
    for node, (rc, out, err) in enumerate(r):
        check(rc == 2 and "rendezvous refused" in err and "expert_dispatch=all_gather but node 0 ("
              in err and "expert_dispatch=all_to_all" in err,
              "exchange mismatch: node %d refused naming both (%d: %s)" % (node, rc, err.strip()))
    r = run_nodes([["--expert_parallel", "2"], ["--expert_parallel", "2", "--deterministic"]],
                  timeout=120)
    for node, (rc, out, err) in enumerate(r):
        check(rc == 2 and "deterministic=true but node 0 (" in err,
              "numerics mismatch: node %d refused naming both (%d: %s)" % (node, rc, err.strip()))
    # Flags that cannot describe a group.
    for flags, needle in (
            (["--expert_parallel", "2", "--nnodes", "2"], "needs --coordinator HOST:PORT"),
            (["--expert_parallel", "3", "--nnodes", "2", "--coordinator", "127.0.0.1:1"],
             "a multiple of --nnodes"),
            (["--expert_parallel", "2", "--coordinator", "127.0.0.1:1"], "needs --nnodes K >= 2"),
            (["--expert_parallel", "2", "--nnodes", "2", "--node_rank", "2", "--coordinator",
              "127.0.0.1:1"], "--node_rank 2: expected 0 <= node_rank < --nnodes 2"),
            (["--expert_parallel", "2", "--nnodes", "2", "--coordinator", "nowhere"],
             "expected HOST:PORT"),
            (["--nnodes", "2", "--coordinator", "127.0.0.1:1"], "they need N >= 2")):
        rc, out, err = run_one(flags, timeout=60)
        check(rc == 2 and needle in err, "%s refused: %r (%d: %s)" % (flags, needle, rc, err))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--conformance", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--mode", choices=("results", "failures"), required=True)
    ARGS = ap.parse_args()
    results() if ARGS.mode == "results" else failures()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
