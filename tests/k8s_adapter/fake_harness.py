"""Starts tests/fakes/fake_apiserver.py on port 0 and drives its control API.

Shared by the Python tests in this folder; stdlib only.
"""

import copy
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "..", "fakes", "fake_apiserver.py")
TESTDATA = os.path.join(HERE, "testdata")


def load(name):
    with open(os.path.join(TESTDATA, name)) as f:
        return json.load(f)


def make_tls(tmp):
    """A CA and a server certificate for 127.0.0.1, made with openssl."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=duet-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    with open(os.path.join(tmp, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")
    return {k: os.path.join(tmp, v) for k, v in
            (("ca", "ca.crt"), ("cert", "server.crt"), ("key", "server.key"))}


class Fake:
    def __init__(self, tls=None, token=None, extra=()):
        args = [sys.executable if sys.executable else "/usr/bin/python3", FAKE, "--port", "0", "--parent-pid", str(os.getpid())]
        if tls:
            args += ["--tls-cert", tls["cert"], "--tls-key", tls["key"]]
        if token:
            args += ["--token", token]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError("fake apiserver did not start: %r" % line)
        self.port = int(line.split()[1])
        self.scheme = "https" if tls else "http"
        self.url = "%s://127.0.0.1:%d" % (self.scheme, self.port)
        self.ctx = None
        if tls:
            self.ctx = ssl.create_default_context(cafile=tls["ca"])
        self.token = token

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def call(self, path, body=None, method=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data,
                                     method=method or ("POST" if data is not None else "GET"))
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
            return json.loads(r.read().decode())

    def put(self, obj):
        return self.call("/_fake/put", obj)

    def delete(self, kind, name, namespace="default"):
        return self.call("/_fake/delete", {"kind": kind, "name": name, "namespace": namespace})

    def requests(self):
        return self.call("/_fake/requests")

    def wait_watches(self, n, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            if self.call("/_fake/stats")["watches"] >= n:
                return
            time.sleep(0.05)
        raise AssertionError("no %d watches open" % n)


def node(template, name, **labels):
    n = copy.deepcopy(load(template))
    n["metadata"]["name"] = name
    n["metadata"]["labels"]["kubernetes.io/hostname"] = name
    for k in ("uid", "resourceVersion", "creationTimestamp"):
        n["metadata"].pop(k, None)
    n["metadata"]["labels"].update(labels)
    return n


def pod(name, namespace="default", node_name=None, gpus=1):
    p = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "trainer"}},
        "spec": {
            "schedulerName": "duet",
            "containers": [{
                "name": "main", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                              "requests": {"nvidia.com/gpu": str(gpus)}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }
    if node_name:
        p["spec"]["nodeName"] = node_name
    return p
