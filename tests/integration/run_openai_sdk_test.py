#!/usr/bin/python3
"""Runs openai_sdk_test.mjs (the official `openai` npm SDK) against a fresh loom-server.

Installs the pinned SDK into --prefix (a build-dir folder) with npm unless it is already there;
exits 77 (ctest: skipped) with a clear message only when npm cannot reach the registry.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

OPENAI_VERSION = "5.23.2"  # pinned: supports Node 20 (7.x needs Node 22)


def installed_version(prefix):
    try:
        with open(os.path.join(prefix, "node_modules", "openai", "package.json")) as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--script", required=True)
    args = p.parse_args()

    if installed_version(args.prefix) != OPENAI_VERSION:
        os.makedirs(args.prefix, exist_ok=True)
        r = subprocess.run(["npm", "install", "--prefix", args.prefix, "--no-audit", "--no-fund",
                            "--no-save", "openai@" + OPENAI_VERSION],
                           capture_output=True, text=True, timeout=240)
        if r.returncode != 0:
            out = r.stdout + r.stderr
            if re.search(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ENETUNREACH|network", out):
                print("SKIPPED: npm registry unreachable, cannot install openai@%s:\n%s" %
                      (OPENAI_VERSION, out[-2000:]))
                return 77
            print("npm install failed:\n" + out[-4000:])
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
