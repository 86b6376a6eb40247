#!/usr/bin/python3
"""Runs openai_sdk_test.mjs (the official `openai` npm SDK) against a fresh loom-server.

The pinned SDK lives in --prefix (a build-dir folder, never committed). `make test`'s set-up
installs it there (`--install-only`, when node and npm exist), so the test runs offline afterwards;
if it is missing the test tries npm itself. With node present and no SDK to be had, the test FAILS:
an offline CI must not pass by skipping it. Only without node at all does it exit 77 (ctest:
skipped), with a loud message.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

import npm_packages

OPENAI_VERSION = "5.23.2"  # pinned: supports Node 20 (7.x needs Node 22)
PACKAGES = {"openai": OPENAI_VERSION}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server")
    p.add_argument("--model")
    p.add_argument("--prefix", required=True)
    p.add_argument("--script")
    p.add_argument("--install-only", action="store_true",
                   help="install the pinned SDK into --prefix (make test's set-up) and exit")
    args = p.parse_args()

    if args.install_only:
        return 0 if npm_packages.install(args.prefix, PACKAGES) else 1
    if not (args.server and args.model and args.script):
        p.error("--server, --model and --script are required to run the test")
    if shutil.which("node") is None:
        print("*" * 78 + "\nSKIPPED: node is not installed, so the openai npm SDK test cannot run.\n"
              "Install Node.js (20 or later) and npm to run it.\n" + "*" * 78)
        return 77
    if not npm_packages.install(args.prefix, PACKAGES):
        print("FAILED: node is installed but the openai npm SDK %s is not in %s and could not be "
              "installed. Run `make test` (its set-up installs it) where the npm registry is "
              "reachable, or `npm install --prefix %s openai@%s`." %
              (OPENAI_VERSION, args.prefix, args.prefix, OPENAI_VERSION))
        return 1

    proc = subprocess.Popen([args.server, "--model", args.model, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"\(port (\d+)\)", line)
            if m:
                port = int(m.group(1))
        if port is None:
            print("loom-server did not start")
            return 1
        env = dict(os.environ, LOOM_BASE_URL="http://127.0.0.1:%d/v1" % port,
                   LOOM_MODEL=os.path.basename(os.path.normpath(args.model)),
                   LOOM_NPM_PREFIX=os.path.abspath(args.prefix))
        r = subprocess.run(["node", args.script], env=env, timeout=240)
        return r.returncode
    finally:
        proc.kill()
        proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
