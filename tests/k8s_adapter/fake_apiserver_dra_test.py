#!/usr/bin/python3
"""The fake apiserver's resource.k8s.io kinds (DRA, issue 26) and its
validating admission webhooks, against kube-apiserver's rules: each kind's
create/get/list/update/patch/delete and watch at the group-versions a 1.36 and
a 1.37 apiserver serve (--kube-version), DeviceTaintRule's validation, a
ResourceClaim's immutable spec and status subresource, and webhooks called
with AdmissionReview v1 over HTTPS (allow, deny, failurePolicy Fail and Ignore
on an unreachable and a slow webhook, caBundle, service references,
selectors). Plain HTTP to the fake with http.client; the webhook is a real
HTTPS server in this process."""

import base64
import http.client
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_harness as fh  # noqa: E402

MERGE = "application/merge-patch+json"
DRA = "/apis/resource.k8s.io"
CLAIMS = DRA + "/v1/namespaces/default/resourceclaims"
HOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
SVC_NAME = "duet-bridge-webhook.duet-system.svc"


def device_class(name="gpu.nvidia.com"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


def resource_slice(name="gpu-node-1-gpu.nvidia.com"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-1",
                     "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}


def claim(name="train-gpu", labels=None):
    c = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": name, "namespace": "default"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    if labels:
        c["metadata"]["labels"] = labels
    return c


def claim_template(name="train-gpu-template"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": claim()["spec"]}}


def taint_rule(version, name="duet-gpu-node-1-gpu-0", effect="NoSchedule", **selector):
    return {"apiVersion": "resource.k8s.io/" + version, "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector or {"driver": "gpu.nvidia.com", "pool": "gpu-node-1",
                                                    "device": "gpu-0"},
                     "taint": {"key": "duet.dev/slurm", "value": "held", "effect": effect}}}


ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-1",
                                       "device": "gpu-0"}]},
              "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                  {"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}]}}


