#!/usr/bin/env python3
"""loom-server --random_weights SEED end to end: a folder holding only a config.json (copied from a
fixture) and the config.json file itself both serve; the model is announced as untrained under the
folder's name with the byte-level tokenizer; a seed gives the same greedy tokens in another
process (and from the file as from the folder), another seed other tokens; bad seeds and paths
stop the server with the flag named, and loom-conformance refuses the flag."""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

from checks import check, summary
from loom_server_process import LoomServer


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def greedy_ids(port):
    status, body = request(port, "POST", "/v1/completions",
                           dict(prompt="Random weights, the same everywhere", max_tokens=16,
                                temperature=0, ignore_eos=True, logprobs=1))
    check(status == 200, "completion: %s" % body)
    return body["choices"][0]["logprobs"]["tokens"], body["choices"][0]["text"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--conformance", required=True)
    p.add_argument("--fixture", required=True)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="loom_random_weights_")
    try:
        folder = os.path.join(tmp, "tiny_random")
        os.makedirs(folder)
        shutil.copy(os.path.join(args.fixture, "config.json"), folder)
        cfg_file = os.path.join(folder, "config.json")
        with LoomServer(args.server, folder, "--random_weights", "7") as s:
            status, models = request(s.port, "GET", "/v1/models")
            m = models["data"][0]
            check(m["id"] == "tiny_random", "served name is the folder's: %s" % m)
            check(m.get("loom_untrained") is True, "announced untrained: %s" % m)
            status, tok = request(s.port, "POST", "/tokenize", {"prompt": "Hello"})
            check(status == 200 and len(tok["tokens"]) == 5, "byte-level tokenizer: %s" % tok)
            check(any("random weights (seed 7)" in l for l in s.startup_lines),
                  "start-up line names the seed: %s" % s.startup_lines)
            first, text = greedy_ids(s.port)
            again, _ = greedy_ids(s.port)
            check(first == again, "same server, same greedy tokens")
            check(len(first) == 16, "16 tokens: %s" % first)
        with LoomServer(args.server, cfg_file, "--random_weights", "7") as s:
            same, _ = greedy_ids(s.port)
            check(same == first, "the file gives the folder's model (seed 7): %s vs %s" % (same, first))
        with LoomServer(args.server, folder, "--random_weights", "8") as s:
            other, _ = greedy_ids(s.port)
            check(other != first, "seed 8 gives other tokens: %s" % other)

        for flags, want in ((["--model", folder, "--random_weights", "-1"], "is not a seed"),
                            (["--model", folder, "--random_weights", "abc"], "is not a seed"),
                            (["--model", os.path.join(tmp, "missing"), "--random_weights", "1"],
                             "does not exist"),
                            (["--model", tmp, "--random_weights", "1"], "has no config.json")):
            r = subprocess.run([args.server, "--port", "0"] + flags, capture_output=True,
                               text=True, timeout=60)
            check(r.returncode != 0 and want in r.stderr,
                  "%s refused (%d): %r" % (flags, r.returncode, r.stderr))
        r = subprocess.run([args.conformance, "--fixture", args.fixture, "--random_weights", "1"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "--random_weights is not accepted" in r.stderr,
              "loom-conformance refuses --random_weights (%d): %r" % (r.returncode, r.stderr))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
