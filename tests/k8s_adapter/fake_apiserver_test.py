#!/usr/bin/python3
"""The fake apiserver's own behaviour where it copies kube-apiserver's rules:
the four patch types, Status error bodies, graceful deletion and finalizers,
binding, eviction and PodDisruptionBudgets, namespaces, events.k8s.io/v1,
discovery and OpenAPI v3, field validation and a watch or list from a
resourceVersion not reached yet.
Plain HTTP with urllib, so every status code and header is visible."""

import http.client
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_harness as fh  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
import fake_apiserver  # noqa: E402  (its pure helpers; the server runs as a process)

PATCH = {"json": "application/json-patch+json", "merge": "application/merge-patch+json",
         "smp": "application/strategic-merge-patch+json", "apply": "application/apply-patch+yaml"}
PODS = "/api/v1/namespaces/default/pods"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


class Base:
    extra = ("--too-large-wait", "0.5")

    def setUp(self):
        self.fake = fh.Fake(extra=self.extra)
        self.fake.put(fh.node("gke_a3_h100_node.json", "gpu-node-1"))

    def tearDown(self):
        self.fake.close()

    def req(self, method, path, body=None, ctype="application/json", raw=None):
        """(code, decoded body, headers) of one API request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        return r.status, (json.loads(text) if text else None), r.headers

    def pod(self, name, **kw):
        code, obj, _ = self.req("POST", PODS, fh.pod(name, **kw))
        self.assertEqual(code, 201, obj)
        return obj

    def patch(self, name, kind, body, path=PODS, query=""):
        return self.req("PATCH", "%s/%s%s" % (path, name, query), body, PATCH[kind])

    def evict(self, name, uid=None, **extra):
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        body.update(extra)
        return self.req("POST", "%s/%s/eviction" % (PODS, name), body)



class FakeTest(Base, unittest.TestCase):
    # ---- patches ----
    def test_strategic_merge_patch_follows_the_merge_keys(self):
        p = fh.pod("p0")
        p["spec"]["containers"].append({"name": "side", "image": "busybox",
                                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]})
        p["metadata"]["finalizers"] = ["duet.dev/a"]
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        self.assertEqual(self.req("POST", PODS, p)[0], 201)
        code, got, _ = self.patch("p0", "smp", {
            "metadata": {"finalizers": ["duet.dev/b", "duet.dev/a"], "labels": {"app": None}},
            "spec": {"containers": [{"name": "side", "env": [{"name": "B", "value": "3"},
                                                              {"name": "A", "$patch": "delete"}]},
                                    {"name": "new", "image": "x"}],
                     "tolerations": [{"key": "google.com/tpu", "operator": "Exists"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        self.assertEqual(code, 200, got)
        self.assertEqual([c["name"] for c in got["spec"]["containers"]], ["main", "side", "new"])
        self.assertEqual(got["spec"]["containers"][0]["image"], "nvcr.io/nvidia/pytorch:24.10-py3")
        self.assertEqual(got["spec"]["containers"][1]["env"], [{"name": "B", "value": "3"}])
        self.assertEqual(got["spec"]["containers"][1]["image"], "busybox")
        self.assertEqual(got["spec"]["tolerations"], [{"key": "google.com/tpu", "operator": "Exists"}])
        self.assertEqual([c["type"] for c in got["status"]["conditions"]], ["PodScheduled", "Ready"])
        self.assertEqual(got["metadata"]["finalizers"], ["duet.dev/a", "duet.dev/b"])
        self.assertNotIn("app", got["metadata"]["labels"])
        # kubectl apply's directives: element order, and a primitive to drop.
        code, got, _ = self.patch("p0", "smp", {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["duet.dev/a"]},
            "spec": {"$setElementOrder/containers": [{"name": "new"}, {"name": "main"}, {"name": "side"}],
                     "containers": [{"name": "main", "image": "y"}]}})
        self.assertEqual(code, 200, got)
        self.assertEqual([c["name"] for c in got["spec"]["containers"]], ["new", "main", "side"])
        self.assertEqual(got["spec"]["containers"][1]["image"], "y")
        self.assertEqual(got["metadata"]["finalizers"], ["duet.dev/b"])
        code, got, _ = self.patch("p0", "smp", {"spec": {"containers": [{"image": "no-name"}]}})
        self.assertEqual(code, 400, got)
        self.assertIn("does not contain declared merge key: name", got["message"])

    def test_merge_patch_replaces_lists(self):
        self.pod("p0")
        code, got, _ = self.patch("p0", "merge", {"spec": {"containers": [{"name": "only", "image": "x"}]}})
        self.assertEqual(code, 200, got)
        self.assertEqual([c["name"] for c in got["spec"]["containers"]], ["only"])

    def test_json_patch_operations_and_a_failed_test_changes_nothing(self):
        before = self.pod("p0")
        code, got, _ = self.patch("p0", "json", [
            {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}},
            {"op": "add", "path": "/spec/containers/-", "value": {"name": "side", "image": "x"}},
            {"op": "copy", "from": "/metadata/annotations/a~1b", "path": "/metadata/labels/copied"},
            {"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/moved"},
            {"op": "replace", "path": "/spec/containers/0/name", "value": "first"},
            {"op": "remove", "path": "/spec/tolerations/0"},
            {"op": "test", "path": "/spec/containers/1/name", "value": "side"}])
        self.assertEqual(code, 200, got)
        self.assertEqual(got["metadata"]["labels"], {"copied": "1", "moved": "trainer"})
        self.assertEqual([c["name"] for c in got["spec"]["containers"]], ["first", "side"])
        self.assertEqual(got["spec"]["tolerations"], [])
        rv = got["metadata"]["resourceVersion"]
        self.assertNotEqual(rv, before["metadata"]["resourceVersion"])
        code, err, _ = self.patch("p0", "json", [
            {"op": "remove", "path": "/metadata/labels"},
            {"op": "test", "path": "/spec/schedulerName", "value": "default-scheduler"}])
        self.assertEqual(code, 422, err)
        self.assertEqual(err["reason"], "Invalid")
        self.assertEqual(self.req("GET", PODS + "/p0")[1]["metadata"]["resourceVersion"], rv)
        code, err, _ = self.patch("p0", "json", [{"op": "remove", "path": "/metadata/nope"}])
        self.assertEqual(code, 422, err)
        code, err, _ = self.patch("p0", "json", {"op": "add"})
        self.assertEqual(code, 400, err)
        code, err, _ = self.patch("p0", "json", [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}])
        self.assertEqual((code, err["reason"]), (409, "Conflict"))

    def test_server_side_apply(self):
        body = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a0\n  labels: {tier: gold}\n" \
               "spec:\n  containers:\n  - name: main\n    image: x\n"
        code, err, _ = self.req("PATCH", PODS + "/a0", raw=body.encode(), ctype=PATCH["apply"])
        self.assertEqual((code, err["reason"]), (400, "BadRequest"))
        self.assertIn("fieldManager is required", err["message"])
        self.assertEqual(self.req("GET", PODS + "/a0")[0], 404)  # nothing made
        code, got, _ = self.req("PATCH", PODS + "/a0?fieldManager=t", raw=body.encode(), ctype=PATCH["apply"])
        self.assertEqual(code, 201, got)
        self.assertEqual(got["metadata"]["labels"], {"tier": "gold"})
        body2 = body.replace("image: x", "image: y")
        code, got, _ = self.req("PATCH", PODS + "/a0?fieldManager=t", raw=body2.encode(), ctype=PATCH["apply"])
        self.assertEqual(code, 200, got)
        self.assertEqual(got["spec"]["containers"], [{"name": "main", "image": "y"}])
        [mf] = got["metadata"]["managedFields"]
        self.assertEqual((mf["manager"], mf["operation"], mf["fieldsType"]), ("t", "Apply", "FieldsV1"))
        self.assertIn('k:{"name":"main"}', mf["fieldsV1"]["f:spec"]["f:containers"])

    def test_server_side_apply_owns_removes_and_conflicts(self):
        def apply(manager, labels, force=False):
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a0", "labels": labels}}
            if manager == "t":
                body["spec"] = {"containers": [{"name": "main", "image": "x"}]}
            q = "?fieldManager=%s%s" % (manager, "&force=true" if force else "")
            return self.req("PATCH", PODS + "/a0" + q, body, PATCH["apply"])
        self.assertEqual(apply("t", {"tier": "gold", "team": "a"})[0], 201)
        code, got, _ = apply("t", {"tier": "gold"})  # t stops applying team: it goes
        self.assertEqual(got["metadata"]["labels"], {"tier": "gold"})
        code, err, _ = apply("u", {"tier": "silver"})
        self.assertEqual((code, err["reason"]), (409, "Conflict"))
        self.assertEqual(err["message"], 'Apply failed with 1 conflict: conflict with "t": .metadata.labels.tier')
        self.assertEqual(err["details"]["causes"], [{"reason": "FieldManagerConflict",
                                                     "message": 'conflict with "t"',
                                                     "field": ".metadata.labels.tier"}])
        self.assertEqual(self.req("GET", PODS + "/a0")[1]["metadata"]["labels"], {"tier": "gold"})
        self.assertEqual(apply("u", {"tier": "gold"})[0], 200)  # same value: shared
        code, got, _ = apply("t", {})  # t lets go; u still owns tier, so it stays
        self.assertEqual(got["metadata"]["labels"], {"tier": "gold"})
        code, got, _ = apply("t", {"tier": "gold"})
        code, got, _ = apply("u", {"tier": "silver"}, force=True)  # force takes the field
        self.assertEqual((code, got["metadata"]["labels"]), (200, {"tier": "silver"}))
        owners = {e["manager"]: e["fieldsV1"] for e in got["metadata"]["managedFields"]}
        self.assertNotIn("f:tier", owners["t"]["f:metadata"].get("f:labels", {}))
        self.assertIn("f:tier", owners["u"]["f:metadata"]["f:labels"])

    def test_unknown_patch_type_is_415(self):
        self.pod("p0")
        code, err, _ = self.req("PATCH", PODS + "/p0", {}, "application/yaml")
        self.assertEqual((code, err["reason"]), (415, "UnsupportedMediaType"))
        for t in PATCH.values():
            self.assertIn(t, err["message"])

    # ---- error bodies ----
    def test_status_bodies_name_group_and_kind(self):
        code, err, _ = self.req("GET", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l")
        self.assertEqual(code, 404)
        self.assertEqual(err, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": 'leases.coordination.k8s.io "l" not found', "reason": "NotFound",
                               "details": {"name": "l", "group": "coordination.k8s.io", "kind": "leases"},
                               "code": 404})
        self.pod("p0")
        code, err, _ = self.req("POST", PODS, fh.pod("p0"))
        self.assertEqual((code, err["reason"], err["details"]), (409, "AlreadyExists",
                                                                   {"name": "p0", "kind": "pods"}))
        stale = self.req("GET", PODS + "/p0")[1]
        self.patch("p0", "merge", {"metadata": {"labels": {"x": "y"}}})
        code, err, _ = self.req("PUT", PODS + "/p0", stale)
        self.assertEqual((code, err["reason"], err["details"]), (409, "Conflict", {"name": "p0", "kind": "pods"}))
        self.assertIn('Operation cannot be fulfilled on pods "p0"', err["message"])
        code, err, _ = self.req("POST", PODS, {"metadata": {}})
        self.assertEqual((code, err["reason"]), (422, "Invalid"))
        self.assertEqual(err["details"]["kind"], "Pod")
        self.assertEqual(err["details"]["causes"][0]["field"], "metadata.name")
        code, err, _ = self.req("GET", "/api/v1/widgets")
        self.assertEqual((code, err["reason"], err["details"]), (404, "NotFound", {}))
        p = fh.pod("p1")
        p["metadata"]["resourceVersion"] = "5"
        code, err, _ = self.req("POST", PODS, p)
        self.assertEqual((code, err["message"]), (400, "resourceVersion should not be set on objects to be created"))
        p["metadata"] = {"name": "p1", "uid": "mine", "creationTimestamp": "2000-01-01T00:00:00Z"}
        code, got, _ = self.req("POST", PODS, p)
        self.assertEqual(code, 201)
        self.assertNotEqual(got["metadata"]["uid"], "mine")
        self.assertNotEqual(got["metadata"]["creationTimestamp"], "2000-01-01T00:00:00Z")

    # ---- deletion ----
    def test_bound_pod_deletion_is_graceful(self):
        self.pod("bound", node_name="gpu-node-1")
        self.pod("pending")
        code, got, _ = self.req("DELETE", PODS + "/pending")
        self.assertEqual(code, 200)
        self.assertEqual(self.req("GET", PODS + "/pending")[0], 404)  # unbound: at once
        code, got, _ = self.req("DELETE", PODS + "/bound")
        self.assertEqual(code, 200, got)
        self.assertEqual(got["metadata"]["deletionGracePeriodSeconds"], 30)  # the default
        self.assertIn("deletionTimestamp", got["metadata"])
        self.assertEqual(self.req("GET", PODS + "/bound")[0], 200)
        code, err, _ = self.req("POST", PODS + "/bound/binding",
                                {"metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "n"}})
        self.assertEqual(code, 409)
        # A shorter grace period takes over; 0 deletes now.
        code, got, _ = self.req("DELETE", PODS + "/bound", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                             "gracePeriodSeconds": 5})
        self.assertEqual(got["metadata"]["deletionGracePeriodSeconds"], 5)
        self.assertEqual(self.req("DELETE", PODS + "/bound?gracePeriodSeconds=0")[0], 200)
        self.assertEqual(self.req("GET", PODS + "/bound")[0], 404)
        # The test playing the kubelet ends a graceful deletion too.
        self.pod("b2", node_name="gpu-node-1")
        self.req("DELETE", PODS + "/b2")
        self.fake.delete("Pod", "b2")
        self.assertEqual(self.req("GET", PODS + "/b2")[0], 404)
        # Preconditions.
        p = self.pod("b3")
        code, err, _ = self.req("DELETE", PODS + "/b3", {"preconditions": {"uid": "other"}})
        self.assertEqual((code, err["reason"]), (409, "Conflict"))
        self.assertEqual(self.req("DELETE", PODS + "/b3", {"preconditions": {"uid": p["metadata"]["uid"]}})[0],
                         200)

    def test_grace_period_ends_and_watch_sees_modified_then_deleted(self):
        self.pod("bound", node_name="gpu-node-1")
        rv = self.req("GET", PODS)[1]["metadata"]["resourceVersion"]
        self.req("DELETE", PODS + "/bound?gracePeriodSeconds=1")
        t0 = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
        conn.request("GET", PODS + "?watch=1&timeoutSeconds=3&resourceVersion=" + rv)
        lines = conn.getresponse().read().decode().splitlines()
        conn.close()
        frames = [json.loads(x) for x in lines if x]
        self.assertEqual([f["type"] for f in frames], ["MODIFIED", "DELETED"])
        self.assertIn("deletionTimestamp", frames[0]["object"]["metadata"])
        self.assertEqual(self.req("GET", PODS + "/bound")[0], 404)
        self.assertGreaterEqual(time.time() - t0, 0.9)

    def test_finalizers_hold_an_object_until_emptied(self):
        lease = {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                 "metadata": {"name": "l", "namespace": "default", "finalizers": ["duet.dev/keep"]}}
        path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
        self.assertEqual(self.req("POST", path, lease)[0], 201)
        code, got, _ = self.req("DELETE", path + "/l")
        self.assertEqual(code, 200)
        self.assertEqual(got["metadata"]["deletionGracePeriodSeconds"], 0)
        self.assertEqual(self.req("GET", path + "/l")[0], 200)
        code, got, _ = self.req("PATCH", path + "/l", {"metadata": {"finalizers": None}}, PATCH["merge"])
        self.assertEqual(code, 200, got)
        self.assertEqual(self.req("GET", path + "/l")[0], 404)
        # Without finalizers a lease goes at once, and the reply is a Status.
        lease["metadata"].pop("finalizers")
        uid = self.req("POST", path, lease)[1]["metadata"]["uid"]
        code, got, _ = self.req("DELETE", path + "/l")
        self.assertEqual((code, got), (200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                             "status": "Success",
                                             "details": {"name": "l", "group": "coordination.k8s.io",
                                                         "kind": "leases", "uid": uid}}))

    # ---- binding, namespaces, events.k8s.io ----
    def test_binding_sets_pod_scheduled(self):
        p = self.pod("p0")
        code, _, _ = self.req("POST", "/api/v1/namespaces/default/bindings", {
            "metadata": {"name": "p0", "uid": p["metadata"]["uid"], "annotations": {"duet.dev/bound": "1"}},
            "target": {"kind": "Node", "name": "gpu-node-1"}})
        self.assertEqual(code, 201)
        got = self.req("GET", PODS + "/p0")[1]
        self.assertEqual(got["spec"]["nodeName"], "gpu-node-1")
        self.assertEqual(got["metadata"]["annotations"], {"duet.dev/bound": "1"})
        [c] = got["status"]["conditions"]
        self.assertEqual((c["type"], c["status"]), ("PodScheduled", "True"))
        self.assertIn("lastTransitionTime", c)

    def running_pod(self, name, ready=True, **kw):
        """A pod a budget protects: Running (and Ready unless told)."""
        p = fh.pod(name, **kw)
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
        return self.fake.put(p)

    def budget(self, name, selector, **status):
        code, got, _ = self.req("POST", PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                               "metadata": {"name": name},
                                               "spec": {"minAvailable": 1, "selector": selector}})
        self.assertEqual(code, 201, got)
        code, got, _ = self.patch(name, "merge", {"status": status}, PDBS, "/status")
        self.assertEqual(code, 200, got)
        return got

    def test_eviction_spends_the_disruption_budget(self):
        p0 = self.running_pod("p0", node_name="gpu-node-1")
        self.running_pod("p1", node_name="gpu-node-1")
        self.budget("trainers", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["trainer"]}]},
                    disruptionsAllowed=1, currentHealthy=2, desiredHealthy=1, expectedPods=2, observedGeneration=0)
        rv = self.req("GET", PDBS)[1]["metadata"]["resourceVersion"]

        # Refusals that leave the budget alone.
        code, err, _ = self.evict("p0", uid="not-the-uid")
        self.assertEqual((code, err["reason"]), (409, "Conflict"), err)
        self.assertIn("Precondition failed: UID in precondition: not-the-uid", err["message"])
        code, err, _ = self.req("POST", PODS + "/p0/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                                "metadata": {"name": "p1"}})
        self.assertEqual((code, err["message"]), (400, "name in URL does not match name in Eviction object"))
        code, err, _ = self.req("POST", PODS + "/p0/eviction", fh.pod("p0"))
        self.assertEqual((code, err["reason"]), (400, "BadRequest"))
        code, err, _ = self.evict("gone")
        self.assertEqual((code, err["reason"], err["details"]), (404, "NotFound", {"name": "gone", "kind": "pods"}))
        code, _, _ = self.req("POST", PODS + "/p0/eviction?dryRun=All",
                              {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p0"}})
        self.assertEqual(code, 201)
        self.assertEqual(self.req("GET", PDBS + "/trainers")[1]["status"]["disruptionsAllowed"], 1)
        self.assertNotIn("deletionTimestamp", self.req("GET", PODS + "/p0")[1]["metadata"])

        # The one disruption: a bound pod's deletion is graceful, as a DELETE's.
        code, got, _ = self.evict("p0", uid=p0["metadata"]["uid"])
        self.assertEqual((code, got), (201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                             "status": "Success", "code": 201}))
        self.assertEqual(self.req("GET", PODS + "/p0")[1]["metadata"]["deletionGracePeriodSeconds"], 30)
        pdb = self.req("GET", PDBS + "/trainers")[1]
        self.assertEqual(pdb["status"]["disruptionsAllowed"], 0)
        self.assertEqual(list(pdb["status"]["disruptedPods"]), ["p0"])
        [cond] = pdb["status"]["conditions"]
        self.assertEqual((cond["type"], cond["status"], cond["reason"]),
                         ("DisruptionAllowed", "False", "InsufficientPods"))

        # Budget spent: 429 with the real reply, and nothing changes.
        code, err, headers = self.evict("p1")
        self.assertEqual((code, err), (429, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests", "code": 429,
            "details": {"causes": [{"reason": "DisruptionBudget",
                                    "message": "The disruption budget trainers needs 1 healthy pods and has 2 "
                                               "currently"}]}}))
        self.assertIsNone(headers.get("Retry-After"))
        self.assertNotIn("deletionTimestamp", self.req("GET", PODS + "/p1")[1]["metadata"])
        # A pod already being deleted, a Pending pod and an unready pod (with
        # enough healthy ones) pass the spent budget.
        self.assertEqual(self.evict("p0")[0], 201)
        self.pod("pending")
        self.assertEqual(self.evict("pending")[0], 201)
        self.assertEqual(self.req("GET", PODS + "/pending")[0], 404)
        self.running_pod("unready", ready=False)
        self.assertEqual(self.evict("unready")[0], 201)
        self.assertEqual(self.req("GET", PODS + "/unready")[0], 404)
        self.assertEqual(self.req("GET", PDBS + "/trainers")[1]["status"]["disruptionsAllowed"], 0)

        # The budget's watch saw its status change once per write.
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
        conn.request("GET", PDBS + "?watch=1&timeoutSeconds=1&resourceVersion=" + rv)
        frames = [json.loads(x) for x in conn.getresponse().read().decode().splitlines() if x]
        conn.close()
        self.assertEqual([(f["type"], f["object"]["status"]["disruptionsAllowed"]) for f in frames],
                         [("MODIFIED", 0)])
        evictions = [r["path"] for r in self.fake.requests() if r["path"].endswith("/eviction")]
        self.assertEqual(evictions.count(PODS + "/p0/eviction"), 5)

        # Two budgets over one pod: the eviction subresource gives up.
        self.budget("also", {"matchLabels": {"app": "trainer"}}, disruptionsAllowed=5)
        code, err, _ = self.evict("p1")
        self.assertEqual((code, err["message"]), (500, "This pod has more than one PodDisruptionBudget, which "
                                                       "the eviction subresource does not support."))
        self.assertEqual(self.req("GET", PDBS + "/also")[1]["status"]["disruptionsAllowed"], 5)

    def test_eviction_budget_refusals_and_selectors(self):
        self.running_pod("p0")
        self.budget("b", {"matchLabels": {"app": "trainer"}}, disruptionsAllowed=-1)
        code, err, _ = self.evict("p0")
        self.assertEqual((code, err["reason"]), (403, "Forbidden"))
        self.assertEqual(err["message"], 'poddisruptionbudget.policy "b" is forbidden: pdb disruptions allowed '
                                         "is negative")
        # A budget the disruption controller has not seen since its spec changed.
        self.patch("b", "merge", {"metadata": {"generation": 2},
                                  "status": {"disruptionsAllowed": 1, "observedGeneration": 1}}, PDBS)
        code, err, headers = self.evict("p0")
        self.assertEqual((code, err["details"]["retryAfterSeconds"], headers.get("Retry-After")), (429, 10, "10"))
        self.assertIn("still being processed", err["details"]["causes"][0]["message"])
        # An empty selector selects nothing here (not everything).
        code, got, _ = self.patch("b", "merge", {"spec": {"selector": {"matchLabels": None}}}, PDBS)
        self.assertEqual((code, got["spec"]["selector"]), (200, {}))
        self.assertEqual(self.evict("p0")[0], 201)

        sel = fake_apiserver.pdb_selects
        labels = {"app": "trainer", "tier": "gold"}
        self.assertTrue(sel({"matchLabels": {"app": "trainer"}}, labels))
        self.assertFalse(sel({"matchLabels": {"app": "infer"}}, labels))
        self.assertTrue(sel({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["infer"]},
                                                  {"key": "tier", "operator": "Exists"},
                                                  {"key": "gpu", "operator": "DoesNotExist"}]}, labels))
        self.assertFalse(sel({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, labels))
        self.assertFalse(sel({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["trainer"]}]},
                             labels))
        self.assertFalse(sel({"matchExpressions": [{"key": "x", "operator": "In", "values": ["1"]}]}, labels))
        self.assertFalse(sel({"matchExpressions": [{"key": "app", "operator": "In"}]}, labels))  # invalid
        self.assertFalse(sel({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, labels))
        self.assertFalse(sel({}, labels))
        self.assertFalse(sel(None, labels))

    def test_namespaces_and_cascade(self):
        names = [n["metadata"]["name"] for n in self.req("GET", "/api/v1/namespaces")[1]["items"]]
        self.assertEqual(names, ["default", "kube-node-lease", "kube-public", "kube-system"])
        code, ns, _ = self.req("POST", "/api/v1/namespaces", {"metadata": {"name": "ml"}})
        self.assertEqual((code, ns["status"]["phase"]), (201, "Active"))
        self.req("POST", "/api/v1/namespaces/ml/pods", fh.pod("p", namespace="ml"))
        self.assertEqual(self.req("DELETE", "/api/v1/namespaces/ml")[0], 200)
        self.assertEqual(self.req("GET", "/api/v1/namespaces/ml/pods/p")[0], 404)

    def test_events_k8s_io_v1_beside_core_events(self):
        ev = {"metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z",
              "reportingController": "duet.dev/bridge", "reportingInstance": "b-0", "action": "Bind",
              "reason": "DuetBound", "regarding": {"kind": "Pod", "name": "p0", "namespace": "default"},
              "note": "bound", "type": "Normal"}
        code, got, _ = self.req("POST", "/apis/events.k8s.io/v1/namespaces/default/events", ev)
        self.assertEqual((code, got["apiVersion"], got["kind"]), (201, "events.k8s.io/v1", "Event"))
        self.assertEqual(len(self.req("GET", "/apis/events.k8s.io/v1/events")[1]["items"]), 1)
        self.assertEqual(self.req("GET", "/api/v1/events")[1]["items"], [])
        code, err, _ = self.req("GET", "/apis/events.k8s.io/v1/namespaces/default/events/nope")
        self.assertEqual(err["details"], {"name": "nope", "group": "events.k8s.io", "kind": "events"})

    # ---- discovery, OpenAPI, field validation ----
    def test_discovery_and_openapi(self):
        groups = {g["name"] for g in self.req("GET", "/apis")[1]["groups"]}
        self.assertEqual(groups, {"coordination.k8s.io", "events.k8s.io", "policy", "resource.k8s.io",
                                  "admissionregistration.k8s.io"})
        self.assertEqual([r["name"] for r in self.req("GET", "/apis/events.k8s.io/v1")[1]["resources"]],
                         ["events"])
        core = {r["name"]: r for r in self.req("GET", "/api/v1")[1]["resources"]}
        self.assertTrue({"nodes", "namespaces", "pods", "pods/binding", "pods/eviction", "events",
                         "bindings"} <= set(core))
        # kubectl drain finds the Eviction's group and version here.
        self.assertEqual(core["pods/eviction"], {"name": "pods/eviction", "singularName": "", "namespaced": True,
                                                 "group": "policy", "version": "v1", "kind": "Eviction",
                                                 "verbs": ["create"]})
        policy = {r["name"]: r for r in self.req("GET", "/apis/policy/v1")[1]["resources"]}
        self.assertEqual(set(policy), {"poddisruptionbudgets", "poddisruptionbudgets/status"})
        self.assertEqual((policy["poddisruptionbudgets"]["kind"], policy["poddisruptionbudgets"]["shortNames"]),
                         ("PodDisruptionBudget", ["pdb"]))
        index = self.req("GET", "/openapi/v3")[1]["paths"]
        self.assertEqual(set(index), {"api/v1", "apis/coordination.k8s.io/v1", "apis/events.k8s.io/v1",
                                      "apis/policy/v1", "apis/resource.k8s.io/v1",
                                      "apis/admissionregistration.k8s.io/v1"})
        doc = self.req("GET", index["api/v1"]["serverRelativeURL"])[1]
        patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
        self.assertEqual(patch["x-kubernetes-group-version-kind"], {"group": "", "version": "v1", "kind": "Pod"})
        self.assertIn("fieldValidation", [p["name"] for p in patch["parameters"]])

    def test_field_validation(self):
        bad = fh.pod("p0")
        bad["spec"]["containers"][0]["imagee"] = "typo"
        code, err, _ = self.req("POST", PODS + "?fieldValidation=Strict", bad)
        self.assertEqual((code, err["reason"]), (400, "BadRequest"))
        self.assertIn('strict decoding error: unknown field "spec.containers[0].imagee"', err["message"])
        self.assertEqual(self.req("GET", PODS + "/p0")[0], 404)
        code, _, headers = self.req("POST", PODS + "?fieldValidation=Warn", bad)
        self.assertEqual(code, 201)
        self.assertEqual(headers.get_all("Warning"), ['299 - "unknown field \\"spec.containers[0].imagee\\""'])
        code, got, _ = self.req("POST", PODS + "?dryRun=All", fh.pod("dry"))
        self.assertEqual(code, 201, got)
        self.assertEqual(self.req("GET", PODS + "/dry")[0], 404)

    def test_protobuf_bodies(self):
        def ld(num, data):  # a length-delimited protobuf field (short)
            return bytes([num << 3 | 2, len(data)]) + data

        def envelope(kind, raw):  # runtime.Unknown after the k8s magic
            return b"k8s\x00" + ld(1, ld(1, b"v1") + ld(2, kind)) + ld(2, raw)
        meta = ld(1, b"ml") + ld(2, b"") + ld(11, ld(1, b"t") + ld(2, b"a"))
        ns = envelope(b"Namespace", ld(1, meta) + ld(2, ld(1, b"kubernetes")) + ld(3, b""))
        code, got, _ = self.req("POST", "/api/v1/namespaces", raw=ns, ctype="application/vnd.kubernetes.protobuf")
        self.assertEqual(code, 201, got)
        self.assertEqual(got["metadata"]["labels"], {"t": "a", "kubernetes.io/metadata.name": "ml"})
        self.assertEqual(got["spec"], {"finalizers": ["kubernetes"]})
        # A field the decoder does not know (ownerReferences) is refused, not dropped.
        odd = envelope(b"Namespace", ld(1, ld(1, b"ml2") + ld(13, ld(1, b"x"))))
        code, err, _ = self.req("POST", "/api/v1/namespaces", raw=odd, ctype="application/vnd.kubernetes.protobuf")
        self.assertEqual((code, err["reason"]), (415, "UnsupportedMediaType"))
        code, err, _ = self.req("POST", PODS, raw=envelope(b"Pod", ld(1, b"")),
                                ctype="application/vnd.kubernetes.protobuf")
        self.assertEqual((code, err["reason"]), (415, "UnsupportedMediaType"))
        self.assertIn("v1 Pod", err["message"])
        self.assertEqual(self.req("GET", "/api/v1/namespaces/ml2")[0], 404)

    def test_yaml_body(self):
        body = b"apiVersion: v1\nkind: Pod\nmetadata: {name: y0}\nspec:\n  containers: [{name: c, image: x}]\n"
        code, got, _ = self.req("POST", PODS, raw=body, ctype="application/yaml")
        self.assertEqual((code, got["metadata"]["namespace"]), (201, "default"), got)
        code, err, _ = self.req("POST", PODS, raw=b"kind: Node\nmetadata: {name: y1}\n", ctype="application/yaml")
        self.assertEqual((code, err["reason"]), (400, "BadRequest"))
        self.assertIn("the object kind is Node", err["message"])

    def test_chunked_request_body(self):
        data = json.dumps(fh.pod("chunky")).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
        conn.request("POST", PODS, body=iter([data[:10], data[10:]]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        self.assertEqual(r.status, 201, r.read())
        conn.close()

    # ---- resourceVersions not reached yet ----
    def test_watch_from_a_future_version_waits_then_504(self):
        rv = int(self.fake.call("/_fake/stats")["resourceVersion"])
        t0 = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
        conn.request("GET", "/api/v1/nodes?watch=true&resourceVersion=%d" % (rv + 5))
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        [frame] = [json.loads(x) for x in r.read().decode().splitlines() if x]
        conn.close()
        self.assertGreaterEqual(time.time() - t0, 0.45)
        self.assertEqual(frame["type"], "ERROR")
        s = frame["object"]
        self.assertEqual((s["code"], s["reason"]), (504, "Timeout"))
        self.assertEqual(s["message"], "Timeout: Too large resource version: %d, current: %d" % (rv + 5, rv))
        self.assertEqual(s["details"]["causes"][0]["reason"], "ResourceVersionTooLarge")
        code, err, _ = self.req("GET", "/api/v1/nodes?resourceVersion=%d" % (rv + 5))
        self.assertEqual((code, err["reason"]), (504, "Timeout"))

    def test_watch_from_a_version_that_arrives_in_time(self):
        rv = int(self.fake.call("/_fake/stats")["resourceVersion"])
        out = []

        def watch():
            conn = http.client.HTTPConnection("127.0.0.1", self.fake.port, timeout=10)
            conn.request("GET", "/api/v1/nodes?watch=true&timeoutSeconds=2&resourceVersion=%d" % (rv + 1))
            out.extend(json.loads(x) for x in conn.getresponse().read().decode().splitlines() if x)
            conn.close()
        t = threading.Thread(target=watch)
        t.start()
        # The watch is waiting for rv+1 before the store reaches it.
        deadline = time.monotonic() + 10
        while self.fake.call("/_fake/stats")["rv_waiters"] != 1:
            self.assertLess(time.monotonic(), deadline, "the watch never waited for rv+1")
            time.sleep(0.01)
        self.fake.put(fh.node("gke_a3_h100_node.json", "n-1"))  # rv+1: waited for, not sent
        self.fake.put(fh.node("gke_a3_h100_node.json", "n-2"))  # rv+2: sent
        t.join()
        self.assertEqual([(f["type"], f["object"]["metadata"]["name"]) for f in out], [("ADDED", "n-2")])


class ImmediateDeletionTest(Base, unittest.TestCase):
    extra = ("--pod-deletion", "immediate")

    def test_bound_pod_is_deleted_at_once(self):
        self.pod("bound", node_name="gpu-node-1")
        self.assertEqual(self.req("DELETE", PODS + "/bound")[0], 200)
        self.assertEqual(self.req("GET", PODS + "/bound")[0], 404)
        # and the control call switches it back
        self.fake.call("/_fake/pod_deletion", {"mode": "graceful"})
        self.pod("bound", node_name="gpu-node-1")
        self.req("DELETE", PODS + "/bound")
        self.assertEqual(self.req("GET", PODS + "/bound")[0], 200)


if __name__ == "__main__":
    unittest.main()