def make_webhook_tls(tmp):
    """A CA and a webhook certificate for 127.0.0.1 and the service name
    kube-apiserver verifies for a service reference (name.namespace.svc)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "wca.key", "-out", "wca.crt",
        "-days", "2", "-subj", "/CN=duet-webhook-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "wh.key", "-out", "wh.csr", "-subj", "/CN=webhook")
    with open(os.path.join(tmp, "wh.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:%s\n" % SVC_NAME)
    run("x509", "-req", "-in", "wh.csr", "-CA", "wca.crt", "-CAkey", "wca.key", "-CAcreateserial",
        "-out", "wh.crt", "-days", "2", "-extfile", "wh.cnf")
    # A second CA that did not sign it: a caBundle that must not verify.
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.crt",
        "-days", "2", "-subj", "/CN=someone-else")
    return {k: os.path.join(tmp, v) for k, v in
            (("ca", "wca.crt"), ("cert", "wh.crt"), ("key", "wh.key"), ("other_ca", "other.crt"))}


class Webhook:
    """A validating admission webhook over HTTPS. `decide(request)` returns the
    response's allowed/status part; every AdmissionReview and path received is
    kept in `reviews`."""

    def __init__(self, certs):
        self.reviews = []
        self.decide = lambda req: {"allowed": True}
        self.delay = 0.0
        hook = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.reviews.append((self.path, body))
                if hook.delay:
                    time.sleep(hook.delay)
                resp = dict(hook.decide(body["request"]), uid=body["request"]["uid"])
                data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": resp}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the apiserver gave up on a slow answer

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs["cert"], certs["key"])
        self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Base:
    extra = ()

    def setUp(self):
        self.fake = fh.Fake(extra=self.extra)

    def tearDown(self):
        self.fake.close()

    def req(self, method, path, body=None, ctype="application/json"):
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=20)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        return r.status, (json.loads(text) if text else None)

    def ok(self, method, path, body=None, ctype="application/json", code=(200, 201)):
        got, obj = self.req(method, path, body, ctype)
        self.assertIn(got, code, obj)
        return obj

    def rv(self):
        return self.fake.call("/_fake/stats")["resourceVersion"]

    def kinds(self):
        """(collection path, object) of every DRA kind this fake serves."""
        out = [(DRA + "/v1/deviceclasses", device_class()),
               (DRA + "/v1/resourceslices", resource_slice()),
               (DRA + "/v1/namespaces/default/resourceclaimtemplates", claim_template()),
               (CLAIMS, claim())]
        if self.taint_version:
            out.append((DRA + "/%s/devicetaintrules" % self.taint_version, taint_rule(self.taint_version)))
        return out

    def check_crud_and_watch(self):
        for path, obj in self.kinds():
            with self.subTest(kind=obj["kind"]):
                name = obj["metadata"]["name"]
                start = self.rv()
                made = self.ok("POST", path, obj, code=(201,))
                self.assertEqual((made["apiVersion"], made["kind"]), (obj["apiVersion"], obj["kind"]))
                self.assertEqual(made["metadata"]["generation"], 1)
                self.assertEqual(self.ok("GET", path + "/" + name)["metadata"]["uid"], made["metadata"]["uid"])
                listed = self.ok("GET", path)
                self.assertEqual((listed["kind"], [i["metadata"]["name"] for i in listed["items"]]),
                                 (obj["kind"] + "List", [name]))
                made["metadata"]["labels"] = {"duet.dev/owner": "bridge"}
                put = self.ok("PUT", path + "/" + name, made)
                self.assertEqual(put["metadata"]["labels"], {"duet.dev/owner": "bridge"})
                patched = self.ok("PATCH", path + "/" + name, {"metadata": {"annotations": {"a": "b"}}}, MERGE)
                self.assertEqual(patched["metadata"]["annotations"], {"a": "b"})
                self.assertEqual(patched["metadata"]["generation"], 1)  # metadata is not spec
                self.ok("DELETE", path + "/" + name)
                self.assertEqual(self.req("GET", path + "/" + name)[0], 404)
                # A watch from before the create replays the four changes, then ends.
                conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=20)
                conn.request("GET", "%s?watch=true&resourceVersion=%d&timeoutSeconds=1" % (path, start))
                frames = [json.loads(x) for x in conn.getresponse().read().decode().splitlines() if x]
                conn.close()
                self.assertEqual([f["type"] for f in frames], ["ADDED", "MODIFIED", "MODIFIED", "DELETED"])
                self.assertEqual({f["object"]["metadata"]["name"] for f in frames}, {name})


class DefaultVersionTest(Base, unittest.TestCase):
    """No --kube-version: the fake's v1.32 surface plus the GA DRA kinds."""
    taint_version = None

    def test_ga_kinds_crud_and_watch(self):
        self.check_crud_and_watch()

    def test_discovery_has_the_ga_kinds_and_no_device_taint_rules(self):
        self.assertEqual(self.ok("GET", "/version")["gitVersion"], "v1.32.0-fake")
        group = self.ok("GET", DRA)
        self.assertEqual([v["version"] for v in group["versions"]], ["v1"])
        res = {r["name"]: r for r in self.ok("GET", DRA + "/v1")["resources"]}
        self.assertEqual(set(res), {"resourceslices", "resourceclaims", "resourceclaims/status",
                                    "resourceclaimtemplates", "deviceclasses"})
        self.assertEqual((res["resourceclaims"]["namespaced"], res["resourceslices"]["namespaced"],
                          res["deviceclasses"]["namespaced"]), (True, False, False))
        self.assertEqual(res["resourceclaims/status"]["verbs"], ["get", "patch", "update"])
        self.assertEqual(self.req("GET", DRA + "/v1/devicetaintrules")[0], 404)


class Kube136Test(Base, unittest.TestCase):
    """1.36 with DRADeviceTaints left off: no DeviceTaintRule at any version."""
    extra = ("--kube-version", "1.36")
    taint_version = None

    def test_ga_kinds_crud_and_watch(self):
        self.check_crud_and_watch()

    def test_discovery(self):
        v = self.ok("GET", "/version")
        self.assertEqual((v["gitVersion"], v["minor"]), ("v1.36.0-fake", "36"))
        self.assertEqual([x["version"] for x in self.ok("GET", DRA)["versions"]], ["v1"])
        self.assertNotIn("devicetaintrules", [r["name"] for r in self.ok("GET", DRA + "/v1")["resources"]])
        for version in ("v1", "v1beta2"):
            self.assertEqual(self.req("POST", DRA + "/%s/devicetaintrules" % version, taint_rule(version))[0], 404)


