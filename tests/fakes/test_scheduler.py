#!/usr/bin/python3
"""A test scheduler that allocates DRA ResourceClaims the way kube-scheduler's
DynamicResources plugin does, for duet's DRA lending tests (issue 26). It talks
to the fake apiserver (tests/fakes/fake_apiserver.py) only over its HTTP API,
so the validating admission webhooks registered on `resourceclaims/status`
see every allocation it writes. Stdlib only.

What it does for one pending pod (`schedule(namespace, name)`):

  claims   the pod's spec.resourceClaims: a `resourceClaimName` is read as is;
           a `resourceClaimTemplateName` gets the claim the resourceclaim
           controller would make (generateName `<pod>-<claim>-`, annotation
           `resource.kubernetes.io/pod-claim-name`, the pod as controller
           owner, pod status.resourceClaimStatuses) unless the pod's status
           already names one. A container asking for an extended resource
           (e.g. `nvidia.com/gpu: 2`) that a DeviceClass names in
           spec.extendedResourceName (KEP-5004; the class created last wins,
           ties to the lexicographically first name), or as
           `deviceclass.resource.kubernetes.io/<class>`, gets one ExactCount
           request in a claim the scheduler makes at PreBind (below).
  Filter   per node with slices (sorted by name), every request of every
           unallocated claim is matched against the node's devices: the
           ResourceSlices with spec.nodeName = node, of each pool only the
           highest generation; devices already in some claim's
           status.allocation (or picked for an earlier request) are excluded;
           a device is excluded by a NoSchedule or NoExecute taint (in the
           slice's device.taints or from a DeviceTaintRule whose
           deviceSelector's driver/pool/device match) unless a toleration of
           the request tolerates it (operator Exists or Equal, empty key with
           Exists tolerates all, empty effect matches any effect); effect
           None excludes nothing. The device must satisfy the DeviceClass's
           and the request's selectors. `allocationMode: ExactCount`
           (default, `count` default 1) takes the first matching devices in
           pool/device order; `All` takes every matching device on the node
           and fails if one of them is allocated or tainted, or the pool is
           incomplete (fewer slices than resourceSliceCount). A claim already
           allocated pins the pod to its node. The first node where all
           requests fit wins (no scoring).
  PreBind  after `prebind_delay` seconds: the extended-resource claim is
           created (generateName `<pod>-extended-resources-`, annotation
           `resource.kubernetes.io/extended-resource-claim: "true"`) and the
           pod's status.extendedResourceClaimStatus written; then each
           claim's status is written with one PUT to `/status`:
           status.allocation {devices.results[{request, driver, pool,
           device[, tolerations]}], nodeSelector matchFields metadata.name In
           [node]} and status.reservedFor [{resource: pods, name, uid}]. A
           refused write (a webhook's denial, a 409) raises PreBindError; the
           claims this attempt already allocated get their status cleared
           (as Unreserve does) and the pod stays unbound.
  Bind     POST pods/<name>/binding to the node.

CEL: selectors are parsed, not evaluated by a CEL engine. Understood forms,
joined by `&&`: `device.driver == "X"` and
`device.attributes["DOMAIN"].NAME == LITERAL` (LITERAL a quoted string, an
integer, true or false; an unqualified attribute of a device belongs to its
driver's domain). Any other expression raises UnsupportedCel naming the
field it came from.

Races (what duet's webhook must close later):
  stale_cache=True  decisions use the snapshot of slices, DeviceTaintRules,
                    DeviceClasses and claims taken by `refresh()` (at
                    construction, and whenever the test calls it), as an
                    informer cache that has not caught up would.
  prebind_delay=S   sleeps S seconds between Filter and PreBind; `filtered`
                    (a threading.Event) is set when Filter has decided.

Not modelled: scoring, preemption, firstAvailable (prioritized lists, it
raises UnsupportedRequest), constraints (matchAttribute), adminAccess,
consumable capacity and shared counters (a GPU and its MIG siblings can be
allocated to different claims), slices for allNodes/nodeSelector, claim
config, the delete-protection finalizer, device-plugin extended resources in
Node.status.allocatable, and CPU/memory fit.
"""

import http.client
import json
import re
import threading
import time
import urllib.parse

DRA = "/apis/resource.k8s.io"
EXTENDED_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


