#!/usr/bin/python3
"""Runs grpc_js_test.mjs (Node's @grpc/grpc-js with @grpc/proto-loader) against a fresh
loom-server --deterministic with both frontends.

The pinned packages live in --prefix (a build-dir folder, never committed), installed there by
`--install-only` or, when missing, by this script with npm. As with the openai SDK test
(run_openai_sdk_test.py): with node present and the packages not to be had the test FAILS, so an
offline CI cannot pass by skipping it; only without node at all does it exit 77 (ctest: skipped).
"""
import argparse
import os
import shutil
import subprocess
import sys

import npm_packages
from loom_server_process import LoomServer

PACKAGES = {"@grpc/grpc-js": "1.14.7", "@grpc/proto-loader": "0.8.1"}  # pinned, Node >= 12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server")
    p.add_argument("--model")
    p.add_argument("--prefix", required=True)
    p.add_argument("--script")
    p.add_argument("--proto-dir")
    p.add_argument("--install-only", action="store_true")
    args = p.parse_args()
    if args.install_only:
        return 0 if npm_packages.install(args.prefix, PACKAGES) else 1
    if not (args.server and args.model and args.script and args.proto_dir):
        p.error("--server, --model, --script and --proto-dir are required to run the test")
    if shutil.which("node") is None:
        print("*" * 78 + "\nSKIPPED: node is not installed, so the @grpc/grpc-js test cannot run.\n"
              "Install Node.js (20 or later) and npm to run it.\n" + "*" * 78)
        return 77
    if not npm_packages.install(args.prefix, PACKAGES):
        print("FAILED: node is installed but %s could not be installed into %s; run "
              "`run_grpc_js_test.py --install-only --prefix %s` where the npm registry is "
              "reachable." % (PACKAGES, args.prefix, args.prefix))
        return 1
    with LoomServer(args.server, args.model, "--deterministic", "--grpc_port", "0") as srv:
        env = dict(os.environ, LOOM_GRPC_TARGET="127.0.0.1:%d" % srv.grpc_port,
                   LOOM_HTTP_URL=srv.url, LOOM_PROTO_DIR=os.path.abspath(args.proto_dir),
                   LOOM_NPM_PREFIX=os.path.abspath(args.prefix))
        return subprocess.run(["node", args.script], env=env, timeout=240).returncode


if __name__ == "__main__":
    sys.exit(main())
