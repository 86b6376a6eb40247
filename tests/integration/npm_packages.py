"""Pinned npm packages in a build-dir prefix, for the integration tests that drive Loom from
Node (run_openai_sdk_test.py, run_grpc_js_test.py). `packages` maps a name to its exact version.
"""
import json
import os
import shutil
import subprocess


def installed(prefix, packages):
    """True when every package is in `prefix` at its pinned version."""
    for name, version in packages.items():
        try:
            with open(os.path.join(prefix, "node_modules", name, "package.json")) as f:
                if json.load(f)["version"] != version:
                    return False
        except (OSError, ValueError, KeyError):
            return False
    return True


def install(prefix, packages):
    """Installs the pinned packages into `prefix` unless they are there; False (with npm's
    output) when that fails."""
    if installed(prefix, packages):
        return True
    specs = ["%s@%s" % kv for kv in packages.items()]
    if shutil.which("npm") is None:
        print("npm is not installed: cannot install %s" % " ".join(specs))
        return False
    os.makedirs(prefix, exist_ok=True)
    try:
        r = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund",
                            "--no-save"] + specs, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        print("npm install %s timed out" % " ".join(specs))
        return False
    if r.returncode != 0 or not installed(prefix, packages):
        print("npm install %s failed:\n%s" % (" ".join(specs), (r.stdout + r.stderr)[-4000:]))
        return False
    print("installed %s into %s" % (" ".join(specs), prefix))
    return True
