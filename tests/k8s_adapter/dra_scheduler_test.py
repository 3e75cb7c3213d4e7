#!/usr/bin/python3
"""The DRA test foundation of issue 26 against the fake apiserver at 1.37:
tests/fakes/fake_dra_driver.py publishes ResourceSlices in NVIDIA's and
Google's TPU driver's shapes and refuses what their kubelet plugins refuse at
prepare; tests/fakes/test_scheduler.py allocates claims (by name, from a
template, and for an extended resource) as kube-scheduler's DRA plugin does,
honouring DeviceTaintRules and tolerations, and writes the allocation through
the claims' status subresource, where a validating webhook can refuse it. The
stale-cache and delayed-PreBind cases show the race duet's webhook must close
(they assert that it happens today)."""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
import fake_apiserver_dra_test as dra_test  # noqa: E402
import fake_dra_driver as drv  # noqa: E402
import fake_harness as fh  # noqa: E402
import test_scheduler as ts  # noqa: E402

DRA = "/apis/resource.k8s.io/v1"
CLAIMS = DRA + "/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
GPU_CLASS_CEL = 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'


def device_class(name, cel, extended=None):
    spec = {"selectors": [{"cel": {"expression": cel}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim(name, cls="gpu.nvidia.com", count=1, mode=None, tolerations=None, selectors=None):
    ex = {"deviceClassName": cls}
    if mode == "All":
        ex["allocationMode"] = "All"
    else:
        ex["count"] = count
    if tolerations:
        ex["tolerations"] = tolerations
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ex}]}}}


def pod(name, claims=(), templates=(), resources=None):
    c = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.10-py3"}
    if resources:
        c["resources"] = {"limits": resources, "requests": resources}
    rc = [{"name": "c%d" % i, "resourceClaimName": n} for i, n in enumerate(claims)]
    rc += [{"name": "t%d" % i, "resourceClaimTemplateName": n} for i, n in enumerate(templates)]
    spec = {"containers": [c]}
    if rc:
        spec["resourceClaims"] = rc
        c["resources"] = dict(c.get("resources") or {}, claims=[{"name": x["name"]} for x in rc])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def taint_rule(name, device, pool="gpu-node-1", effect="NoSchedule", key="duet.dev/slurm", value="held"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": pool, "device": device},
                     "taint": {"key": key, "value": value, "effect": effect}}}


class Base(unittest.TestCase):
    def setUp(self):
        self.fake = fh.Fake(extra=("--kube-version", "1.37"))
        self.url = self.fake.url
        self.api = ts.Client(self.url)

    def tearDown(self):
        self.fake.close()

    def post(self, path, obj):
        return self.api.call("POST", path, obj)

    def get(self, path):
        return self.api.call("GET", path)

    def gpus(self, nodes=1, gpus=4, mig=False):
        drv.publish(self.url, "nvidia", nodes=nodes, devices=gpus, mig=mig)
        self.post(DRA + "/deviceclasses", device_class("gpu.nvidia.com", GPU_CLASS_CEL))

    def devices_of(self, name):
        st = self.get(CLAIMS + "/" + name).get("status") or {}
        return [r["device"] for r in ((st.get("allocation") or {}).get("devices") or {}).get("results", [])]

    def run_pod(self, name, sched=None, **kw):
        self.post(PODS, pod(name, **kw))
        return (sched or ts.TestScheduler(self.url)).schedule("default", name)


