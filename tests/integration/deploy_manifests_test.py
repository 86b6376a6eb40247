#!/usr/bin/env python3
"""deploy/ checked against loom-server itself (ctest deploy_manifests).

The oracle is the server, not a list kept here: its flags come from `loom-server --helpfull`, its
probe paths and metrics from a running loom-server (fixture model) started the way the manifests
start it (the API key from the environment through --fromenv, as the Kubernetes Secret passes it).

  * every YAML file under deploy/ parses and is yamllint-clean (deploy/.yamllint);
  * every loom-server flag in a Kubernetes container, the compose file and the Dockerfiles' CMD is
    a real flag; --fromenv names a flag whose FLAGS_ variable the container sets;
  * probes: each probe's port is the container port that --port (HTTP) or --grpc_port names, its
    path answers 200 on the running server without the API key; readiness is /ready, liveness and
    startup are /health (a liveness probe on /ready would kill a draining or loading pod); the
    startup probe allows at least 10 minutes of model load; the grace period outlasts the preStop
    pause plus --drain_timeout_s; /dev/shm is memory-backed; GPUs are requested;
  * names agree: Service selectors match pod labels, Service target ports are named container
    ports, the Secret and volume claim names are the same everywhere, the ServiceMonitor selects
    the Services and scrapes a port they have, on a path the server serves;
  * the LeaderWorkerSet's groups of more than one pod pass every pod the node flags that join it
    to its group (--nnodes, --node_rank, --coordinator; issue 16), which loom-server must have;
  * compose: container ports, grace period and healthcheck agree with the flags;
  * Dockerfiles: EXPOSE matches CMD's ports, a non-root USER, tini as init, the files they copy or
    run exist, their build packages are the Makefile's DEB_PACKAGES (plus tini);
  * the Grafana dashboard queries only metric families and labels the server exports.
"""
import argparse
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

KEY = "deploy-test-key"


def repo_path(*parts):
    return os.path.join(ARGS.source, *parts)


