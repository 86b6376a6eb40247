#!/usr/bin/env python3
"""The CPU image (deploy/docker/Dockerfile.cpu) built and run with podman (ctest deploy_cpu_image_e2e).

Builds `--target runtime-prebuilt`: this build's loom-server and the bundled default model
(weights/default, as `make default-model` copies it), in the image's runtime stage (the compiling
`build` stage takes minutes and is the same runtime stage after it; docs/deploy.md records its
run). The base image is a local Debian bookworm made with deploy/docker/debian-base.sh
(debootstrap) when no registry is reachable.
Then the container runs as the image says (its CMD, a read-only root file system, as
Kubernetes' readOnlyRootFilesystem): /ready and /health answer 200, one completion comes back with
the tokens asked for, the process runs as uid 10001, and `podman stop` (SIGTERM through tini)
drains and exits 0.

Exit 77 (skipped, loudly) when podman is absent, or when the base image is absent and cannot be
made here (no debootstrap, not root). Containers that cannot start in this sandbox with podman's
defaults are retried with the settings that work on the development machines (runc instead of
crun, whose cgroup handling refuses hybrid v1/v2 hierarchies; ulimits no higher than the
sandbox's), which the test prints.
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
IMAGE = "localhost/loom:cpu-ctest"


def log(msg):
    print("deploy_cpu_image_e2e: " + msg, file=sys.stderr, flush=True)


def run(cmd, timeout=900, check=True):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), out.returncode,
                                                     out.stdout[-3000:], out.stderr[-3000:]))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_settings(podman, base):
    """The global and `run` options under which a container starts here, or None."""
    hard_nofile = int(run(["sh", "-c", "ulimit -Hn"]).stdout.strip())
    limits = ["--ulimit", "nofile=%d:%d" % (hard_nofile, hard_nofile),
              "--ulimit", "nproc=4096:4096"]
    candidates = [([], []), ([], limits)]
    if shutil.which("runc"):
        candidates.append((["--runtime", "runc"], limits))
    for glob_opts, run_opts in candidates:
        out = run([podman] + glob_opts + ["run", "--rm"] + run_opts + [base, "true"], check=False)
        if out.returncode == 0:
            return glob_opts, run_opts
        log("containers do not start with %s: %s" % (" ".join(glob_opts + run_opts) or "defaults",
                                                      out.stderr.strip()[-300:]))
    return None


def http_get(port, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--base", default="localhost/debian:bookworm-debootstrap")
    args = ap.parse_args()

    podman = shutil.which("podman")
    if not podman:
        log("SKIPPED: podman is not installed (apt-get install podman runc); the CPU image was "
            "not built or run")
        return SKIP
    if run([podman, "image", "exists", args.base], check=False).returncode != 0:
        if not shutil.which("debootstrap") or os.geteuid() != 0:
            log("SKIPPED: no base image %s, and it cannot be made here (debootstrap as root: "
                "deploy/docker/debian-base.sh)" % args.base)
            return SKIP
        log("making the base image %s with debootstrap" % args.base)
        run([os.path.join(args.source, "deploy", "docker", "debian-base.sh"), args.base],
            timeout=1800)
    settings = run_settings(podman, args.base)
    if settings is None:
        log("FAILED: podman cannot start a container here")
        return 1
    glob_opts, run_opts = settings
    log("podman %s, run options: %s" % (" ".join(glob_opts) or "(defaults)",
                                        " ".join(run_opts) or "(none)"))

    # The build context the Dockerfile's runtime-prebuilt stage reads.
    ctx = tempfile.mkdtemp(prefix="loom-image-ctx-")
    name = "loom-ctest-%d" % os.getpid()
    try:
        os.makedirs(os.path.join(ctx, "build", "bin"))
        os.makedirs(os.path.join(ctx, "deploy", "docker"))
        shutil.copy2(args.server, os.path.join(ctx, "build", "bin", "loom-server"))
        for f in ("Dockerfile.cpu", "Dockerfile.cpu.dockerignore", "collect-libs.sh"):
            shutil.copy2(os.path.join(args.source, "deploy", "docker", f),
                         os.path.join(ctx, "deploy", "docker", f))
        os.makedirs(os.path.join(ctx, "build", "default-model"))
        for f in ("config.json", "model.safetensors"):
            shutil.copy2(os.path.join(args.source, "weights", "default", f),
                         os.path.join(ctx, "build", "default-model", f))
        t0 = time.time()
        run([podman] + glob_opts + ["build", "--network", "host", "--target", "runtime-prebuilt",
                                    "--build-arg", "BASE=" + args.base, "-t", IMAGE,
                                    "-f", os.path.join(ctx, "deploy", "docker", "Dockerfile.cpu"),
                                    "--ignorefile",
                                    os.path.join(ctx, "deploy", "docker",
                                                 "Dockerfile.cpu.dockerignore")]
            + [o for o in run_opts] + [ctx], timeout=1800)
        log("image %s built in %.1f s" % (IMAGE, time.time() - t0))

        http_port, grpc_port = free_port(), free_port()
        run([podman] + glob_opts + ["run", "-d", "--name", name, "--read-only"] + run_opts +
            ["-p", "127.0.0.1:%d:8000" % http_port, "-p", "127.0.0.1:%d:50051" % grpc_port,
             IMAGE])
        deadline = time.time() + 120
        status = None
        while time.time() < deadline:
            try:
                status, body = http_get(http_port, "/ready")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        if status != 200:
            logs = run([podman] + glob_opts + ["logs", name], check=False)
            raise RuntimeError("the container never got ready:\n" + logs.stdout + logs.stderr)
        ready = json.loads(body)
        assert ready["status"] == "ready", ready
        assert ready["checks"]["frontends"]["detail"] == "http 0.0.0.0:8000, grpc 0.0.0.0:50051", \
            ready
        status, _ = http_get(http_port, "/health")
        assert status == 200, status
        status, body = http_get(http_port, "/v1/completions",
                                {"prompt": "Hello", "max_tokens": 5, "ignore_eos": True})
        assert status == 200, body
        usage = json.loads(body)["usage"]
        assert usage["completion_tokens"] == 5, usage
        uid = run([podman] + glob_opts + ["exec", name, "id", "-u"]).stdout.strip()
        assert uid == "10001", uid
        t0 = time.time()
        run([podman] + glob_opts + ["stop", "-t", "30", name])
        took = time.time() - t0
        code = run([podman] + glob_opts + ["inspect", name, "--format",
                                           "{{.State.ExitCode}}"]).stdout.strip()
        logs = run([podman] + glob_opts + ["logs", name]).stderr
        assert code == "0", (code, logs)
        assert "SIGTERM: draining" in logs and "loom-server: stopped" in logs, logs
        log("ready, one completion (%s), uid %s, SIGTERM -> exit 0 in %.2f s"
            % (usage, uid, took))
        return 0
    finally:
        run([podman] + glob_opts + ["rm", "-f", name], check=False)
        shutil.rmtree(ctx, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
