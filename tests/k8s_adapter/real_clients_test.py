#!/usr/bin/python3
"""The fake apiserver against real clients: kubectl v1.32 and Debian's
python3-kubernetes (which rejects objects missing required fields, so it also
validates the golden object shapes). The resource.k8s.io kinds (DRA) are
checked with kubectl and, as python3-kubernetes 22.6 has no models of them,
with its discovery-driven dynamic client. Each kubectl call gets a fresh cache dir
so discovery is exercised every time."""

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_harness as fh  # noqa: E402

import kubernetes  # noqa: E402  (python3-kubernetes, run under /usr/bin/python3)
from kubernetes import client, dynamic, watch  # noqa: E402

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
POD_YAML = """apiVersion: v1
kind: Pod
metadata: {name: infer-0, namespace: default, labels: {app: infer}}
spec:
  schedulerName: duet
  containers:
  - name: server
    image: registry.example/server:v1
    resources:
      limits: {nvidia.com/gpu: 2}
"""
SIDECAR_YAML = """  - name: sidecar
    image: busybox
"""
# The resource.k8s.io kinds duet's DRA lending mode uses (issue 26), as an
# operator would apply them; {taint_version} and {effect} are filled in.
DRA_YAML = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: gpu.nvidia.com}}
spec:
  selectors:
  - cel: {{expression: "device.driver == 'gpu.nvidia.com'"}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: gpu-node-1-gpu}}
spec:
  driver: gpu.nvidia.com
  nodeName: gpu-node-1
  pool: {{name: gpu-node-1, generation: 1, resourceSliceCount: 1}}
  devices: [{{name: gpu-0}}, {{name: gpu-1}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: one-gpu, namespace: default}}
spec:
  spec:
    devices:
      requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com}}}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: train-gpu, namespace: default}}
spec:
  devices:
    requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com}}}}]
---
apiVersion: resource.k8s.io/{taint_version}
kind: DeviceTaintRule
metadata: {{name: duet-gpu-node-1-gpu-0}}
spec:
  deviceSelector: {{driver: gpu.nvidia.com, pool: gpu-node-1, device: gpu-0}}
  taint: {{key: duet.dev/slurm, value: held, effect: {effect}}}