class Kube136GateTest(Base, unittest.TestCase):
    """1.36 with --feature-gates DRADeviceTaints=true: DeviceTaintRule at v1beta2."""
    extra = ("--kube-version", "1.36", "--feature-gates", "DRADeviceTaints=true")
    taint_version = "v1beta2"

    def test_all_kinds_crud_and_watch(self):
        self.check_crud_and_watch()

    def test_discovery(self):
        group = self.ok("GET", DRA)
        self.assertEqual([x["version"] for x in group["versions"]], ["v1", "v1beta2"])
        self.assertEqual(group["preferredVersion"]["version"], "v1")
        beta = {r["name"]: r for r in self.ok("GET", DRA + "/v1beta2")["resources"]}
        self.assertEqual(set(beta), {"devicetaintrules", "devicetaintrules/status"})
        self.assertEqual((beta["devicetaintrules"]["kind"], beta["devicetaintrules"]["namespaced"]),
                         ("DeviceTaintRule", False))
        self.assertNotIn("devicetaintrules", [r["name"] for r in self.ok("GET", DRA + "/v1")["resources"]])
        self.assertIn("apis/resource.k8s.io/v1beta2", self.ok("GET", "/openapi/v3")["paths"])

    def test_unknown_gate_is_refused_at_start(self):
        r = subprocess.run(["/usr/bin/python3", fh.FAKE, "--port", "0", "--kube-version", "1.36",
                            "--feature-gates", "DRADeviceTaint=true"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--feature-gates: unrecognized feature gate 'DRADeviceTaint'", r.stderr)
        r = subprocess.run(["/usr/bin/python3", fh.FAKE, "--port", "0", "--feature-gates", "DRADeviceTaints=true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--feature-gates needs --kube-version", r.stderr)


class Kube137Test(Base, unittest.TestCase):
    """1.37: DeviceTaintRule is GA at resource.k8s.io/v1."""
    extra = ("--kube-version", "1.37")
    taint_version = "v1"

    def test_all_kinds_crud_and_watch(self):
        self.check_crud_and_watch()

    def test_discovery(self):
        self.assertEqual(self.ok("GET", "/version")["gitVersion"], "v1.37.0-fake")
        self.assertEqual([x["version"] for x in self.ok("GET", DRA)["versions"]], ["v1"])
        names = [r["name"] for r in self.ok("GET", DRA + "/v1")["resources"]]
        self.assertTrue({"devicetaintrules", "devicetaintrules/status"} <= set(names), names)
        self.assertEqual(self.req("GET", DRA + "/v1beta2/devicetaintrules")[0], 404)

    # ---- DeviceTaintRule ----
    def test_device_taint_rule_validation(self):
        path = DRA + "/v1/devicetaintrules"
        code, err = self.req("POST", path, taint_rule("v1", effect="PreferNoSchedule"))
        self.assertEqual((code, err["reason"]), (422, "Invalid"), err)
        self.assertEqual(err["message"], 'DeviceTaintRule.resource.k8s.io "duet-gpu-node-1-gpu-0" is invalid: '
                         'spec.taint.effect: Unsupported value: "PreferNoSchedule": supported values: '
                         '"NoExecute", "NoSchedule", "None"')
        self.assertEqual(err["details"]["causes"], [{"reason": "FieldValueNotSupported", "field": "spec.taint.effect",
                                                     "message": err["message"].split("spec.taint.effect: ")[1]}])
        bad = taint_rule("v1")
        bad["spec"]["taint"]["key"] = "duet.dev/not a key"
        del bad["spec"]["taint"]["effect"]
        code, err = self.req("POST", path, bad)
        self.assertEqual(code, 422, err)
        self.assertEqual({c["field"] for c in err["details"]["causes"]}, {"spec.taint.key", "spec.taint.effect"})
        code, err = self.req("POST", path, taint_rule("v1", name="Not_A_Name"))
        self.assertEqual((code, err["details"]["causes"][0]["field"]), (422, "metadata.name"))
        self.assertEqual(self.ok("GET", path)["items"], [])  # nothing stored by any of them
        # Since 1.35 the selector names only driver, pool and device: a
        # deviceClassName is an unknown field (400 under Strict, else dropped).
        old_style = taint_rule("v1", deviceClassName="gpu.nvidia.com", driver="gpu.nvidia.com")
        code, err = self.req("POST", path + "?fieldValidation=Strict", old_style)
        self.assertEqual(code, 400, err)
        self.assertIn('unknown field "spec.deviceSelector.deviceClassName"', err["message"])
        made = self.ok("POST", path, old_style)
        self.assertEqual(made["spec"]["deviceSelector"], {"driver": "gpu.nvidia.com"})
        self.assertTrue(made["spec"]["taint"]["timeAdded"])  # set by the server
        for effect in ("None", "NoExecute"):
            made["spec"]["taint"]["effect"] = effect
            made = self.ok("PUT", path + "/" + made["metadata"]["name"], made)
        self.assertEqual(made["metadata"]["generation"], 3)
        # timeAdded as given is kept, and renewed when the effect changes
        # while the writer sends the old one back.
        dated = taint_rule("v1", name="dated")
        dated["spec"]["taint"]["timeAdded"] = "2020-01-01T00:00:00Z"
        dated = self.ok("POST", path, dated)
        self.assertEqual(dated["spec"]["taint"]["timeAdded"], "2020-01-01T00:00:00Z")
        dated["spec"]["taint"]["value"] = "other"
        dated = self.ok("PUT", path + "/dated", dated)
        self.assertEqual(dated["spec"]["taint"]["timeAdded"], "2020-01-01T00:00:00Z")
        dated["spec"]["taint"]["effect"] = "NoExecute"
        dated = self.ok("PUT", path + "/dated", dated)
        self.assertNotEqual(dated["spec"]["taint"]["timeAdded"], "2020-01-01T00:00:00Z")

    def test_device_taint_rule_status_only_through_the_subresource(self):
        path = DRA + "/v1/devicetaintrules"
        rule = taint_rule("v1")
        rule["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "True"}]}
        made = self.ok("POST", path, rule)
        self.assertNotIn("status", made)
        name = made["metadata"]["name"]
        cond = {"type": "EvictionInProgress", "status": "False", "reason": "NoEffect", "message": "",
                "lastTransitionTime": "2026-12-05T00:00:00Z", "observedGeneration": 1}
        got = self.ok("PATCH", path + "/" + name + "/status",
                      {"status": {"conditions": [cond]}, "spec": {"taint": {"effect": "NoExecute"}}}, MERGE)
        self.assertEqual(got["status"]["conditions"], [cond])
        self.assertEqual(got["spec"]["taint"]["effect"], "NoSchedule")  # spec is not written by /status
        got = self.ok("PATCH", path + "/" + name, {"status": {"conditions": []}}, MERGE)
        self.assertEqual(got["status"]["conditions"], [cond])  # status is not written by the main resource

    # ---- ResourceClaim ----
    def test_claim_spec_is_immutable_and_status_only_through_the_subresource(self):
        c = claim()
        c["status"] = {"allocation": ALLOCATION}
        made = self.ok("POST", CLAIMS, c, code=(201,))
        self.assertNotIn("status", made)  # dropped on create
        name = CLAIMS + "/train-gpu"
        changed = json.loads(json.dumps(made))
        changed["spec"]["devices"]["requests"][0]["name"] = "two"
        code, err = self.req("PUT", name, changed)
        self.assertEqual((code, err["reason"], err["details"]["causes"][0]["field"]), (422, "Invalid", "spec"))
        self.assertIn("field is immutable", err["message"])
        code, err = self.req("PATCH", name, {"spec": {"devices": {"requests": []}}}, MERGE)
        self.assertEqual(code, 422, err)
        # status.allocation through the main resource is ignored, as the real
        # strategy resets status on update.
        got = self.ok("PATCH", name, {"status": {"allocation": ALLOCATION}, "metadata": {"labels": {"a": "b"}}},
                      MERGE)
        self.assertNotIn("status", got)
        self.assertEqual(got["metadata"]["labels"], {"a": "b"})
        # Through /status: allocation written, spec and labels kept.
        got["status"] = {"allocation": ALLOCATION}
        got["metadata"]["labels"] = {"a": "changed"}
        got["spec"]["devices"]["requests"] = []
        got = self.ok("PUT", name + "/status", got)
        self.assertEqual(got["status"]["allocation"], ALLOCATION)
        self.assertEqual(got["metadata"]["labels"], {"a": "b"})
        self.assertEqual(len(got["spec"]["devices"]["requests"]), 1)
        self.assertEqual(self.ok("GET", name + "/status")["status"]["allocation"], ALLOCATION)
        stale = dict(got, metadata=dict(got["metadata"], resourceVersion=made["metadata"]["resourceVersion"]))
        code, err = self.req("PUT", name + "/status", stale)
        self.assertEqual((code, err["reason"]), (409, "Conflict"), err)
        # Once allocated, a different allocation is refused; clearing it is not.
        other = json.loads(json.dumps(ALLOCATION))
        other["devices"]["results"][0]["device"] = "gpu-1"
        code, err = self.req("PATCH", name + "/status", {"status": {"allocation": other}}, MERGE)
        self.assertEqual((code, err["details"]["causes"][0]["field"]), (422, "status.allocation"), err)
        code, err = self.req("PATCH", name + "/status", {"status": {
            "allocation": None, "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}, MERGE)
        self.assertEqual((code, err["details"]["causes"][0]["field"]), (422, "status.reservedFor"), err)
        self.assertNotIn("allocation", self.ok("PATCH", name + "/status", {"status": {"allocation": None}},
                                                MERGE)["status"])

    def test_status_of_a_missing_claim_is_404(self):
        body = claim("ghost")
        body["status"] = {"allocation": ALLOCATION}
        code, err = self.req("PATCH", CLAIMS + "/ghost/status?fieldManager=duet", body, "application/apply-patch+yaml")
        self.assertEqual((code, err["reason"]), (404, "NotFound"), err)
        self.assertEqual(self.ok("GET", CLAIMS)["items"], [])

    def test_claim_template_spec_is_immutable(self):
        path = DRA + "/v1/namespaces/default/resourceclaimtemplates"
        made = self.ok("POST", path, claim_template())
        code, err = self.req("PATCH", path + "/" + made["metadata"]["name"],
                             {"spec": {"spec": {"devices": {"requests": []}}}}, MERGE)
        self.assertEqual((code, err["details"]["causes"][0]["field"]), (422, "spec"), err)


class WebhookTest(Base, unittest.TestCase):
    """Validating admission webhooks on resourceclaims/status (duet's fence)."""
    extra = ("--kube-version", "1.37")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="duet-webhook-")
        cls.certs = make_webhook_tls(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.hook = Webhook(self.certs)

    def tearDown(self):
        self.hook.close()
        super().tearDown()

    def ca_bundle(self, which="ca"):
        with open(self.certs[which], "rb") as f:
            return base64.b64encode(f.read()).decode()

    def configure(self, url=None, failure="Fail", timeout=5, resources=("resourceclaims/status",),
                  operations=("UPDATE",), service=None, ca="ca", **extra):
        cc = {"caBundle": self.ca_bundle(ca)}
        if service:
            cc["service"] = service
        else:
            cc["url"] = url or "https://127.0.0.1:%d/validate" % self.hook.port
        hook = {"name": "lend.duet.dev", "clientConfig": cc, "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "failurePolicy": failure, "timeoutSeconds": timeout,
                "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "resources": list(resources),
                           "operations": list(operations)}]}
        hook.update(extra)
        return self.ok("POST", HOOKS, {"apiVersion": "admissionregistration.k8s.io/v1",
                                       "kind": "ValidatingWebhookConfiguration",
                                       "metadata": {"name": "duet-lending"}, "webhooks": [hook]})

    def allocate(self, name="train-gpu"):
        return self.req("PATCH", CLAIMS + "/" + name + "/status", {"status": {"allocation": ALLOCATION}}, MERGE)

    def test_webhook_configuration_is_validated_and_defaulted(self):
        bad = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "bad"},
               "webhooks": [{"name": "lend", "clientConfig": {"url": "http://127.0.0.1:1/"},
                             "admissionReviewVersions": ["v1"], "timeoutSeconds": 31}]}
        code, err = self.req("POST", HOOKS, bad)
        self.assertEqual(code, 422, err)
        self.assertEqual({c["field"] for c in err["details"]["causes"]},
                         {"webhooks[0].name", "webhooks[0].sideEffects", "webhooks[0].timeoutSeconds",
                          "webhooks[0].clientConfig.url"})
        self.assertEqual(self.ok("GET", HOOKS)["items"], [])
        made = self.configure(failure=None, timeout=None)  # null: defaulted as the API does
        hook = made["webhooks"][0]
        self.assertEqual((hook["failurePolicy"], hook["timeoutSeconds"], hook["matchPolicy"],
                          hook["namespaceSelector"], hook["objectSelector"], hook["rules"][0]["scope"]),
                         ("Fail", 10, "Equivalent", {}, {}, "*"))

    def test_allowed_write_sends_a_full_admission_review(self):
        self.configure()
        made = self.ok("POST", CLAIMS, claim())
        self.ok("PATCH", CLAIMS + "/train-gpu", {"metadata": {"labels": {"x": "y"}}}, MERGE)
        self.assertEqual(self.hook.reviews, [])  # the main resource does not match resourceclaims/status
        code, got = self.allocate()
        self.assertEqual(code, 200, got)
        self.assertEqual(got["status"]["allocation"], ALLOCATION)
        [(path, review)] = self.hook.reviews
        self.assertEqual(path, "/validate?timeout=5s")
        self.assertEqual((review["apiVersion"], review["kind"]), ("admission.k8s.io/v1", "AdmissionReview"))
        r = review["request"]
        self.assertTrue(r["uid"])
        self.assertEqual(r["kind"], {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"})
        self.assertEqual(r["resource"], {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"})
        self.assertEqual((r["subResource"], r["operation"], r["name"], r["namespace"], r["dryRun"]),
                         ("status", "UPDATE", "train-gpu", "default", False))
        self.assertEqual(r["object"]["status"]["allocation"], ALLOCATION)
        self.assertNotIn("status", r["oldObject"])
        self.assertEqual(r["oldObject"]["metadata"]["uid"], made["metadata"]["uid"])
        self.assertEqual(r["userInfo"]["username"], "system:admin")
        self.assertEqual(r["options"]["kind"], "UpdateOptions")

    def test_denied_write_is_refused_with_the_webhooks_message_and_changes_nothing(self):
        self.configure()
        self.hook.decide = lambda req: {"allowed": False, "status": {
            "code": 403, "reason": "Forbidden", "message": "device gpu-0 is not lent to Kubernetes"}}
        before = self.ok("POST", CLAIMS, claim())
        code, err = self.allocate()
        self.assertEqual((code, err["reason"]), (403, "Forbidden"), err)
        self.assertEqual(err["message"], 'admission webhook "lend.duet.dev" denied the request: '
                                         'device gpu-0 is not lent to Kubernetes')
        self.assertEqual(self.ok("GET", CLAIMS + "/train-gpu")["metadata"]["resourceVersion"],
                         before["metadata"]["resourceVersion"])
        # No code (or one below 400) and no message: 400, "without explanation".
        self.hook.decide = lambda req: {"allowed": False}
        code, err = self.allocate()
        self.assertEqual(code, 400, err)
        self.assertEqual(err["message"], 'admission webhook "lend.duet.dev" denied the request without explanation')

    def test_unreachable_webhook_fail_refuses_ignore_admits(self):
        url = "https://127.0.0.1:%d/validate" % free_port()
        self.configure(url=url, failure="Fail")
        self.ok("POST", CLAIMS, claim())
        code, err = self.allocate()
        self.assertEqual((code, err["reason"]), (500, "InternalError"), err)
        self.assertTrue(err["message"].startswith(
            'Internal error occurred: failed calling webhook "lend.duet.dev": failed to call webhook: Post "%s'
            '?timeout=5s"' % url), err["message"])
        self.assertIn("connection refused", err["message"])
        self.assertNotIn("status", self.ok("GET", CLAIMS + "/train-gpu"))
        self.ok("PATCH", HOOKS + "/duet-lending", [{"op": "replace", "path": "/webhooks/0/failurePolicy",
                                                    "value": "Ignore"}], "application/json-patch+json")
        code, got = self.allocate()
        self.assertEqual(code, 200, got)

    def test_slow_webhook_times_out_fail_refuses_ignore_admits(self):
        self.configure(timeout=1, failure="Fail")
        self.ok("POST", CLAIMS, claim())
        self.hook.delay = 3
        t0 = time.monotonic()
        code, err = self.allocate()
        took = time.monotonic() - t0
        self.assertEqual(code, 500, err)
        self.assertIn("context deadline exceeded", err["message"])
        self.assertLess(took, 2.5)  # timeoutSeconds, not the webhook's 3 s
        self.assertGreaterEqual(took, 0.9)
        self.ok("PATCH", HOOKS + "/duet-lending", [{"op": "replace", "path": "/webhooks/0/failurePolicy",
                                                    "value": "Ignore"}], "application/json-patch+json")
        code, got = self.allocate()
        self.assertEqual((code, got["status"]["allocation"]), (200, ALLOCATION))

    def test_ca_bundle_must_verify_the_webhook(self):
        self.configure(ca="other_ca")
        self.ok("POST", CLAIMS, claim())
        code, err = self.allocate()
        self.assertEqual(code, 500, err)
        self.assertIn("failed to verify certificate", err["message"])
        self.assertEqual(self.hook.reviews, [])

    def test_service_reference_goes_to_the_mapped_address_and_checks_the_service_name(self):
        service = {"namespace": "duet-system", "name": "duet-bridge-webhook", "port": 8443, "path": "/lend"}
        self.configure(service=service)
        self.ok("POST", CLAIMS, claim())
        code, err = self.allocate()
        self.assertEqual(code, 500, err)
        self.assertIn('service "duet-bridge-webhook" not found', err["message"])
        self.fake.call("/_fake/webhook_service", {"namespace": "duet-system", "name": "duet-bridge-webhook",
                                                  "port": 8443, "url": "https://127.0.0.1:%d" % self.hook.port})
        code, got = self.allocate()
        self.assertEqual(code, 200, got)
        self.assertEqual(self.hook.reviews[-1][0], "/lend?timeout=5s")

    def test_create_rule_and_object_selector(self):
        self.configure(resources=("resourceclaims",), operations=("CREATE",),
                       objectSelector={"matchLabels": {"duet.dev/lend": "true"}})
        self.hook.decide = lambda req: {"allowed": False, "status": {"code": 403, "message": "no"}}
        self.ok("POST", CLAIMS, claim("plain"))  # not selected: no call
        self.assertEqual(self.hook.reviews, [])
        code, err = self.req("POST", CLAIMS, claim("lent", labels={"duet.dev/lend": "true"}))
        self.assertEqual(code, 403, err)
        r = self.hook.reviews[0][1]["request"]
        self.assertEqual((r["operation"], r["oldObject"], r["options"]["kind"]), ("CREATE", None, "CreateOptions"))
        self.assertNotIn("subResource", r)

    def test_namespace_selector(self):
        self.configure(namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "ml"}})
        self.hook.decide = lambda req: {"allowed": False, "status": {"code": 403, "message": "not lent"}}
        self.ok("POST", CLAIMS, claim())
        code, got = self.allocate()  # namespace default: not selected
        self.assertEqual((code, self.hook.reviews), (200, []), got)
        self.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        ml = DRA + "/v1/namespaces/ml/resourceclaims"
        self.ok("POST", ml, dict(claim(), metadata={"name": "train-gpu", "namespace": "ml"}))
        code, err = self.req("PATCH", ml + "/train-gpu/status", {"status": {"allocation": ALLOCATION}}, MERGE)
        self.assertEqual(code, 403, err)
        self.assertEqual(self.hook.reviews[0][1]["request"]["namespace"], "ml")

    def test_dry_run_and_the_requesting_user(self):
        self.configure()
        self.fake.call("/_fake/token", {"token": "sched-token", "username": "system:kube-scheduler",
                                        "groups": ["system:authenticated"]})
        self.ok("POST", CLAIMS, claim())
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=20)
        conn.request("PATCH", CLAIMS + "/train-gpu/status?dryRun=All",
                     body=json.dumps({"status": {"allocation": ALLOCATION}}),
                     headers={"Content-Type": MERGE, "Authorization": "Bearer sched-token"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200, r.read())
        conn.close()
        req = self.hook.reviews[0][1]["request"]
        self.assertTrue(req["dryRun"])
        self.assertEqual((req["userInfo"]["username"], req["userInfo"]["groups"]),
                         ("system:kube-scheduler", ["system:authenticated"]))
        self.assertNotIn("status", self.ok("GET", CLAIMS + "/train-gpu"))  # a dry run stores nothing

    def test_webhook_may_read_from_the_apiserver_while_it_decides(self):
        # duet-bridge's webhook reads state while it admits: the fake must not
        # hold its store across the call.
        self.configure()
        self.ok("POST", CLAIMS, claim())
        seen = []

        def decide(req):
            conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=3)
            conn.request("GET", CLAIMS + "/train-gpu")
            seen.append(conn.getresponse().status)
            conn.close()
            return {"allowed": True}
        self.hook.decide = decide
        code, got = self.allocate()
        self.assertEqual((code, seen), (200, [200]), got)


if __name__ == "__main__":
    unittest.main()