class ApiError(Exception):
    """A non-2xx answer: `code`, the Status `body`, its message."""

    def __init__(self, code, body, what):
        self.code = code
        self.body = body
        self.message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__("%s: HTTP %d: %s" % (what, code, self.message))


class SchedulingError(Exception):
    """No node fits the pod (Filter), or its claims cannot be read."""


class UnsupportedCel(SchedulingError):
    """A selector this scheduler does not parse (see the module docstring)."""


class UnsupportedRequest(SchedulingError):
    """A request form this scheduler does not model (firstAvailable)."""


class PreBindError(Exception):
    """Writing a claim's status, or the extended-resource claim, was refused."""

    def __init__(self, msg, cause):
        super().__init__(msg)
        self.cause = cause


class Client:
    """JSON over HTTP to the apiserver at `url` (http://host:port)."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port

    def call(self, method, path, body=None, ctype="application/json"):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        obj = json.loads(text) if text else None
        if r.status >= 300:
            raise ApiError(r.status, obj, "%s %s" % (method, path))
        return obj

    def items(self, path):
        return self.call("GET", path)["items"]


# ---- CEL (the two equality forms only) ----

_LIT = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|-?\d+|true|false'
_DRIVER = re.compile(r'^device\.driver\s*==\s*(%s)$' % _LIT)
_ATTR = re.compile(r'^device\.attributes\[\s*("[^"]+"|\'[^\']+\')\s*\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*(%s)$' % _LIT)
_SPLIT = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|&&|[^"\'&]+|&')


def _literal(text):
    if text[0] in "\"'":
        return text[1:-1].encode().decode("unicode_escape")
    if text in ("true", "false"):
        return text == "true"
    return int(text)


def parse_cel(expr, field):
    """A list of ("driver", value) / ("attr", domain, name, value) terms that
    must all hold, or UnsupportedCel naming `field`."""
    parts, cur = [], ""
    for tok in _SPLIT.findall(expr):
        if tok == "&&":
            parts.append(cur)
            cur = ""
        else:
            cur += tok
    parts.append(cur)
    terms = []
    for part in parts:
        part = part.strip()
        m = _DRIVER.match(part)
        if m:
            terms.append(("driver", _literal(m.group(1))))
            continue
        m = _ATTR.match(part)
        if m:
            terms.append(("attr", m.group(1)[1:-1], m.group(2), _literal(m.group(3))))
            continue
        raise UnsupportedCel('%s: unsupported CEL %r: the test scheduler understands only '
                             'device.driver == "..." and device.attributes["DOMAIN"].NAME == LITERAL, '
                             'joined by &&' % (field, expr))
    return terms


def _attribute(driver, device, domain, name):
    attrs = device.get("attributes") or {}
    val = attrs.get(domain + "/" + name)
    if val is None and domain == driver:
        val = attrs.get(name)
    if val is None:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in val:
            return val[kind]
    return None


def cel_matches(terms, driver, device):
    for t in terms:
        if t[0] == "driver":
            if driver != t[1]:
                return False
        else:
            got = _attribute(driver, device, t[1], t[2])
            # CEL is typed: 1 == true is an error there, a mismatch here.
            if got is None or type(got) is not type(t[3]) or got != t[3]:
                return False
    return True


# ---- taints ----

def tolerates(tol, taint):
    """Whether one toleration tolerates one taint (the pod toleration rules,
    which DRA device tolerations follow)."""
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    op = tol.get("operator") or "Equal"
    if op == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    if op == "Equal":
        return tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or "")
    return False


def _rule_selects(rule, driver, pool, device):
    sel = (rule.get("spec") or {}).get("deviceSelector") or {}
    return all(not sel.get(k) or sel[k] == v for k, v in (("driver", driver), ("pool", pool), ("device", device)))


class Snapshot:
    """What Filter decides on: slices, taint rules, classes, claims."""

    def __init__(self, slices, rules, classes, claims):
        self.slices, self.rules, self.classes, self.claims = slices, rules, classes, claims

    def allocated(self):
        out = set()
        for c in self.claims:
            alloc = (c.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                out.add((r.get("driver"), r.get("pool"), r.get("device")))
        return out

    def node_devices(self, node):
        """(driver, pool, device object, slice taints, pool complete) of a
        node, of each pool only its highest generation, in pool/device order."""
        pools = {}
        for s in self.slices:
            spec = s.get("spec") or {}
            if spec.get("nodeName") != node:
                continue
            key = (spec.get("driver"), spec["pool"]["name"])
            gen = spec["pool"].get("generation", 0)
            have = pools.get(key)
            if have is None or gen > have[0]:
                pools[key] = (gen, [s])
            elif gen == have[0]:
                have[1].append(s)
        out = []
        for (driver, pool), (_, slices) in sorted(pools.items()):
            complete = len(slices) >= max(s["spec"]["pool"].get("resourceSliceCount", 1) for s in slices)
            for s in slices:
                for d in s["spec"].get("devices") or []:
                    out.append((driver, pool, d, complete))
        return out

    def taints(self, driver, pool, device):
        out = list(device.get("taints") or [])
        out += [r["spec"]["taint"] for r in self.rules if _rule_selects(r, driver, pool, device["name"])]
        return out


class TestScheduler:
    """Not thread-safe: one schedule() at a time per instance."""

    def __init__(self, url, stale_cache=False, prebind_delay=0.0):
        self.api = Client(url)
        self.stale_cache = stale_cache
        self.prebind_delay = prebind_delay
        self.filtered = threading.Event()
        self.rules_path = self._find_rules_path()
        self.snap = None
        self.refresh()

    def _find_rules_path(self):
        """The served DeviceTaintRule collection (v1 at 1.37, v1beta2 at 1.36
        with the gate), or None when the server has none."""
        for version in ("v1", "v1beta2"):
            try:
                res = self.api.call("GET", "%s/%s" % (DRA, version))["resources"]
            except ApiError:
                continue
            if any(r["name"] == "devicetaintrules" for r in res):
                return "%s/%s/devicetaintrules" % (DRA, version)
        return None

    def refresh(self):
        """Takes a new snapshot (what a stale cache decides on)."""
        self.snap = self._read()

    def _read(self):
        return Snapshot(self.api.items(DRA + "/v1/resourceslices"),
                        self.api.items(self.rules_path) if self.rules_path else [],
                        self.api.items(DRA + "/v1/deviceclasses"),
                        self.api.items(DRA + "/v1/resourceclaims"))

    # ---- claims of a pod ----

    def _claim_path(self, ns, name=""):
        return "%s/v1/namespaces/%s/resourceclaims%s" % (DRA, ns, "/" + name if name else "")

    def _pod_claims(self, pod):
        """The pod's ResourceClaim objects, making those of templates as the
        resourceclaim controller would."""
        ns, pname = pod["metadata"]["namespace"], pod["metadata"]["name"]
        statuses = {s["name"]: s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claims, new_statuses = [], []
        for i, pc in enumerate(pod["spec"].get("resourceClaims") or []):
            field = "pods/%s spec.resourceClaims[%d]" % (pname, i)
            if pc.get("resourceClaimName"):
                name = pc["resourceClaimName"]
            elif pc.get("resourceClaimTemplateName"):
                name = statuses.get(pc["name"])
                if not name:
                    try:
                        tmpl = self.api.call("GET", "%s/v1/namespaces/%s/resourceclaimtemplates/%s"
                                             % (DRA, ns, pc["resourceClaimTemplateName"]))
                    except ApiError as e:
                        raise SchedulingError("%s.resourceClaimTemplateName: %s" % (field, e))
                    md = dict((tmpl["spec"].get("metadata") or {}))
                    md.update({"generateName": "%s-%s-" % (pname, pc["name"]), "namespace": ns,
                               "annotations": dict(md.get("annotations") or {},
                                                   **{"resource.kubernetes.io/pod-claim-name": pc["name"]}),
                               "ownerReferences": [self._owner(pod)]})
                    made = self.api.call("POST", self._claim_path(ns), {
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": md,
                        "spec": tmpl["spec"]["spec"]})
                    name = made["metadata"]["name"]
                new_statuses.append({"name": pc["name"], "resourceClaimName": name})
            else:
                raise SchedulingError("%s: needs resourceClaimName or resourceClaimTemplateName" % field)
            try:
                claims.append(self.api.call("GET", self._claim_path(ns, name)))
            except ApiError as e:
                raise SchedulingError("%s: claim %s: %s" % (field, name, e))
        if new_statuses and [s for s in new_statuses if statuses.get(s["name"]) != s["resourceClaimName"]]:
            pod.setdefault("status", {})["resourceClaimStatuses"] = new_statuses
            pod.update(self.api.call("PUT", "/api/v1/namespaces/%s/pods/%s/status" % (ns, pname), pod))
        return claims

    @staticmethod
    def _owner(pod):
        return {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def _extended_class(self, resource, classes):
        if resource.startswith(EXTENDED_CLASS_PREFIX):
            name = resource[len(EXTENDED_CLASS_PREFIX):]
            return name if any(c["metadata"]["name"] == name for c in classes) else None
        named = [c for c in classes if (c.get("spec") or {}).get("extendedResourceName") == resource]
        if not named:
            return None
        # The class created last wins; ties go to the first name.
        named.sort(key=lambda c: c["metadata"]["name"])
        named.sort(key=lambda c: c["metadata"].get("creationTimestamp", ""), reverse=True)
        return named[0]["metadata"]["name"]

    def _extended_requests(self, pod, classes):
        """(request, mapping) pairs for the pod's DRA-backed extended resources."""
        reqs, maps = [], []
        for ci, c in enumerate(pod["spec"].get("containers") or []):
            res = c.get("resources") or {}
            asked = dict(res.get("limits") or {}, **(res.get("requests") or {}))
            for ri, (rname, qty) in enumerate(sorted(asked.items())):
                if "/" not in rname or rname.startswith("kubernetes.io/"):
                    continue
                cls = self._extended_class(rname, classes)
                if cls is None:
                    continue
                try:
                    count = int(qty)
                except ValueError:
                    raise SchedulingError("pods/%s spec.containers[%d].resources: %s: %r is not a whole number"
                                          % (pod["metadata"]["name"], ci, rname, qty))
                name = "container-%d-request-%d" % (ci, ri)
                reqs.append({"name": name, "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount",
                                                      "count": count}})
                maps.append({"containerName": c["name"], "resourceName": rname, "requestName": name})
        return reqs, maps

    # ---- Filter ----

    def _request_terms(self, snap, req, field):
        cls_name = req.get("deviceClassName")
        cls = next((c for c in snap.classes if c["metadata"]["name"] == cls_name), None)
        if cls is None:
            raise SchedulingError("%s.deviceClassName: DeviceClass %r not found" % (field, cls_name))
        terms = []
        for i, s in enumerate((cls.get("spec") or {}).get("selectors") or []):
            terms += parse_cel((s.get("cel") or {}).get("expression", ""),
                               "deviceclasses/%s spec.selectors[%d].cel.expression" % (cls_name, i))
        for i, s in enumerate(req.get("selectors") or []):
            terms += parse_cel((s.get("cel") or {}).get("expression", ""),
                               "%s.selectors[%d].cel.expression" % (field, i))
        return terms

    def _fit(self, snap, node, claims, taken):
        """The results per claim name on `node`, or None."""
        devices = snap.node_devices(node)
        picked = set()
        out = {}
        for cname, spec_requests, field in claims:
            results = []
            for ri, req in enumerate(spec_requests):
                rfield = "%s.spec.devices.requests[%d]" % (field, ri)
                if req.get("firstAvailable"):
                    raise UnsupportedRequest("%s.firstAvailable: not modelled by the test scheduler" % rfield)
                ex = req.get("exactly") or {}
                terms = self._request_terms(snap, ex, rfield + ".exactly")
                tols = ex.get("tolerations") or []
                mode = ex.get("allocationMode") or "ExactCount"
                matching = []
                for driver, pool, dev, complete in devices:
                    if not cel_matches(terms, driver, dev):
                        continue
                    key = (driver, pool, dev["name"])
                    bad = [t for t in snap.taints(driver, pool, dev) if t.get("effect") in TAINT_EFFECTS
                           and not any(tolerates(tol, t) for tol in tols)]
                    usable = key not in taken and key not in picked and not bad
                    matching.append((key, usable, complete))
                if mode == "All":
                    if not matching or not all(u and c for _, u, c in matching):
                        return None
                    chosen = [k for k, _, _ in matching]
                elif mode == "ExactCount":
                    n = ex.get("count", 1)
                    chosen = [k for k, u, _ in matching if u][:n]
                    if len(chosen) < n:
                        return None
                else:
                    raise SchedulingError("%s.exactly.allocationMode: unknown mode %r" % (rfield, mode))
                for driver, pool, dev in chosen:
                    picked.add((driver, pool, dev))
                    r = {"request": req["name"], "driver": driver, "pool": pool, "device": dev}
                    if tols:
                        r["tolerations"] = tols
                    results.append(r)
            out[cname] = results
        return out

    def filter(self, pod, claims, extended):
        """(node, {claim name: results}) for the first node that fits."""
        snap = self.snap if self.stale_cache else self._read()
        pinned = None
        pending = []
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation")
            if alloc:
                terms = (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
                for t in terms:
                    for f in t.get("matchFields") or []:
                        if f.get("key") == "metadata.name" and f.get("values"):
                            pinned = f["values"][0]
            else:
                pending.append((c["metadata"]["name"], c["spec"]["devices"].get("requests") or [],
                                "resourceclaims/%s" % c["metadata"]["name"]))
        if extended:
            pending.append((None, extended, "pods/%s extended resources" % pod["metadata"]["name"]))
        nodes = sorted({s["spec"].get("nodeName") for s in snap.slices if s["spec"].get("nodeName")})
        if pinned:
            nodes = [n for n in nodes if n == pinned]
        taken = snap.allocated()
        for node in nodes:
            fit = self._fit(snap, node, pending, taken)
            if fit is not None:
                return node, fit
        raise SchedulingError("pods/%s: 0/%d nodes have the devices its claims ask for"
                              % (pod["metadata"]["name"], len(nodes)))

    # ---- PreBind and Bind ----

    @staticmethod
    def allocation(node, results):
        return {"devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}

    def _write_status(self, pod, claim, node, results):
        claim = dict(claim)
        claim["status"] = dict(claim.get("status") or {}, allocation=self.allocation(node, results))
        reserved = list(claim["status"].get("reservedFor") or [])
        if not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
            reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        claim["status"]["reservedFor"] = reserved
        ns = claim["metadata"]["namespace"]
        return self.api.call("PUT", self._claim_path(ns, claim["metadata"]["name"]) + "/status", claim)

    def schedule(self, namespace, name):
        """Schedules one pod: returns the node it was bound to. Raises
        SchedulingError (no node fits; pod unchanged), PreBindError (a status
        write refused; pod unbound) or ApiError."""
        self.filtered.clear()
        pod = self.api.call("GET", "/api/v1/namespaces/%s/pods/%s" % (namespace, name))
        claims = self._pod_claims(pod)
        snap_classes = (self.snap if self.stale_cache else self._read()).classes
        extended, mappings = self._extended_requests(pod, snap_classes)
        node, fit = self.filter(pod, claims, extended)
        self.filtered.set()
        if self.prebind_delay:
            time.sleep(self.prebind_delay)
        done = []
        try:
            if extended:
                made = self.api.call("POST", self._claim_path(namespace), {
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"generateName": "%s-extended-resources-" % name, "namespace": namespace,
                                 "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                                 "ownerReferences": [self._owner(pod)]},
                    "spec": {"devices": {"requests": extended}}})
                claims.append(made)
                fit[made["metadata"]["name"]] = fit.pop(None)
                pod.setdefault("status", {})["extendedResourceClaimStatus"] = {
                    "resourceClaimName": made["metadata"]["name"], "requestMappings": mappings}
                pod = self.api.call("PUT", "/api/v1/namespaces/%s/pods/%s/status" % (namespace, name), pod)
            for c in claims:
                results = fit.get(c["metadata"]["name"])
                if results is None:
                    continue  # allocated before; only reserved below for this pod
                done.append(self._write_status(pod, c, node, results))
            for c in claims:
                if c["metadata"]["name"] not in fit:
                    self._reserve(pod, c)
        except ApiError as e:
            self._unreserve(done)
            raise PreBindError("pods/%s: PreBind: %s" % (name, e), e)
        self.api.call("POST", "/api/v1/namespaces/%s/pods/%s/binding" % (namespace, name), {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        return node

    def _reserve(self, pod, claim):
        cur = self.api.call("GET", self._claim_path(claim["metadata"]["namespace"], claim["metadata"]["name"]))
        reserved = list(cur["status"].get("reservedFor") or [])
        if any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
            return
        reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        cur["status"]["reservedFor"] = reserved
        self.api.call("PUT", self._claim_path(cur["metadata"]["namespace"], cur["metadata"]["name"]) + "/status",
                      cur)

    def _unreserve(self, written):
        for c in written:
            c = dict(c, status={})
            try:
                self.api.call("PUT", self._claim_path(c["metadata"]["namespace"], c["metadata"]["name"])
                              + "/status", c)
            except ApiError:
                pass  # best effort, as Unreserve's

    def schedule_pending(self, scheduler_name=None):
        """Schedules every pod with no spec.nodeName (of `scheduler_name` when
        given); returns {namespace/name: node or the exception}."""
        out = {}
        for p in self.api.items("/api/v1/pods"):
            if p["spec"].get("nodeName") or (scheduler_name and p["spec"].get("schedulerName") != scheduler_name):
                continue
            key = "%s/%s" % (p["metadata"]["namespace"], p["metadata"]["name"])
            try:
                out[key] = self.schedule(p["metadata"]["namespace"], p["metadata"]["name"])
            except (SchedulingError, PreBindError, ApiError) as e:
                out[key] = e
                if isinstance(e, (SchedulingError, PreBindError)):
                    self.mark_unschedulable(p, str(e))
        return out

    def mark_unschedulable(self, pod, message):
        """Writes the PodScheduled=False/Unschedulable condition kube-scheduler
        writes for a pod no node fits (what duet's lending watches for). The
        condition's transition time changes only when its status does; a
        write that loses a race (409) or finds the pod gone is dropped."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            cur = self.api.call("GET", "/api/v1/namespaces/%s/pods/%s" % (ns, name))
        except ApiError:
            return
        if cur["spec"].get("nodeName"):
            return
        status = cur.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        old = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
        since = old[0].get("lastTransitionTime") if old and old[0].get("status") == "False" else None
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": message[:1024],
                      "lastTransitionTime": since or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        status["conditions"] = conds
        try:
            self.api.call("PUT", "/api/v1/namespaces/%s/pods/%s/status" % (ns, name), cur)
        except ApiError:
            pass


def main(argv=None):
    """Runs as a scheduler process: every --interval seconds, schedules every
    pending pod of --scheduler-name (kube-scheduler's default profile name by
    default) and prints one JSON line per attempt ({"pod", "node"} or
    {"pod", "error", "kind"}). Stops on SIGTERM."""
    import argparse
    import signal
    import sys

    p = argparse.ArgumentParser(description="DRA test scheduler (see the module docstring)")
    p.add_argument("--server", required=True, help="the fake apiserver, http://host:port")
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--scheduler-name", default="default-scheduler",
                   help="pods whose spec.schedulerName is this (or unset)")
    p.add_argument("--stale-cache", action="store_true",
                   help="decide on a snapshot refreshed only every --refresh-every rounds")
    p.add_argument("--refresh-every", type=int, default=5)
    p.add_argument("--prebind-delay", type=float, default=0.0)
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sched = TestScheduler(args.server, stale_cache=args.stale_cache, prebind_delay=args.prebind_delay)
    rounds = 0
    while not stop.is_set():
        if args.stale_cache and rounds % max(1, args.refresh_every) == 0:
            sched.refresh()
        rounds += 1
        try:
            pods = sched.api.items("/api/v1/pods")
        except (ApiError, OSError) as e:
            print(json.dumps({"error": str(e), "kind": "list"}), flush=True)
            stop.wait(args.interval)
            continue
        for pod in pods:
            if pod["spec"].get("nodeName") or pod.get("metadata", {}).get("deletionTimestamp"):
                continue
            if (pod["spec"].get("schedulerName") or "default-scheduler") != args.scheduler_name:
                continue
            key = "%s/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"])
            try:
                node = sched.schedule(pod["metadata"]["namespace"], pod["metadata"]["name"])
                print(json.dumps({"pod": key, "node": node}), flush=True)
            except (SchedulingError, PreBindError) as e:
                sched.mark_unschedulable(pod, str(e))
                print(json.dumps({"pod": key, "error": str(e), "kind": type(e).__name__}), flush=True)
            except (ApiError, OSError) as e:
                print(json.dumps({"pod": key, "error": str(e), "kind": "api"}), flush=True)
        stop.wait(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