"""


class Base:
    tls = False

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="duet-k8s-")
        self.token = "duet-test-token" if self.tls else None
        self.certs = fh.make_tls(self.tmp) if self.tls else None
        self.fake = fh.Fake(tls=self.certs, token=self.token)
        self.fake.put(fh.node("gke_a3_h100_node.json", "gpu-node-1"))
        self.fake.put(fh.node("gke_ct5lp_tpu_node.json", "tpu-node-1"))
        self.fake.put(fh.pod("trainer-0"))

    def tearDown(self):
        self.fake.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kubectl_args(self, *args):
        cache = tempfile.mkdtemp(dir=self.tmp, prefix="kc-cache-")
        out = [KUBECTL, "--server=" + self.fake.url, "--cache-dir=" + cache, "--request-timeout=10s"]
        if self.tls:
            out += ["--certificate-authority=" + self.certs["ca"], "--token=" + self.token]
        return out + list(args)

    def kubectl(self, *args):
        env = dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp)
        r = subprocess.run(self.kubectl_args(*args), env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def api(self):
        cfg = client.Configuration()
        cfg.host = self.fake.url
        if self.tls:
            cfg.ssl_ca_cert = self.certs["ca"]
            cfg.api_key = {"authorization": "Bearer " + self.token}
        return client.ApiClient(cfg)

    # ---- kubectl ----
    def test_kubectl_get_nodes(self):
        out = self.kubectl("get", "nodes")
        self.assertIn("NAME", out)
        self.assertIn("gpu-node-1", out)
        self.assertIn("tpu-node-1", out)
        self.assertIn("tpu-node-1", self.kubectl("get", "no", "-o", "name"))
        self.assertIn("nvidia-h100-80gb",
                      self.kubectl("get", "node", "gpu-node-1", "-o",
                                   "jsonpath={.metadata.labels.cloud\\.google\\.com/gke-accelerator}"))
        paths = [r["path"].split("?")[0] for r in self.fake.requests()]
        full = [r["path"] for r in self.fake.requests()]
        self.assertIn("/api/v1", paths)
        self.assertTrue(any(p.startswith("/api/v1/nodes?limit=500") for p in full), full)
        if self.tls:
            self.assertTrue(all(r["auth"] == "Bearer " + self.token for r in self.fake.requests()))

    def test_kubectl_cordon_uncordon_delete(self):
        self.assertIn("cordoned", self.kubectl("cordon", "gpu-node-1"))
        self.assertEqual(self.kubectl("get", "node", "gpu-node-1", "-o", "jsonpath={.spec.unschedulable}"), "true")
        patches = [r for r in self.fake.requests() if r["method"] == "PATCH"]
        self.assertEqual(patches[-1]["content_type"], "application/strategic-merge-patch+json")
        self.kubectl("uncordon", "gpu-node-1")
        self.assertEqual(self.kubectl("get", "node", "gpu-node-1", "-o", "jsonpath={.spec.unschedulable}"), "")
        self.assertIn("deleted", self.kubectl("delete", "node", "gpu-node-1"))
        self.assertEqual(self.kubectl("get", "nodes", "-o", "name").split(), ["node/tpu-node-1"])

    def test_kubectl_label_selector(self):
        out = self.kubectl("get", "nodes", "-l", "cloud.google.com/gke-nodepool=shared-v5e", "-o", "name")
        self.assertEqual(out.split(), ["node/tpu-node-1"])

    def test_kubectl_get_pods_watch_only(self):
        env = dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp)
        proc = subprocess.Popen(self.kubectl_args("get", "pods", "--watch-only", "-o", "name"),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.fake.wait_watches(1)
            self.fake.put(fh.pod("trainer-1"))
            self.fake.delete("Pod", "trainer-0")
            lines = []
            end = time.time() + 10
            while len(lines) < 2 and time.time() < end:
                r, _, _ = select.select([proc.stdout], [], [], 0.5)
                if r:
                    lines.append(proc.stdout.readline().strip())
            self.assertEqual(lines, ["pod/trainer-1", "pod/trainer-0"])
            watch_reqs = [r["path"] for r in self.fake.requests() if "watch=true" in r["path"]]
            self.assertTrue(watch_reqs and "resourceVersion=" in watch_reqs[0], watch_reqs)
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_kubectl_create_apply_validate_against_openapi(self):
        # No --validate=false: kubectl reads /openapi/v3, sees fieldValidation
        # and leaves validation to the server.
        pod = self.write("pod.yaml", POD_YAML)
        self.assertIn("pod/infer-0 created", self.kubectl("create", "-f", pod))
        posts = [r for r in self.fake.requests() if r["method"] == "POST"]
        self.assertIn("fieldValidation=Strict", posts[-1]["path"])
        self.assertIn("/openapi/v3", [r["path"].split("?")[0] for r in self.fake.requests()])
        bad = self.write("bad.yaml", POD_YAML.replace("infer-0", "infer-1").replace("image:", "imagee:"))
        r = subprocess.run(self.kubectl_args("create", "-f", bad), capture_output=True, text=True,
                           env=dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp), timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('strict decoding error: unknown field "spec.containers[0].imagee"', r.stderr)

        # Client-side apply: create, then a strategic merge patch with kubectl's directives.
        two = self.write("two.yaml", POD_YAML.replace("infer-0", "infer-2") + SIDECAR_YAML)
        self.assertIn("created", self.kubectl("apply", "-f", two))
        self.write("two.yaml", POD_YAML.replace("infer-0", "infer-2").replace("server:v1", "server:v2")
                   + SIDECAR_YAML)
        self.assertIn("configured", self.kubectl("apply", "-f", two))
        images = self.kubectl("get", "pod", "infer-2", "-o", "jsonpath={.spec.containers[*].image}")
        self.assertEqual(images.split(), ["registry.example/server:v2", "busybox"])
        patches = [r for r in self.fake.requests() if r["method"] == "PATCH"]
        self.assertEqual(patches[-1]["content_type"], "application/strategic-merge-patch+json")
        self.assertIn("$setElementOrder/containers", patches[-1]["body"])

        # Server-side apply.
        self.assertIn("serverside-applied", self.kubectl("apply", "--server-side", "-f", pod))
        self.assertIn("kubectl", self.kubectl("get", "pod", "infer-0", "-o",
                                              "jsonpath={.metadata.managedFields[*].manager}").split())

    def test_kubectl_namespaces_events_leases_graceful_delete(self):
        # kubectl's typed commands send protobuf; the fake decodes a Namespace.
        self.assertIn("namespace/ml created", self.kubectl("create", "namespace", "ml"))
        posts = [r for r in self.fake.requests() if r["method"] == "POST"]
        self.assertEqual(posts[-1]["content_type"], "application/vnd.kubernetes.protobuf")
        self.assertEqual(self.kubectl("get", "ns", "ml", "-o", "jsonpath={.status.phase}"), "Active")
        ns = self.write("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml2}\n")
        self.assertIn("namespace/ml2 created", self.kubectl("create", "-f", ns))
        self.assertIn('namespace "ml2" deleted', self.kubectl("delete", "-f", ns))
        # Other typed commands get a clear 415 (tests/fakes/README.md).
        r = subprocess.run(self.kubectl_args("create", "priorityclass", "p", "--value=1"), capture_output=True,
                           text=True, env=dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp), timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(self.kubectl("get", "ns", "-o", "name").split(),
                         ["namespace/default", "namespace/kube-node-lease", "namespace/kube-public",
                          "namespace/kube-system", "namespace/ml"])
        self.fake.put({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                       "metadata": {"name": "duet-bridge", "namespace": "ml"},
                       "spec": {"holderIdentity": "duet-bridge-0"}})
        self.fake.put({"kind": "Event", "apiVersion": "events.k8s.io/v1",
                       "metadata": {"name": "e1", "namespace": "ml"}, "reason": "DuetRefused",
                       "note": "no free GPU", "type": "Warning", "action": "Scheduling",
                       "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "duet.dev/bridge",
                       "reportingInstance": "b-0", "regarding": {"kind": "Pod", "name": "p", "namespace": "ml"}})
        self.assertEqual(self.kubectl("get", "leases", "-A", "-o", "jsonpath={.items[*].spec.holderIdentity}"),
                         "duet-bridge-0")
        self.assertEqual(self.kubectl("get", "events.events.k8s.io", "-A", "-o", "jsonpath={.items[*].note}"),
                         "no free GPU")
        self.fake.put(fh.pod("bound-0", node_name="gpu-node-1"))
        self.assertIn("deleted", self.kubectl("delete", "pod", "bound-0", "--wait=false"))
        self.assertEqual(self.kubectl("get", "pod", "bound-0", "-o", "jsonpath={.metadata.deletionGracePeriodSeconds}"),
                         "30")
        self.kubectl("delete", "pod", "bound-0", "--grace-period=0", "--force")
        r = subprocess.run(self.kubectl_args("get", "pod", "bound-0"), capture_output=True, text=True,
                           env=dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp), timeout=30)
        self.assertIn('pods "bound-0" not found', r.stderr)

    def budgeted_pods(self, names, allowed):
        """Running, Ready pods on gpu-node-1 (1 s grace) under a budget over
        app=trainer with `allowed` disruptions."""
        for name in names:
            p = fh.pod(name, node_name="gpu-node-1")
            p["spec"]["terminationGracePeriodSeconds"] = 1
            p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            self.fake.put(p)
        self.put_budget(allowed, len(names))

    def put_budget(self, allowed, healthy):
        """The budget as the disruption controller would write it."""
        self.fake.put({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                       "metadata": {"name": "trainers", "namespace": "default"},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
                       "status": {"disruptionsAllowed": allowed, "currentHealthy": healthy,
                                  "desiredHealthy": healthy - allowed, "expectedPods": healthy,
                                  "observedGeneration": 0}})

    def test_kubectl_drain_waits_for_the_disruption_budget(self):
        self.fake.delete("Pod", "trainer-0")
        self.budgeted_pods(["p0", "p1"], 1)
        # One eviction passes, the other gets 429s until drain's timeout.
        r = subprocess.run(self.kubectl_args("drain", "gpu-node-1", "--force", "--timeout=3s"),
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp))
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("Cannot evict pod as it would violate the pod's disruption budget", r.stderr)
        left = self.kubectl("get", "pods", "-o", "name").split()
        self.assertEqual(len(left), 1, left)
        evictions = [q for q in self.fake.requests() if q["path"].split("?")[0].endswith("/eviction")]
        self.assertEqual({q["content_type"] for q in evictions}, {"application/json"})  # not protobuf
        # The disruption controller (the test here) gives one more: drain ends.
        self.put_budget(1, 1)
        self.assertIn("drained", self.kubectl("drain", "gpu-node-1", "--force", "--timeout=20s"))
        self.assertEqual(self.kubectl("get", "pods", "-o", "name"), "")

    # ---- resource.k8s.io (DRA) ----
    def other_fake(self, *extra):
        """Serves this test from a second fake started with `extra` (e.g. a
        --kube-version); the first one is closed by tearDown as usual."""
        first = self.fake
        self.fake = fh.Fake(tls=self.certs, token=self.token, extra=extra)
        self.addCleanup(self.fake.close)
        first.close()

    def kubectl_fails(self, *args):
        r = subprocess.run(self.kubectl_args(*args), env=dict(os.environ, KUBECONFIG="/dev/null", HOME=self.tmp),
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        return r.stderr

    def test_kubectl_get_and_apply_dra_kinds_at_1_37(self):
        self.other_fake("--kube-version", "1.37")
        manifest = self.write("dra.yaml", DRA_YAML.format(taint_version="v1", effect="NoSchedule"))
        out = self.kubectl("apply", "-f", manifest)
        for what in ("deviceclass.resource.k8s.io/gpu.nvidia.com", "resourceslice.resource.k8s.io/gpu-node-1-gpu",
                     "resourceclaimtemplate.resource.k8s.io/one-gpu", "resourceclaim.resource.k8s.io/train-gpu",
                     "devicetaintrule.resource.k8s.io/duet-gpu-node-1-gpu-0"):
            self.assertIn(what + " created", out)
        self.assertEqual(self.kubectl("get", "deviceclasses,resourceslices,resourceclaimtemplates,resourceclaims,"
                                      "devicetaintrules", "-o", "name").split(),
                         ["deviceclass.resource.k8s.io/gpu.nvidia.com", "resourceslice.resource.k8s.io/gpu-node-1-gpu",
                          "resourceclaimtemplate.resource.k8s.io/one-gpu", "resourceclaim.resource.k8s.io/train-gpu",
                          "devicetaintrule.resource.k8s.io/duet-gpu-node-1-gpu-0"])
        self.assertIn("train-gpu", self.kubectl("get", "resourceclaims", "-A"))
        # Client-side apply patches only what changed; server-side apply too.
        self.write("dra.yaml", DRA_YAML.format(taint_version="v1", effect="NoExecute"))
        out = self.kubectl("apply", "-f", manifest)
        self.assertIn("devicetaintrule.resource.k8s.io/duet-gpu-node-1-gpu-0 configured", out)
        self.assertIn("resourceclaim.resource.k8s.io/train-gpu unchanged", out)
        self.assertEqual(self.kubectl("get", "devicetaintrule", "duet-gpu-node-1-gpu-0", "-o",
                                      "jsonpath={.spec.taint.effect}"), "NoExecute")
        self.assertIn("serverside-applied", self.kubectl("apply", "--server-side", "-f", manifest))
        # The server's validation reaches kubectl's user.
        self.write("dra.yaml", DRA_YAML.format(taint_version="v1", effect="PreferNoSchedule"))
        err = self.kubectl_fails("apply", "-f", manifest)
        self.assertIn('spec.taint.effect: Unsupported value: "PreferNoSchedule"', err)
        self.assertEqual(self.kubectl("get", "devicetaintrule", "duet-gpu-node-1-gpu-0", "-o",
                                      "jsonpath={.spec.taint.effect}"), "NoExecute")

    def test_kubectl_device_taint_rules_at_1_36(self):
        manifest = self.write("dra.yaml", DRA_YAML.format(taint_version="v1beta2", effect="NoSchedule"))
        self.other_fake("--kube-version", "1.36")
        self.kubectl_fails("apply", "-f", manifest)  # kubectl finds no v1beta2 (its wording varies by path)
        self.assertIn('the server doesn\'t have a resource type "devicetaintrules"',
                      self.kubectl_fails("get", "devicetaintrules"))
        self.assertFalse([r for r in self.fake.requests() if "devicetaintrules" in r["path"] and r["method"] != "GET"])
        self.other_fake("--kube-version", "1.36", "--feature-gates", "DRADeviceTaints=true")
        self.assertIn("devicetaintrule.resource.k8s.io/duet-gpu-node-1-gpu-0 created",
                      self.kubectl("apply", "-f", manifest))
        self.assertEqual(self.kubectl("get", "devicetaintrules.v1beta2.resource.k8s.io", "-o",
                                      "jsonpath={.items[*].spec.taint.key}"), "duet.dev/slurm")

    def test_python_dra_kinds_through_the_dynamic_client(self):
        # python3-kubernetes (Debian's 22.6) has no resource.k8s.io models, so
        # its typed API cannot reach these kinds; the dynamic client, which
        # works from discovery, can.
        self.assertFalse(hasattr(client, "ResourceV1Api"))
        self.other_fake("--kube-version", "1.37")
        dyn = dynamic.DynamicClient(self.api())
        claims = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        self.assertTrue(claims.namespaced)
        claims.create(namespace="default", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "train-gpu"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
        allocation = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-1",
                                               "device": "gpu-0"}]}}
        got = claims.status.patch(namespace="default", name="train-gpu", body={"status": {"allocation": allocation}},
                                  content_type="application/merge-patch+json")
        self.assertEqual(got.status.allocation.devices.results[0].device, "gpu-0")
        self.assertEqual([c.metadata.name for c in claims.get(namespace="default").items], ["train-gpu"])
        rules = dyn.resources.get(api_version="resource.k8s.io/v1", kind="DeviceTaintRule")
        self.assertFalse(rules.namespaced)
        rules.create(body={"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                           "metadata": {"name": "duet-gpu-0"},
                           "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "device": "gpu-0"},
                                    "taint": {"key": "duet.dev/slurm", "effect": "NoSchedule"}}})
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            rules.patch(name="duet-gpu-0", body={"spec": {"taint": {"effect": "Bogus"}}},
                        content_type="application/merge-patch+json")
        self.assertEqual(e.exception.status, 422)
        self.assertEqual(json.loads(e.exception.body)["details"]["causes"][0]["field"], "spec.taint.effect")
        for kind in ("ResourceSlice", "ResourceClaimTemplate", "DeviceClass"):
            self.assertEqual(dyn.resources.get(api_version="resource.k8s.io/v1", kind=kind).get().items, [])

    def test_python_validating_webhook_configuration(self):
        adm = client.AdmissionregistrationV1Api(self.api())
        hook = client.V1ValidatingWebhook(
            name="lend.duet.dev", admission_review_versions=["v1"], side_effects="None",
            client_config=client.AdmissionregistrationV1WebhookClientConfig(
                service=client.AdmissionregistrationV1ServiceReference(namespace="duet-system", name="duet-bridge",
                                                                       path="/lend")),
            rules=[client.V1RuleWithOperations(api_groups=["resource.k8s.io"], api_versions=["v1"],
                                               resources=["resourceclaims/status"], operations=["UPDATE"])])
        made = adm.create_validating_webhook_configuration(client.V1ValidatingWebhookConfiguration(
            metadata=client.V1ObjectMeta(name="duet-lending"), webhooks=[hook]))
        got = made.webhooks[0]  # defaulted by the server, as kube-apiserver does
        self.assertEqual((got.failure_policy, got.timeout_seconds, got.match_policy, got.client_config.service.port),
                         ("Fail", 10, "Equivalent", 443))
        self.assertEqual([c.metadata.name for c in adm.list_validating_webhook_configuration().items],
                         ["duet-lending"])
        hook.side_effects = "Some"
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            adm.create_validating_webhook_configuration(client.V1ValidatingWebhookConfiguration(
                metadata=client.V1ObjectMeta(name="bad"), webhooks=[hook]))
        self.assertEqual(e.exception.status, 422)

    # ---- python3-kubernetes ----
    def test_python_eviction_and_disruption_budget(self):
        api = self.api()
        v1, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
        self.fake.delete("Pod", "trainer-0")
        self.budgeted_pods(["p0", "p1"], 1)
        pdb = policy.read_namespaced_pod_disruption_budget("trainers", "default")  # full deserialization
        self.assertEqual(pdb.status.disruptions_allowed, 1)

        def evict(name):  # the reply is a Status: its HTTP code is what tells
            return v1.create_namespaced_pod_eviction_with_http_info(name, "default", client.V1Eviction(
                metadata=client.V1ObjectMeta(name=name, namespace="default"),
                delete_options=client.V1DeleteOptions(grace_period_seconds=0)))[1]
        self.assertEqual(evict("p0"), 201)
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            v1.read_namespaced_pod("p0", "default")
        self.assertEqual(e.exception.status, 404)
        pdb = policy.read_namespaced_pod_disruption_budget("trainers", "default")
        self.assertEqual(pdb.status.disruptions_allowed, 0)
        self.assertIn("p0", pdb.status.disrupted_pods)
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            evict("p1")
        self.assertEqual(e.exception.status, 429)
        [cause] = json.loads(e.exception.body)["details"]["causes"]
        self.assertEqual(cause["reason"], "DisruptionBudget")
        self.assertEqual(v1.read_namespaced_pod("p1", "default").metadata.deletion_timestamp, None)

    def test_python_json_patch_and_future_watch(self):
        v1 = client.CoreV1Api(self.api())
        p = v1.patch_namespaced_pod("trainer-0", "default", [
            {"op": "add", "path": "/metadata/annotations", "value": {"duet.dev/devices": "gpu:3"}}])
        self.assertEqual(p.metadata.annotations["duet.dev/devices"], "gpu:3")
        patches = [r for r in self.fake.requests() if r["method"] == "PATCH"]
        self.assertEqual(patches[-1]["content_type"], "application/json-patch+json")
        rv = int(v1.list_node().metadata.resource_version)
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            v1.list_node(resource_version=str(rv + 10))
        self.assertEqual(e.exception.status, 504)

    def test_python_list_node(self):
        v1 = client.CoreV1Api(self.api())
        nodes = v1.list_node()  # full deserialization of the golden shapes
        names = sorted(n.metadata.name for n in nodes.items)
        self.assertEqual(names, ["gpu-node-1", "tpu-node-1"])
        gpu = [n for n in nodes.items if n.metadata.name == "gpu-node-1"][0]
        self.assertEqual(gpu.status.capacity["nvidia.com/gpu"], "8")
        self.assertEqual(gpu.status.node_info.kubelet_version, "v1.32.2-gke.1297002")
        sel = v1.list_node(label_selector="cloud.google.com/gke-accelerator")
        self.assertEqual([n.metadata.name for n in sel.items], ["gpu-node-1"])
        paged = v1.list_node(limit=1)
        self.assertEqual(len(paged.items), 1)
        self.assertTrue(paged.metadata._continue)
        rest = v1.list_node(limit=1, _continue=paged.metadata._continue)
        self.assertEqual(rest.items[0].metadata.name, "tpu-node-1")
        self.assertEqual(rest.metadata.resource_version, paged.metadata.resource_version)

    def test_python_watch_stream(self):
        v1 = client.CoreV1Api(self.api())
        rv = v1.list_node().metadata.resource_version
        w = watch.Watch()
        self.fake.put(fh.node("gke_a3_h100_node.json", "gpu-node-2"))
        self.fake.delete("Node", "gpu-node-1")
        seen = []
        for ev in w.stream(v1.list_node, resource_version=rv, timeout_seconds=5,
                           allow_watch_bookmarks=True):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 2:
                w.stop()
        self.assertEqual(seen, [("ADDED", "gpu-node-2"), ("DELETED", "gpu-node-1")])

    def test_python_binding_patch_event_lease(self):
        api = self.api()
        v1 = client.CoreV1Api(api)
        uid = v1.read_namespaced_pod("trainer-0", "default").metadata.uid
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name="trainer-0", uid=uid),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name="gpu-node-1"))
        # The apiserver answers a Binding with a Status, which this client
        # cannot deserialize as V1Binding; read the raw reply.
        r = v1.create_namespaced_binding("default", body, _preload_content=False)
        self.assertEqual(r.status, 201)
        self.assertEqual(v1.read_namespaced_pod("trainer-0", "default").spec.node_name, "gpu-node-1")
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            v1.create_namespaced_binding("default", body, _preload_content=False)
        self.assertEqual(e.exception.status, 409)

        p = v1.patch_namespaced_pod("trainer-0", "default",
                                    {"metadata": {"annotations": {"duet.dev/devices": "gpu:0,1"}}})
        self.assertEqual(p.metadata.annotations["duet.dev/devices"], "gpu:0,1")

        ev = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="trainer-0."),
            involved_object=client.V1ObjectReference(kind="Pod", namespace="default", name="trainer-0",
                                                     uid=uid),
            reason="DuetRefused", message="no free GPU", type="Warning",
            source=client.V1EventSource(component="duet-bridge"))
        created = v1.create_namespaced_event("default", ev)
        self.assertTrue(created.metadata.name.startswith("trainer-0."))

        coord = client.CoordinationV1Api(api)
        lease = client.V1Lease(metadata=client.V1ObjectMeta(name="duet-bridge"),
                               spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15))
        got = coord.create_namespaced_lease("duet-system", lease)
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            coord.create_namespaced_lease("duet-system", lease)
        self.assertEqual(e.exception.status, 409)
        got.spec.holder_identity = "b"
        coord.replace_namespaced_lease("duet-bridge", "duet-system", got)
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            coord.replace_namespaced_lease("duet-bridge", "duet-system", got)  # stale version
        self.assertEqual(e.exception.status, 409)
        self.assertEqual(coord.read_namespaced_lease("duet-bridge", "duet-system").spec.holder_identity, "b")


class HttpTest(Base, unittest.TestCase):
    tls = False


class HttpsTest(Base, unittest.TestCase):
    tls = True

    def test_wrong_token_is_401(self):
        cfg = client.Configuration()
        cfg.host = self.fake.url
        cfg.ssl_ca_cert = self.certs["ca"]
        cfg.api_key = {"authorization": "Bearer wrong"}
        with self.assertRaises(kubernetes.client.exceptions.ApiException) as e:
            client.CoreV1Api(client.ApiClient(cfg)).list_node()
        self.assertEqual(e.exception.status, 401)


if __name__ == "__main__":
    unittest.main()