class DriverShapesTest(Base):
    def test_nvidia_slices_one_pool_per_node_gpu_minor_names_uuid_and_pci_bus_id(self):
        drv.publish(self.url, "nvidia", nodes=2, devices=2, mig=True, vfio=True)
        slices = {s["metadata"]["name"]: s for s in self.get(DRA + "/resourceslices")["items"]}
        self.assertEqual(set(slices), {"gpu-node-1-gpu.nvidia.com", "gpu-node-2-gpu.nvidia.com"})
        spec = slices["gpu-node-2-gpu.nvidia.com"]["spec"]
        self.assertEqual((spec["driver"], spec["nodeName"], spec["pool"]),
                         ("gpu.nvidia.com", "gpu-node-2", {"name": "gpu-node-2", "generation": 1,
                                                           "resourceSliceCount": 1}))
        devs = {d["name"]: d for d in spec["devices"]}
        self.assertEqual(sorted(devs), ["gpu-0", "gpu-0-mig-19-0-1", "gpu-0-mig-19-1-1", "gpu-1",
                                        "gpu-1-mig-19-0-1", "gpu-1-mig-19-1-1", "gpu-vfio-0", "gpu-vfio-1"])
        gpu = devs["gpu-1"]
        self.assertTrue(gpu["attributes"]["uuid"]["string"].startswith("GPU-"))
        self.assertEqual(gpu["attributes"]["resource.kubernetes.io/pciBusID"], gpu["attributes"]["pcieBusID"])
        self.assertEqual(gpu["attributes"]["type"], {"string": "gpu"})
        self.assertNotIn("index", gpu["attributes"])
        self.assertNotIn("minor", gpu["attributes"])
        self.assertEqual(gpu["capacity"]["memory"], {"value": "80Gi"})
        mig = devs["gpu-1-mig-19-0-1"]["attributes"]
        self.assertEqual((mig["type"]["string"], mig["parentUUID"]), ("mig", gpu["attributes"]["uuid"]))
        uuids = [d["attributes"]["uuid"]["string"] for s in slices.values() for d in s["spec"]["devices"]
                 if d["attributes"]["type"]["string"] == "gpu"]
        self.assertEqual(len(set(uuids)), 4)
        # Republishing raises the pool's generation, as a driver does.
        drv.publish(self.url, "nvidia", nodes=1, devices=3)
        again = self.get(DRA + "/resourceslices/gpu-node-1-gpu.nvidia.com")["spec"]
        self.assertEqual((again["pool"]["generation"], len(again["devices"])), (2, 3))

    def test_tpu_slices_accel_names_one_uuid_per_node(self):
        drv.publish(self.url, "tpu", nodes=2, devices=4)
        slices = {s["spec"]["nodeName"]: s["spec"] for s in self.get(DRA + "/resourceslices")["items"]}
        self.assertEqual(set(slices), {"tpu-node-1", "tpu-node-2"})
        one = slices["tpu-node-1"]
        self.assertEqual((one["driver"], one["pool"]["name"]), ("tpu.google.com", "tpu-node-1"))
        self.assertEqual([d["name"] for d in one["devices"]], ["accel0", "accel1", "accel2", "accel3"])
        per_node = {n: {d["attributes"]["uuid"]["string"] for d in s["devices"]} for n, s in slices.items()}
        self.assertEqual([len(u) for u in per_node.values()], [1, 1])
        self.assertNotEqual(per_node["tpu-node-1"], per_node["tpu-node-2"])
        self.assertEqual(one["devices"][2]["attributes"]["chipCount"], {"int": 4})

    def test_cli_publishes_and_refuses_bad_shape(self):
        import subprocess
        script = os.path.join(HERE, "..", "fakes", "fake_dra_driver.py")
        r = subprocess.run([sys.executable, script, "publish", "--server", self.url, "--shape", "tpu",
                            "--nodes", "1", "--devices", "2"], capture_output=True, text=True, timeout=30)
        self.assertEqual((r.returncode, r.stdout), (0, "tpu-node-1-tpu.google.com accel0 accel1\n"), r.stderr)
        r = subprocess.run([sys.executable, script, "publish", "--server", self.url, "--shape", "amd"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--shape", r.stderr)


class AllocationTest(Base):
    def test_allocates_claims_excluding_allocated_devices_and_mig_siblings(self):
        self.gpus(gpus=4, mig=True)
        self.post(CLAIMS, claim("a", count=3))
        node = self.run_pod("pa", claims=["a"])
        self.assertEqual(node, "gpu-node-1")
        a = self.get(CLAIMS + "/a")
        p = self.get(PODS + "/pa")
        self.assertEqual(p["spec"]["nodeName"], "gpu-node-1")
        self.assertEqual(a["status"]["allocation"], ts.TestScheduler.allocation("gpu-node-1", [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-1", "device": "gpu-%d" % i}
            for i in range(3)]))
        self.assertEqual(a["status"]["reservedFor"], [{"resource": "pods", "name": "pa",
                                                       "uid": p["metadata"]["uid"]}])
        # The next claim gets what is left; one more does not fit (MIG devices are not type=gpu).
        self.post(CLAIMS, claim("b"))
        self.run_pod("pb", claims=["b"])
        self.assertEqual(self.devices_of("b"), ["gpu-3"])
        self.post(CLAIMS, claim("c"))
        with self.assertRaisesRegex(ts.SchedulingError, "0/1 nodes"):
            self.run_pod("pc", claims=["c"])
        self.assertNotIn("nodeName", self.get(PODS + "/pc")["spec"])
        self.assertEqual(self.devices_of("c"), [])

    def test_schedule_pending_takes_every_unbound_pod(self):
        self.gpus(gpus=1)
        for n in ("a", "b"):
            self.post(CLAIMS, claim(n))
            self.post(PODS, pod("p" + n, claims=[n]))
        got = ts.TestScheduler(self.url).schedule_pending()
        self.assertEqual(got["default/pa"], "gpu-node-1")
        self.assertIsInstance(got["default/pb"], ts.SchedulingError)
        again = ts.TestScheduler(self.url).schedule_pending()  # a bound pod is not pending
        self.assertEqual(list(again), ["default/pb"])

    def test_an_unschedulable_pod_gets_kube_schedulers_condition(self):
        self.gpus(gpus=1)
        for n in ("a", "b"):
            self.post(CLAIMS, claim(n))
            self.post(PODS, pod("p" + n, claims=[n]))
        ts.TestScheduler(self.url).schedule_pending()
        conds = {c["type"]: c for c in self.get(PODS + "/pb")["status"].get("conditions", [])}
        self.assertEqual(conds["PodScheduled"]["status"], "False")
        self.assertEqual(conds["PodScheduled"]["reason"], "Unschedulable")
        self.assertIn("pb", conds["PodScheduled"]["message"])
        bound = {c["type"]: c["status"] for c in (self.get(PODS + "/pa").get("status") or {})
                 .get("conditions", [])}
        self.assertNotEqual(bound.get("PodScheduled"), "False")

    def test_as_a_process_it_binds_pending_pods_and_stops_on_sigterm(self):
        import signal
        import subprocess
        self.gpus(gpus=1)
        self.post(CLAIMS, claim("a"))
        self.post(PODS, pod("pa", claims=["a"]))
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "fakes", "test_scheduler.py"),
                                 "--server", self.url, "--interval", "0.05"],
                                stdout=subprocess.PIPE, text=True)
        try:
            line = json.loads(proc.stdout.readline())
            self.assertEqual(line, {"pod": "default/pa", "node": "gpu-node-1"})
            self.assertEqual(self.get(PODS + "/pa")["spec"]["nodeName"], "gpu-node-1")
        finally:
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=30), 0)
            proc.stdout.close()

    def test_the_allocation_goes_through_the_status_subresource(self):
        self.gpus(gpus=1)
        self.post(CLAIMS, claim("a"))
        self.run_pod("pa", claims=["a"])
        writes = [(r["method"], r["path"]) for r in self.fake.requests() if "resourceclaims/a" in r["path"]
                  and r["method"] in ("PUT", "PATCH")]
        self.assertEqual(writes, [("PUT", CLAIMS + "/a/status")])

    def test_claim_from_template(self):
        self.gpus(gpus=2)
        self.post(DRA + "/namespaces/default/resourceclaimtemplates",
                  {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                   "metadata": {"name": "two", "namespace": "default"},
                   "spec": {"spec": claim("x", count=2)["spec"]}})
        self.run_pod("pt", templates=["two"])
        p = self.get(PODS + "/pt")
        [st] = p["status"]["resourceClaimStatuses"]
        self.assertEqual(st["name"], "t0")
        self.assertTrue(st["resourceClaimName"].startswith("pt-t0-"), st)
        made = self.get(CLAIMS + "/" + st["resourceClaimName"])
        self.assertEqual(made["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"], "t0")
        self.assertEqual(made["metadata"]["ownerReferences"][0]["uid"], p["metadata"]["uid"])
        self.assertEqual(self.devices_of(st["resourceClaimName"]), ["gpu-0", "gpu-1"])
        self.assertEqual(p["spec"]["nodeName"], "gpu-node-1")

    def test_extended_resource_served_through_a_device_class(self):
        drv.publish(self.url, "nvidia", nodes=2, devices=2)
        self.post(DRA + "/deviceclasses", device_class("gpu.nvidia.com", GPU_CLASS_CEL, extended="nvidia.com/gpu"))
        self.post(CLAIMS, claim("first", count=1))
        self.run_pod("p0", claims=["first"])
        # gpu-node-1 has one GPU left: two go to gpu-node-2.
        node = self.run_pod("px", resources={"nvidia.com/gpu": "2"})
        self.assertEqual(node, "gpu-node-2")
        st = self.get(PODS + "/px")["status"]["extendedResourceClaimStatus"]
        self.assertEqual(st["requestMappings"], [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                                                  "requestName": "container-0-request-0"}])
        c = self.get(CLAIMS + "/" + st["resourceClaimName"])
        self.assertEqual(c["metadata"]["annotations"], {"resource.kubernetes.io/extended-resource-claim": "true"})
        self.assertEqual(c["spec"]["devices"]["requests"][0]["exactly"],
                         {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2})
        self.assertEqual([(r["pool"], r["device"]) for r in c["status"]["allocation"]["devices"]["results"]],
                         [("gpu-node-2", "gpu-0"), ("gpu-node-2", "gpu-1")])
        # The implicit name deviceclass.resource.kubernetes.io/<class> maps too.
        node = self.run_pod("py", resources={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"})
        self.assertEqual(node, "gpu-node-1")

    def test_request_selectors_and_unsupported_cel(self):
        slices = drv.publish(self.url, "nvidia", nodes=1, devices=4)
        self.post(DRA + "/deviceclasses", device_class("gpu.nvidia.com", GPU_CLASS_CEL))
        bus = {d["name"]: d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
               for d in slices[0]["spec"]["devices"]}
        self.post(CLAIMS, claim("pick", selectors=['device.attributes["resource.kubernetes.io"].pciBusID == "%s"'
                                                   % bus["gpu-2"]]))
        self.run_pod("pp", claims=["pick"])
        self.assertEqual(self.devices_of("pick"), ["gpu-2"])
        cel = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
        self.post(CLAIMS, claim("cel", selectors=[cel]))
        with self.assertRaises(ts.UnsupportedCel) as e:
            self.run_pod("pc", claims=["cel"])
        self.assertIn("resourceclaims/cel.spec.devices.requests[0].exactly.selectors[0].cel.expression: "
                      "unsupported CEL", str(e.exception))
        self.assertEqual(self.devices_of("cel"), [])
        self.assertNotIn("nodeName", self.get(PODS + "/pc")["spec"])


class TaintTest(Base):
    def test_tainted_device_skipped_unless_tolerated(self):
        self.gpus(gpus=3)
        self.post(DRA + "/devicetaintrules", taint_rule("held-0", "gpu-0"))
        self.post(DRA + "/devicetaintrules", taint_rule("drain-1", "gpu-1", effect="NoExecute", key="duet.dev/drain"))
        self.post(DRA + "/devicetaintrules", taint_rule("note-2", "gpu-2", effect="None", key="duet.dev/note"))
        self.post(CLAIMS, claim("plain"))
        self.run_pod("p1", claims=["plain"])
        self.assertEqual(self.devices_of("plain"), ["gpu-2"])  # effect None excludes nothing
        # Equal with another value does not tolerate; Exists on the key does.
        self.post(CLAIMS, claim("wrong", tolerations=[{"key": "duet.dev/slurm", "operator": "Equal",
                                                       "value": "free", "effect": "NoSchedule"}]))
        with self.assertRaises(ts.SchedulingError):
            self.run_pod("p2", claims=["wrong"])
        tol = [{"key": "duet.dev/slurm", "operator": "Exists"}]
        self.post(CLAIMS, claim("tolerant", tolerations=tol))
        self.run_pod("p3", claims=["tolerant"])
        self.assertEqual(self.devices_of("tolerant"), ["gpu-0"])
        self.assertEqual(self.get(CLAIMS + "/tolerant")["status"]["allocation"]["devices"]["results"][0]
                         ["tolerations"], tol)
        self.post(CLAIMS, claim("drain", tolerations=[{"key": "duet.dev/drain", "operator": "Equal",
                                                       "value": "held", "effect": "NoExecute"}]))
        self.run_pod("p4", claims=["drain"])
        self.assertEqual(self.devices_of("drain"), ["gpu-1"])

    def test_all_mode_fails_on_a_tainted_device_of_the_node(self):
        self.gpus(gpus=2)
        self.post(DRA + "/devicetaintrules", taint_rule("held-1", "gpu-1"))
        self.post(CLAIMS, claim("all", mode="All"))
        with self.assertRaises(ts.SchedulingError):
            self.run_pod("pa", claims=["all"])
        self.api.call("DELETE", DRA + "/devicetaintrules/held-1")
        self.run_pod("pb", claims=["all"])
        self.assertEqual(self.devices_of("all"), ["gpu-0", "gpu-1"])

    def test_stale_cache_allocates_a_device_tainted_after_its_snapshot(self):
        """The race duet's webhook must close: today it happens."""
        self.gpus(gpus=2)
        stale = ts.TestScheduler(self.url, stale_cache=True)  # snapshot now
        rule = self.post(DRA + "/devicetaintrules", taint_rule("held-0", "gpu-0"))
        self.post(CLAIMS, claim("late"))
        self.run_pod("pl", sched=stale, claims=["late"])
        self.assertEqual(self.devices_of("late"), ["gpu-0"])
        self.assertLess(int(rule["metadata"]["resourceVersion"]),
                        int(self.get(CLAIMS + "/late")["metadata"]["resourceVersion"]))
        # A current cache would not have: after refresh() gpu-0 is skipped.
        self.api.call("DELETE", CLAIMS + "/late")
        self.post(CLAIMS, claim("fresh"))
        stale.refresh()
        self.run_pod("pf", sched=stale, claims=["fresh"])
        self.assertEqual(self.devices_of("fresh"), ["gpu-1"])

    def test_delayed_prebind_allocates_a_device_tainted_after_filter(self):
        self.gpus(gpus=2)
        sched = ts.TestScheduler(self.url, prebind_delay=1.0)
        self.post(CLAIMS, claim("slow"))
        self.post(PODS, pod("ps", claims=["slow"]))
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("node", sched.schedule("default", "ps")))
        t.start()
        self.assertTrue(sched.filtered.wait(20))
        filtered_at = time.monotonic()
        rule = self.post(DRA + "/devicetaintrules", taint_rule("held-0", "gpu-0"))
        t.join(30)
        self.assertGreaterEqual(time.monotonic() - filtered_at, 0.9)  # PreBind waited
        self.assertEqual(out.get("node"), "gpu-node-1")
        self.assertEqual(self.devices_of("slow"), ["gpu-0"])
        self.assertLess(int(rule["metadata"]["resourceVersion"]),
                        int(self.get(CLAIMS + "/slow")["metadata"]["resourceVersion"]))


class PrepareTest(Base):
    def setUp(self):
        super().setUp()
        drv.publish(self.url, "tpu", nodes=1, devices=4)
        self.post(DRA + "/deviceclasses", device_class("tpu.google.com", 'device.driver == "tpu.google.com"'))

    def test_tpu_whole_host_claim_prepares(self):
        self.post(CLAIMS, claim("all", cls="tpu.google.com", mode="All"))
        self.run_pod("pa", claims=["all"])
        got = drv.prepare(self.url, "tpu", "tpu-node-1", self.get(CLAIMS + "/all"))
        self.assertEqual([d for _, _, d in got], ["accel0", "accel1", "accel2", "accel3"])

    def test_tpu_partial_claim_is_refused_at_prepare(self):
        self.post(CLAIMS, claim("two", cls="tpu.google.com", count=2))
        self.run_pod("p2", claims=["two"])  # the scheduler allows it; the driver does not
        self.assertEqual(self.devices_of("two"), ["accel0", "accel1"])
        with self.assertRaisesRegex(drv.PrepareError, "takes 2 of the 4 TPU chips of node tpu-node-1"):
            drv.prepare(self.url, "tpu", "tpu-node-1", self.get(CLAIMS + "/two"))
        import subprocess
        script = os.path.join(HERE, "..", "fakes", "fake_dra_driver.py")
        r = subprocess.run([sys.executable, script, "prepare", "--server", self.url, "--shape", "tpu",
                            "--node", "tpu-node-1", "--claim", "two"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("prepare refused: claim two takes 2 of the 4", r.stderr)

    def test_nvidia_prepare_refuses_a_device_not_on_the_node(self):
        drv.publish(self.url, "nvidia", nodes=1, devices=1)
        c = {"metadata": {"name": "x"}, "status": {"allocation": ts.TestScheduler.allocation("gpu-node-1", [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-1", "device": "gpu-0"}])}}
        self.assertEqual(drv.prepare(self.url, "nvidia", "gpu-node-1", c), [("gpu", "gpu-node-1", "gpu-0")])
        c["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-7"
        with self.assertRaisesRegex(drv.PrepareError, "gpu-7 is not published"):
            drv.prepare(self.url, "nvidia", "gpu-node-1", c)


class WebhookTest(Base):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="duet-dra-sched-")
        cls.certs = dra_test.make_webhook_tls(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.hook = dra_test.Webhook(self.certs)
        with open(self.certs["ca"], "rb") as f:
            import base64
            ca = base64.b64encode(f.read()).decode()
        self.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "duet-lending"},
            "webhooks": [{"name": "lend.duet.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"url": "https://127.0.0.1:%d/validate" % self.hook.port, "caBundle": ca},
                          "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                     "resources": ["resourceclaims/status"], "operations": ["UPDATE"]}]}]})

    def tearDown(self):
        self.hook.close()
        super().tearDown()

    def test_denying_webhook_fails_prebind_and_the_pod_stays_unbound(self):
        self.gpus(gpus=2)
        self.hook.decide = lambda req: {"allowed": False, "status": {"code": 403, "message": "gpu-0 is lent to Slurm"}}
        self.post(CLAIMS, claim("a"))
        with self.assertRaises(ts.PreBindError) as e:
            self.run_pod("pa", claims=["a"])
        self.assertEqual(e.exception.cause.code, 403)
        self.assertIn('admission webhook "lend.duet.dev" denied the request: gpu-0 is lent to Slurm',
                      str(e.exception))
        self.assertNotIn("nodeName", self.get(PODS + "/pa")["spec"])
        self.assertEqual(self.get(CLAIMS + "/a").get("status") or {}, {})
        path, review = self.hook.reviews[0]
        req = review["request"]
        self.assertEqual((req["subResource"], req["operation"], req["name"]), ("status", "UPDATE", "a"))
        self.assertEqual(req["object"]["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0")
        # The same pod goes through once the webhook allows.
        self.hook.decide = lambda req: {"allowed": True}
        self.assertEqual(ts.TestScheduler(self.url).schedule("default", "pa"), "gpu-node-1")
        self.assertEqual(self.devices_of("a"), ["gpu-0"])


if __name__ == "__main__":
    unittest.main()