def load_yaml(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def server_flags():
    """loom-server's flag names, from --helpfull."""
    out = subprocess.run([ARGS.server, "--helpfull"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"^\s+--([a-z0-9_]+) \(", text, re.M))
    if "model" not in flags or "port" not in flags:
        raise RuntimeError("could not read loom-server's flags from --helpfull:\n" + text[:2000])
    return flags


def flag_values(args):
    """{flag: value} of ['--a=1', '--b'] (a bare flag maps to None). Only --flag=value form."""
    values = {}
    for a in args:
        if not a.startswith("--"):
            raise AssertionError("argument %r: write loom-server flags as --flag=value" % a)
        name, _, value = a[2:].partition("=")
        values[name] = value if "=" in a else None
    return values


def pod_specs(doc):
    """(where, pod spec, pod labels) of a Deployment or a LeaderWorkerSet."""
    kind = doc["kind"]
    name = doc["metadata"]["name"]
    if kind == "Deployment":
        t = doc["spec"]["template"]
        return [("%s %s" % (kind, name), t["spec"], t["metadata"].get("labels", {}))]
    if kind == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        out = []
        for role in ("leaderTemplate", "workerTemplate"):
            if role in lwt:
                t = lwt[role]
                out.append(("%s %s %s" % (kind, name, role), t["spec"],
                            t["metadata"].get("labels", {})))
        return out
    return []


class LiveServer:
    """loom-server on the fixture model, the key from the environment (--fromenv=api_key)."""

    def __init__(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from loom_server_process import LoomServer
        os.environ["FLAGS_api_key"] = KEY
        try:
            self.server = LoomServer(ARGS.server, ARGS.model, "--fromenv=api_key")
        finally:
            del os.environ["FLAGS_api_key"]
        self.port = self.server.port

    def request(self, method, path, body=None, key=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = "Bearer " + key
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def stop(self):
        self.server.stop()


class DeployTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = server_flags()
        cls.k8s = {}
        for path in sorted(glob.glob(repo_path("deploy", "k8s", "*.yaml"))):
            cls.k8s[os.path.basename(path)] = load_yaml(path)
        cls.compose = load_yaml(repo_path("deploy", "compose", "compose.yaml"))[0]
        cls.live = LiveServer()
        # One finished request and one refused (401), so that labelled families have samples.
        status, _ = cls.live.request("POST", "/v1/completions",
                                     {"prompt": "hi", "max_tokens": 2}, key=KEY)
        assert status == 200, status
        status, _ = cls.live.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 401, status
        cls.metrics_text = cls.live.request("GET", "/metrics")[1]

    @classmethod
    def tearDownClass(cls):
        cls.live.stop()

    def docs(self, kind):
        return [(f, d) for f, ds in self.k8s.items() for d in ds if d["kind"] == kind]

    def containers(self):
        """(where, container, pod spec, pod labels) of every loom-server container."""
        out = []
        for f, ds in self.k8s.items():
            for d in ds:
                for where, spec, labels in pod_specs(d):
                    for c in spec["containers"]:
                        out.append(("%s: %s" % (f, where), c, spec, labels))
        self.assertTrue(out)
        return out

    def check_flags(self, where, args):
        values = flag_values(args)
        for name in values:
            self.assertIn(name, self.flags, "%s: --%s is not a loom-server flag" % (where, name))
        return values

    # -- files ---------------------------------------------------------------------------------

    def test_yaml_parses_and_is_lint_clean(self):
        files = glob.glob(repo_path("deploy", "**", "*.yaml"), recursive=True)
        self.assertGreaterEqual(len(files), 4)
        for path in files:
            load_yaml(path)
        yamllint = shutil.which("yamllint")
        self.assertIsNotNone(yamllint, "yamllint missing: apt-get install yamllint (Makefile)")
        out = subprocess.run([yamllint, "-s", "-c", repo_path("deploy", ".yamllint"),
                              repo_path("deploy")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    # -- Kubernetes ----------------------------------------------------------------------------

    def test_container_flags_are_real(self):
        for where, c, _, _ in self.containers():
            values = self.check_flags(where, c.get("command", []) + c.get("args", []))
            env = {e["name"]: e for e in c.get("env", [])}
            if "fromenv" in values:
                for name in values["fromenv"].split(","):
                    self.assertIn(name, self.flags, where)
                    self.assertIn("FLAGS_" + name, env, "%s: --fromenv=%s without FLAGS_%s"
                                  % (where, name, name))
            # A key on the command line would show in the pod spec and in ps.
            self.assertNotIn("api_key", values, where)

    def test_probes_hit_real_paths_and_ports(self):
        for where, c, spec, _ in self.containers():
            values = flag_values(c.get("args", []))
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            self.assertEqual(ports.get("http"), int(values["port"]), where)
            if "grpc_port" in values:
                self.assertEqual(ports.get("grpc"), int(values["grpc_port"]), where)
            self.assertIn("startupProbe", c, where)
            self.assertIn("livenessProbe", c, where)
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(kind)
                if probe is None:
                    continue
                get = probe["httpGet"]
                port = get["port"]
                port = ports[port] if isinstance(port, str) else port
                self.assertEqual(port, int(values["port"]), "%s %s: not the HTTP port" % (where, kind))
                # The running server answers the path without the key.
                status, body = self.live.request("GET", get["path"])
                self.assertEqual(status, 200, "%s %s %s: %s" % (where, kind, get["path"], body))
                want = "/ready" if kind == "readinessProbe" else "/health"
                self.assertEqual(get["path"], want, "%s %s" % (where, kind))
            startup = c["startupProbe"]
            self.assertGreaterEqual(startup["periodSeconds"] * startup["failureThreshold"], 600,
                                    "%s: the startup probe must allow a long model load" % where)
            # Grace: the preStop pause, the drain, and the exit after it.
            pause = 0
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            if pre:
                self.assertEqual(pre[0], "/bin/sleep", where)
                pause = float(pre[1])
            drain = float(values.get("drain_timeout_s") or 30)
            self.assertGreater(spec["terminationGracePeriodSeconds"], pause + drain + 2, where)
            # Memory-backed /dev/shm, GPUs requested and limited, not root.
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            self.assertIn("/dev/shm", mounts, where)
            vols = {v["name"]: v for v in spec["volumes"]}
            self.assertEqual(vols[mounts["/dev/shm"]]["emptyDir"]["medium"], "Memory", where)
            self.assertGreaterEqual(int(c["resources"]["limits"]["nvidia.com/gpu"]), 1, where)
            self.assertEqual(values.get("device"), "cuda", where)
            self.assertTrue(spec["securityContext"]["runAsNonRoot"], where)

    def test_names_agree(self):
        services = self.docs("Service")
        self.assertTrue(services)
        pods = [(w, spec, labels, c) for w, c, spec, labels in self.containers()]
        secrets, claims = set(), set()
        for where, spec, labels, c in pods:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secrets.add((ref["name"], ref["key"]))
            for v in spec["volumes"]:
                if "persistentVolumeClaim" in v:
                    claims.add(v["persistentVolumeClaim"]["claimName"])
            for m in c["volumeMounts"]:
                self.assertIn(m["name"], {v["name"] for v in spec["volumes"]}, where)
        self.assertEqual(secrets, {("loom-api-key", "api-key")})
        self.assertEqual(claims, {"loom-models"})
        for f, svc in services:
            sel = svc["spec"]["selector"]
            matched = [(w, c) for w, spec, labels, c in pods
                       if all(labels.get(k) == v for k, v in sel.items())]
            self.assertTrue(matched, "%s: Service %s selects no pod" % (f, svc["metadata"]["name"]))
            for w, c in matched:
                names = {p["name"] for p in c["ports"]}
                for p in svc["spec"]["ports"]:
                    self.assertIn(p["targetPort"], names, "%s: %s" % (f, p))
        # The ServiceMonitor selects the Services and scrapes a port they have, on a real path.
        (f, sm), = self.docs("ServiceMonitor")
        exprs = sm["spec"]["selector"]["matchExpressions"]
        selected = [svc for _, svc in services
                    if all(svc["metadata"]["labels"].get(e["key"]) in e["values"] for e in exprs)]
        self.assertEqual(len(selected), len(services))
        for ep in sm["spec"]["endpoints"]:
            for svc in selected:
                self.assertIn(ep["port"], {p["name"] for p in svc["spec"]["ports"]})
            status, body = self.live.request("GET", ep["path"])
            self.assertEqual(status, 200)
            self.assertIn("loom_engine_steps_total", body)

    def test_leader_worker_set_joins_its_pods(self):
        (f, lws), = self.docs("LeaderWorkerSet")
        lwt = lws["spec"]["leaderWorkerTemplate"]
        self.assertEqual(lwt["restartPolicy"], "RecreateGroupOnPodRestart")
        self.assertIn("expert_parallel", self.flags)
        node_flags = ("nnodes", "node_rank", "coordinator")
        for flag in node_flags:
            self.assertIn(flag, self.flags)
        # A group of several pods is one set of ranks only if every pod is told its node.
        if lwt["size"] > 1:
            for template in ("leaderTemplate", "workerTemplate"):
                text = json.dumps(lwt.get(template, {}))
                for flag in node_flags:
                    self.assertIn("--" + flag, text, "%s: %s lacks --%s" % (f, template, flag))

    # -- compose and images --------------------------------------------------------------------

    def test_compose(self):
        for name, svc in self.compose["services"].items():
            args = [re.sub(r"\$\{([A-Z_]+):-([^}]*)\}", r"\2", a) for a in svc["command"]]
            values = self.check_flags("compose " + name, args)
            for flag, default in (("port", None), ("grpc_port", None)):
                published = [p.split(":")[-1] for p in svc["ports"]]
                self.assertIn(values[flag], published, "compose %s: --%s" % (name, flag))
            grace = float(svc["stop_grace_period"].rstrip("s"))
            self.assertGreater(grace, float(values["drain_timeout_s"]) + 2, name)
            test = " ".join(svc["healthcheck"]["test"])
            self.assertIn("/dev/tcp/127.0.0.1/%s" % values["port"], test)
            self.assertIn("GET /ready ", test)
            self.assertIn("FLAGS_api_key", svc["environment"])
            self.assertEqual(values.get("fromenv"), "api_key")
            if values.get("model", "").startswith("/opt/loom/models/default"):
                self.assertTrue(os.path.exists(repo_path("weights", "default", "config.json")))

    def test_dockerfiles(self):
        with open(repo_path("Makefile")) as f:
            make = f.read()
        deb = set(re.search(r"DEB_PACKAGES :=((?:.*\\\n)*.*)", make).group(1)
                  .replace("\\\n", " ").split())
        for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
            path = repo_path("deploy", "docker", name)
            with open(path) as f:
                text = f.read()
            joined = text.replace("\\\n", " ")
            self.assertTrue(os.path.exists(path + ".dockerignore"), name)
            cmd = json.loads(re.search(r"^CMD (\[.*\])$", joined, re.M).group(1))
            values = self.check_flags(name, cmd)
            expose = re.search(r"^EXPOSE (.*)$", joined, re.M).group(1).split()
            self.assertEqual(sorted(expose), sorted([values["port"], values["grpc_port"]]), name)
            self.assertEqual(values["host"], "0.0.0.0", name)
            model_dir = values["model"]
            self.assertIn("-t %s weights/default/config.json weights/default/model.safetensors"
                          % model_dir.replace("/opt/loom", "/out"),
                          re.sub(r"\s+", " ", joined), name)
            users = re.findall(r"^USER (\S+)$", joined, re.M)
            self.assertTrue(users and all(not u.startswith(("0", "root")) for u in users), name)
            self.assertIn('ENTRYPOINT ["/opt/loom/bin/tini", "-g", "--", "/opt/loom/bin/loom-server"]',
                          joined, name)
            for ref in ("weights/default/config.json", "weights/default/model.safetensors",
                        "deploy/docker/collect-libs.sh"):
                self.assertIn(ref, joined, name)
                self.assertTrue(os.path.exists(repo_path(ref)), ref)
            # The build stage installs what `make deps` installs for the build (and tini).
            build = joined.split(" AS build", 1)[1].split("\nFROM ", 1)[0]
            pkgs = re.search(r"--no-install-recommends (.*?) &&", build).group(1).split()
            extra = set(pkgs) - deb - {"tini"}
            self.assertFalse(extra, "%s: build packages not in the Makefile's DEB_PACKAGES: %s"
                             % (name, extra))

    # -- dashboard -----------------------------------------------------------------------------

    def test_dashboard_metrics_exist(self):
        with open(repo_path("deploy", "monitoring", "grafana-loom.json")) as f:
            dash = json.load(f)
        families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", self.metrics_text, re.M))
        self.assertIn("loom_engine_steps_total", families)
        samples = {}
        for line in self.metrics_text.splitlines():
            m = re.match(r"^([a-z_:]+)(\{[^}]*\})? ", line)
            if m:
                samples.setdefault(m.group(1), set()).update(
                    re.findall(r"([a-z_]+)=", m.group(2) or ""))
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        self.assertGreaterEqual(len(exprs), 10)
        used = set()
        for expr in exprs:
            for name in re.findall(r"\b(loom_[a-z_]+)", expr):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if base != name:
                    self.assertEqual(families.get(base), "histogram", expr)
                else:
                    self.assertIn(name, families, "%s is not exported: %s" % (name, expr))
                self.assertIn(name, samples, expr)
                for label in re.findall(r"by \(([a-z_, ]+)\)", expr):
                    for l in label.split(","):
                        l = l.strip()
                        if l != "le":
                            self.assertIn(l, samples[name], "%s has no label %s" % (name, l))
                used.add(base)
        # Every family the server exports is on the dashboard.
        self.assertEqual(set(families) - used, set())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True, help="a fixture model to start loom-server on")
    ap.add_argument("--source", required=True, help="the repository root")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
