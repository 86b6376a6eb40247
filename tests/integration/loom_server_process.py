"""A loom-server child process on a free loopback port, for the end-to-end tests.

Started with --port 0; the bound port is read from the `http listening on ... (port N)` line it
prints, and the lines printed up to it are kept in `startup_lines`. Every wait is bounded;
`stop()` kills it. Usable as a context manager. $LOOM_SERVER_ARGS (split on spaces) is added to
every server's flags, so the same tests run against a GPU-backed server (tests/gpu/run.sh:
LOOM_SERVER_ARGS="--device cuda").
"""
import os
import queue
import re
import subprocess
import threading
import time

LISTEN = re.compile(r"http listening on http://[^ ]+ \(port (\d+)\)")
GRPC_LISTEN = re.compile(r"grpc listening on [^ ]+:(\d+)")


class LoomServer:
    def __init__(self, server_bin, model, *extra, startup_timeout_s=120):
        cmd = [server_bin, "--model", model, "--port", "0", "--host", "127.0.0.1"] + list(extra)
        cmd += os.environ.get("LOOM_SERVER_ARGS", "").split()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr_lines = []
        self.startup_lines = []
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l.decode(errors="replace")) for l in self.proc.stdout],
                         daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.port = None
        # With --grpc_port, its line follows the HTTP one: wait for both.
        self.grpc_port = None
        want_grpc = "--grpc_port" in extra
        deadline = time.time() + startup_timeout_s
        while time.time() < deadline and (self.port is None or (want_grpc and self.grpc_port is None)):
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.startup_lines.append(line)
            m, g = LISTEN.search(line), GRPC_LISTEN.search(line)
            if m:
                self.port = int(m.group(1))
            if g:
                self.grpc_port = int(g.group(1))
        if self.port is None or (want_grpc and self.grpc_port is None):
            self.stop()
            raise RuntimeError("loom-server did not report its port: %s\n%s" %
                               (cmd, "".join(self.stderr_lines[-20:])))
        self.url = "http://127.0.0.1:%d" % self.port

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode(errors="replace"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
