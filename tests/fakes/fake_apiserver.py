#!/usr/bin/python3
"""A fake Kubernetes API server for duet's tests (Python 3 stdlib; python3-yaml
for YAML apply bodies and python3-kubernetes for field validation, both
optional and loaded when used).

It speaks the real wire protocol for what duet and the README's commands use,
so real clients (kubectl, python3-kubernetes, @kubernetes/client-node) and
duet's own client can be tested against it. What it does not do is listed in
tests/fakes/README.md.

  discovery   GET /version, /api, /apis, /api/v1, /apis/<group>[/<version>],
              /openapi/v3[/<group-version>] (kubectl create/apply -f validate
              server-side with fieldValidation=Strict)
  core/v1     nodes, namespaces (cluster-scoped); pods, events (namespaced and
              across namespaces); POST pods/{name}/binding and bindings;
              POST pods/{name}/eviction (a policy/v1 Eviction)
  groups      coordination.k8s.io/v1 leases, events.k8s.io/v1 events,
              policy/v1 poddisruptionbudgets (namespaced and across namespaces);
              resource.k8s.io/v1 resourceslices, deviceclasses (cluster-scoped),
              resourceclaims (with status), resourceclaimtemplates; and
              devicetaintrules (with status) at the release's version
              (--kube-version 1.36: v1beta2 behind --feature-gates
              DRADeviceTaints=true; 1.37: v1); admissionregistration.k8s.io/v1
              validatingwebhookconfigurations, whose webhooks the fake calls
              (the DRA block: tests/fakes/README.md says what it checks);
              gang kinds (the gang block): with --gang-crds
              scheduling.x-k8s.io/v1alpha1 podgroups, jobset.x-k8s.io/v1alpha2
              jobsets, leaderworkerset.x-k8s.io/v1 leaderworkersets; with
              --feature-gates GenericWorkload=true scheduling.k8s.io workloads
              (and podgroups from 1.36) at the release's version
  verbs       GET one, list (labelSelector, fieldSelector, limit/continue,
              resourceVersion), watch, POST (generateName), PUT (409 Conflict on
              a stale metadata.resourceVersion), PATCH (JSON Patch, merge patch,
              strategic merge patch, server-side apply; tests/fakes/patches.py),
              DELETE (DeleteOptions: gracePeriodSeconds, preconditions)

Request bodies are JSON (YAML for apply); of kubectl's protobuf bodies a
Namespace is decoded (tests/fakes/protobuf.py), others get a 415.
Writes honour `fieldValidation` (Strict: 400 on unknown fields; Warn: a
Warning header) and `dryRun=All`. A DELETE of a pod bound to a node is
graceful, as without a kubelet nothing else ends it: the pod gets
deletionTimestamp and deletionGracePeriodSeconds (DeleteOptions, else
spec.terminationGracePeriodSeconds, else 30) and stays until the grace period
ends, a DELETE with gracePeriodSeconds=0 comes, or the test says the kubelet is
done (POST /_fake/delete); `--pod-deletion immediate` (or POST
/_fake/pod_deletion) restores immediate deletion. An object with
metadata.finalizers stays, marked, until an update empties them. A binding sets
spec.nodeName and the PodScheduled=True condition.

An eviction follows kube-apiserver's rules: 404 for a missing pod, 409 when
deleteOptions.preconditions do not match, 400 for a body that is not an
Eviction named as the URL; a pod that is Pending, Succeeded, Failed or being
deleted is deleted at once; otherwise the PodDisruptionBudgets of the pod's
namespace whose spec.selector matches its labels decide: more than one is a
500; one with status.disruptionsAllowed 0 (or missing) answers 429
TooManyRequests (cause DisruptionBudget; an unready pod passes while
currentHealthy >= desiredHealthy > 0 or with unhealthyPodEvictionPolicy
AlwaysAllow); else the budget loses one disruption (status written: MODIFIED)
and the pod is deleted as a DELETE with the Eviction's deleteOptions would
(graceful for a bound pod); 201 Success. There is no disruption controller:
a budget's status is what the test stored (create it, then write status
through the status subresource or /_fake/put) and only evictions change it.
Evictions appear in /_fake/requests like every API request.

Watches (`watch=` in any Go ParseBool form) stream newline-delimited
{"type","object"} frames over chunked encoding, replay from `resourceVersion`,
send BOOKMARK frames when `allowWatchBookmarks` is true, end after
`timeoutSeconds`, and answer a resourceVersion older than the retained event
window with an ERROR frame carrying a 410 Gone Status (as the watch cache
does), or with an HTTP 410 when the control API asks for that form. A watch or
list from a resourceVersion the fake has not reached yet waits up to
--too-large-wait seconds (3, the watch cache's) for it, then ends with a 504
"Too large resource version" Status (an ERROR frame for a watch).

Error replies are Status objects with kind, apiVersion, metadata, status,
message, reason, details {name, group, kind[, causes][, retryAfterSeconds]}
and code, with a Retry-After header when retryAfterSeconds is set.

Control API (tests drive the fake through it; JSON bodies):
  POST /_fake/put       an object (Node/Pod/Event/Lease/Namespace/
                        PodDisruptionBudget; apiVersion events.k8s.io/v1 for
                        the new Event): create or replace
  POST /_fake/delete    {"kind","namespace","name"[,"apiVersion"]}: remove now
                        (for a pod: the kubelet has stopped it)
  POST /_fake/pod_deletion {"mode": "graceful" | "immediate"}
  POST /_fake/drop      close every open watch mid-stream (no final chunk)
  POST /_fake/garbage   {"text": "..."} write a non-JSON line into every watch
  POST /_fake/bigframe  {"bytes": N} write one N-byte frame into every watch
  POST /_fake/bookmark  send a BOOKMARK now to every watch that allows them
  POST /_fake/compact   forget all retained events: older versions get 410;
                        {"expire_watches": true} also ends open watches with 410
  POST /_fake/gone_mode {"mode": "frame" | "http"}
  POST /_fake/mangle    {"duplicate": N, "reorder": M}: the next N watch events
                        (any watch) are each sent twice; the next M batches are
                        sent out of order: two events of one batch swapped, or
                        a lone event held back until after the next event of its
                        watch (at most 0.3 s; no BOOKMARK passes a held event)
  POST /_fake/slow      {"delay_ms": N} delay every reply and every frame
  POST /_fake/fail      {"count": N, "code": 500} fail the next N API requests
  GET  /_fake/requests  the API requests seen: [{"method","path","auth","body"}]
  GET  /_fake/stats     {"watches": open watches, "resourceVersion": N,
                         "rv_waiters": requests waiting for a future resourceVersion}
  POST /_fake/token     register a bearer token for TokenReview (below)
  POST /_fake/webhook_service {"namespace","name","port","url"}: where a
                        webhook's clientConfig.service points (https://host:port;
                        its certificate must name <name>.<namespace>.svc)

TokenReview (authentication.k8s.io/v1, POST /apis/authentication.k8s.io/v1/tokenreviews):
tokens are registered by the test with POST /_fake/token {"token", "username",
"groups", "extra", "audiences", "expires_in"} ({"token", "revoke": true} forgets
one). A review answers authenticated only for a registered, unexpired token
whose audiences meet spec.audiences (status.audiences is the intersection),
with the error messages the API server uses otherwise.

Usage: fake_apiserver.py [--port 0] [--port-file F] [--tls-cert C --tls-key K]
       [--client-ca CA] [--token T] [--bookmark-interval S] [--window N]
       [--pod-deletion graceful|immediate] [--too-large-wait S]
       [--kube-version 1.35|1.36|1.37 [--feature-gates DRADeviceTaints=true,GenericWorkload=true]]
       [--gang-crds]
       [--parent-pid PID]
With --port 0 the chosen port is printed as "PORT <n>" on stdout.
"""

import argparse
import base64
import copy
import datetime
import http.client
import http.server
import json
import os
import re
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patches  # noqa: E402
import protobuf  # noqa: E402
import schema  # noqa: E402

GIT_VERSION = "v1.32.0-fake"
RW = ["create", "delete", "get", "list", "patch", "update", "watch"]  # no deletecollection


class Resource:
    """One served resource type. `key` names it in the store and the event log:
    the kind for the core group, kind.group otherwise."""

    def __init__(self, kind, plural, group, version, namespaced, short=(), categories=(),
                 model=None, subresources=()):
        self.kind, self.plural, self.group, self.version = kind, plural, group, version
        self.namespaced = namespaced
        self.short, self.categories, self.model = list(short), list(categories), model
        self.subresources = subresources
        self.key = kind if not group else "%s.%s" % (kind, group)
        self.gv = version if not group else "%s/%s" % (group, version)
        self.prefix = "/api/" + version if not group else "/apis/%s/%s" % (group, version)
        self.qualified = plural if not group else "%s.%s" % (plural, group)

    def discovery(self):
        out = [{"name": self.plural, "singularName": self.kind.lower(), "namespaced": self.namespaced,
                "kind": self.kind, "verbs": RW}]
        if self.short:
            out[0]["shortNames"] = self.short
        if self.categories:
            out[0]["categories"] = self.categories
        for sub in self.subresources:
            if sub == "binding":
                out.append({"name": self.plural + "/binding", "singularName": "", "namespaced": True,
                            "kind": "Binding", "verbs": ["create"]})
            elif sub == "eviction":
                # A subresource of another group's kind: discovery names the
                # group and version (kubectl drain looks for exactly this).
                out.append({"name": self.plural + "/eviction", "singularName": "", "namespaced": True,
                            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            elif sub == "status":
                out.append({"name": self.plural + "/status", "singularName": "",
                            "namespaced": self.namespaced, "kind": self.kind,
                            "verbs": ["get", "patch", "update"]})
        return out


RESOURCES = [
    Resource("Node", "nodes", "", "v1", False, ("no",), model="V1Node", subresources=("status",)),
    Resource("Namespace", "namespaces", "", "v1", False, ("ns",), model="V1Namespace",
             subresources=("status",)),
    Resource("Pod", "pods", "", "v1", True, ("po",), ("all",), model="V1Pod",
             subresources=("binding", "eviction", "status")),
    Resource("Event", "events", "", "v1", True, ("ev",), model="CoreV1Event"),
    Resource("Lease", "leases", "coordination.k8s.io", "v1", True, model="V1Lease"),
    Resource("Event", "events", "events.k8s.io", "v1", True, ("ev",), model="EventsV1Event"),
    Resource("PodDisruptionBudget", "poddisruptionbudgets", "policy", "v1", True, ("pdb",),
             model="V1PodDisruptionBudget", subresources=("status",)),
]
BY_KEY = {r.key: r for r in RESOURCES}
BY_PATH = {(r.prefix, r.plural): r for r in RESOURCES}
GROUP_VERSIONS = {}  # "" or group -> [version], in RESOURCES order
for _r in RESOURCES:
    GROUP_VERSIONS.setdefault(_r.group, [])
    if _r.version not in GROUP_VERSIONS[_r.group]:
        GROUP_VERSIONS[_r.group].append(_r.version)
SEED_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
TOO_LARGE_RV = "Too large resource version"


def resource_for(kind, api_version=None):
    """The resource of an object's kind and apiVersion (None if not served).
    Without an apiVersion the core group wins, then the only group with it."""
    if api_version:
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        return BY_KEY.get(kind if not group else "%s.%s" % (kind, group))
    if kind in BY_KEY:
        return BY_KEY[kind]
    found = [r for r in RESOURCES if r.kind == kind]
    return found[0] if len(found) == 1 else None


def status_obj(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {},
         "status": "Failure" if code >= 300 else "Success",
         "message": message, "reason": reason, "code": code}
    if details is not None:
        s["details"] = details
    return s


class ApiError(Exception):
    """An error reply: `status` is the Status object, `code` its HTTP code."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code = code
        self.status = status_obj(code, reason, message, details)


def _details(res, name, kind=None):
    d = {"name": name}
    if res.group:
        d["group"] = res.group
    d["kind"] = kind or res.plural
    return d


def not_found(res, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (res.qualified, name), _details(res, name))


def already_exists(res, name):
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (res.qualified, name),
                    _details(res, name))


def conflict(res, name, why="the object has been modified; please apply your changes to the latest "
                            "version and try again"):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s'
                    % (res.qualified, name, why), _details(res, name))


def invalid(res, name, field, cause, detail):
    """422 Invalid with one cause: cause is a metav1.CauseType (FieldValueRequired...)."""
    d = _details(res, name, res.kind)
    d["causes"] = [{"reason": cause, "message": detail, "field": field}]
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s: %s' % (res.kind, name, field, detail), d)


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def no_route():
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed():
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                    {})


def too_large(rv, current):
    return ApiError(504, "Timeout", "Timeout: %s: %d, current: %d" % (TOO_LARGE_RV, rv, current),
                    {"causes": [{"reason": "ResourceVersionTooLarge", "message": TOO_LARGE_RV}],
                     "retryAfterSeconds": 1})


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_bool(v):
    # Go's strconv.ParseBool forms, which the apiserver accepts.
    if v in ("1", "t", "T", "true", "True", "TRUE"):
        return True
    if v in ("0", "f", "F", "false", "False", "FALSE", ""):
        return False
    raise ValueError(v)




class Selector:
    """Label selectors: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""

    def __init__(self, text):
        self.reqs = []
        text = (text or "").strip()
        if not text:
            return
        for part in re.findall(r"(?:[^,(]|\([^)]*\))+", text):
            part = part.strip()
            m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)$", part)
            if m:
                vals = {x.strip() for x in m.group(3).split(",") if x.strip()}
                self.reqs.append((m.group(1), m.group(2), vals))
                continue
            m = re.match(r"^([^\s!=]+)\s*(==|=|!=)\s*(\S*)$", part)
            if m:
                op = "!=" if m.group(2) == "!=" else "="
                self.reqs.append((m.group(1), op, m.group(3)))
                continue
            if part.startswith("!"):
                self.reqs.append((part[1:].strip(), "!", None))
                continue
            if re.match(r"^[^\s!=(),]+$", part):
                self.reqs.append((part, "exists", None))
                continue
            raise ValueError("unable to parse requirement: " + part)

    def matches(self, labels):
        labels = labels or {}
        for key, op, val in self.reqs:
            has = key in labels
            if op == "=" and labels.get(key) != val:
                return False
            if op == "!=" and has and labels[key] == val:
                return False
            if op == "exists" and not has:
                return False
            if op == "!" and has:
                return False
            if op == "in" and labels.get(key) not in val:
                return False
            if op == "notin" and has and labels[key] in val:
                return False
        return True


class FieldSelector:
    """metadata.name, metadata.namespace and spec.nodeName, = / == / !=."""

    def __init__(self, text):
        self.reqs = []
        for part in (text or "").split(","):
            part = part.strip()
            if not part:
                continue
            m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", part)
            if not m:
                raise ValueError("invalid field selector: " + part)
            self.reqs.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def matches(self, obj):
        for path, eq, val in self.reqs:
            cur = obj
            for p in path.split("."):
                cur = cur.get(p) if isinstance(cur, dict) else None
            if ((cur or "") == val) != eq:
                return False
        return True


def pdb_selects(selector, labels):
    """Whether a PodDisruptionBudget's spec.selector (a metav1.LabelSelector:
    matchLabels, matchExpressions with In/NotIn/Exists/DoesNotExist) selects a
    pod with `labels`, as the eviction subresource decides it: a missing,
    empty or invalid selector selects nothing, not everything."""
    if not isinstance(selector, dict):
        return False
    match = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match and not exprs:
        return False
    labels = labels or {}
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        has = key in labels
        if (op in ("In", "NotIn")) != bool(values):
            return False  # In/NotIn need values, Exists/DoesNotExist take none: invalid
        if op == "In":
            ok = has and labels[key] in values
        elif op == "NotIn":
            ok = not has or labels[key] not in values
        elif op == "Exists":
            ok = has
        elif op == "DoesNotExist":
            ok = not has
        else:
            return False  # an unknown operator: invalid
        if not ok:
            return False
    return True


def pod_ready(pod):
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def pdb_too_many_requests(cause, retry_after=0):
    """The 429 an eviction gets while a budget forbids it (clients retry)."""
    details = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                    details)


def pdb_allow_eviction(pdb, pod):
    """kube-apiserver's check of one PodDisruptionBudget before an eviction of
    `pod`: raises the refusal, or returns the budget's new state (one
    disruption fewer, the pod in status.disruptedPods), or None when the
    eviction does not count against the budget (an unready pod). The fake has
    no disruption controller: status is what the test stored."""
    name, spec, status = pdb["metadata"]["name"], pdb.get("spec") or {}, pdb.get("status") or {}
    if not pod_ready(pod):
        # An unready pod is not one of the healthy pods the budget protects.
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return None
        if status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0:
            return None
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 0):
        raise pdb_too_many_requests("The disruption budget %s is still being processed by the server." % name, 10)
    allowed = status.get("disruptionsAllowed", 0)
    if allowed < 0:
        raise ApiError(403, "Forbidden", 'poddisruptionbudget.policy "%s" is forbidden: pdb disruptions allowed '
                       "is negative" % name, {"name": name, "group": "policy", "kind": "poddisruptionbudget"})
    if allowed == 0:
        raise pdb_too_many_requests("The disruption budget %s needs %d healthy pods and has %d currently"
                                    % (name, status.get("desiredHealthy", 0), status.get("currentHealthy", 0)))
    new = copy.deepcopy(pdb)
    ns = new.setdefault("status", {})
    ns["disruptionsAllowed"] = allowed - 1
    # Tells the disruption controller the pod is going (it stops counting it).
    ns.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = now_rfc3339()
    if allowed == 1:
        conds = ns.setdefault("conditions", [])
        c = next((c for c in conds if c.get("type") == "DisruptionAllowed"), None)
        if c is None:
            c = {"type": "DisruptionAllowed"}
            conds.append(c)
        if c.get("status") != "False":
            c.update(status="False", lastTransitionTime=now_rfc3339())
        c.update(reason="InsufficientPods", message="", observedGeneration=ns.get("observedGeneration", 0))
    return new


class Watch:
    def __init__(self, kind, ns, sel, fsel, bookmarks):
        self.kind, self.ns, self.sel, self.fsel = kind, ns, sel, fsel
        self.bookmarks = bookmarks
        self.inbox = []  # control actions, under State.cond
        self.held = []  # events held back by "reorder", under State.cond
        self.held_since = 0.0


def rfc3339(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class State:
    """The store, the event log and the fake's knobs; everything under `cond`."""

    def __init__(self, window, bookmark_interval, pod_deletion="graceful", too_large_wait=3.0):
        self.cond = threading.Condition()
        self.rv = 100
        self.objects = {r.key: {} for r in RESOURCES}  # key -> {(ns, name): obj}
        self.log = []  # (rv, key, type, obj, old_obj)
        self.window = window
        self.floor = self.rv  # versions below this are gone
        self.watches = set()
        self.rv_waiters = 0  # requests waiting for a resourceVersion not reached yet
        self.bookmark_interval = bookmark_interval
        self.gone_mode = "frame"
        self.delay = 0.0
        self.dup_left = 0  # /_fake/mangle budgets and what they did
        self.reorder_left = 0
        self.duplicated = 0
        self.reordered = 0
        self.fail_count = 0
        self.fail_code = 500
        self.requests = []
        self.snapshots = {}  # continue token -> (rv, items)
        self.pod_deletion = pod_deletion
        self.too_large_wait = too_large_wait
        self.deadlines = {}  # (key, ns, name) -> time.time() at which a graceful delete ends
        for n, name in enumerate(SEED_NAMESPACES):
            # Present from the start, below every version a client can see.
            self.objects["Namespace"][("", name)] = namespace_obj(name, str(n + 1))

    # All mutators hold self.cond.
    def _next_rv(self):
        self.rv += 1
        return str(self.rv)

    def _record(self, key, etype, obj, old):
        self.log.append((self.rv, key, etype, copy.deepcopy(obj), old))
        if len(self.log) > self.window:
            drop = len(self.log) - self.window
            self.floor = self.log[drop - 1][0]
            del self.log[:drop]
        self.cond.notify_all()

    def put(self, obj, create_only=False, expect_rv=None, api=False, dry_run=False):
        """Create or replace `obj` (its kind and apiVersion pick the resource).
        Returns (201 or 200, stored object); raises ApiError. With `api`, the
        read-only deletion fields of a stored object are kept, and an update
        that empties the finalizers of an object being deleted removes it."""
        res = resource_for(obj.get("kind"), obj.get("apiVersion"))
        if res is None:
            raise bad_request("unknown kind %r (apiVersion %r)" % (obj.get("kind"), obj.get("apiVersion")))
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        name = md.get("name")
        if not name:
            raise invalid(res, "", "metadata.name", "FieldValueRequired",
                          "Required value: name or generateName is required")
        ns = md.get("namespace") or "default" if res.namespaced else ""
        if res.namespaced:
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        obj["apiVersion"] = res.gv
        key = (ns, name)
        old = self.objects[res.key].get(key)
        if old is not None and create_only:
            raise already_exists(res, name)
        if old is not None and expect_rv is not None and expect_rv != old["metadata"]["resourceVersion"]:
            raise conflict(res, name)
        if old is not None:
            md["uid"] = old["metadata"]["uid"]
            md["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            if api:
                for f in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                    md.pop(f, None)
                    if f in old["metadata"]:
                        md[f] = old["metadata"][f]
        elif api:
            # A create: the server's own identity and timestamps, never the client's.
            if create_only and md.get("resourceVersion"):
                raise bad_request("resourceVersion should not be set on objects to be created")
            for f in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                md.pop(f, None)
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now_rfc3339()
        else:
            md.setdefault("uid", str(uuid.uuid4()))
            md.setdefault("creationTimestamp", now_rfc3339())
        if old is None and res.kind == "Namespace":
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        if dry_run:
            md["resourceVersion"] = old["metadata"]["resourceVersion"] if old else ""
            return (200 if old is not None else 201), obj
        if api and old is not None and md.get("deletionTimestamp") and not md.get("finalizers") \
                and (res.key, ns, name) not in self.deadlines:
            return 200, self.remove(res, ns, name, final=obj)
        md["resourceVersion"] = self._next_rv()
        self.objects[res.key][key] = obj
        self._record(res.key, "MODIFIED" if old is not None else "ADDED", obj, old)
        return (200 if old is not None else 201), obj

    def remove(self, res, ns, name, final=None):
        """Removes the object now (DELETED); `final` is its last state if given."""
        key = (ns if res.namespaced else "", name)
        old = self.objects[res.key].pop(key, None)
        if old is None:
            raise not_found(res, name)
        self.deadlines.pop((res.key,) + key, None)
        obj = copy.deepcopy(final if final is not None else old)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._record(res.key, "DELETED", obj, old)
        if res.kind == "Namespace":
            for r in RESOURCES:
                if r.namespaced:
                    for (ons, oname) in sorted(self.objects[r.key]):
                        if ons == name:
                            self.remove(r, ons, oname)
        return obj

    def delete(self, res, ns, name, grace=None, preconditions=None, dry_run=False):
        """DELETE as kube-apiserver does it: preconditions, then graceful deletion
        of bound pods and finalizers. Returns the object (removed or marked)."""
        key = (ns if res.namespaced else "", name)
        cur = self.objects[res.key].get(key)
        if cur is None:
            raise not_found(res, name)
        md = cur["metadata"]
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != md["uid"]:
            raise conflict(res, name, "Precondition failed: UID in precondition: %s, UID in object meta: %s"
                           % (pre["uid"], md["uid"]))
        if pre.get("resourceVersion") and pre["resourceVersion"] != md["resourceVersion"]:
            raise conflict(res, name, "Precondition failed: ResourceVersion in precondition: %s, "
                           "ResourceVersion in object meta: %s" % (pre["resourceVersion"], md["resourceVersion"]))
        if grace is None:
            grace = 0
            if res.key == "Pod" and self.pod_deletion == "graceful":
                spec, status = cur.get("spec") or {}, cur.get("status") or {}
                if spec.get("nodeName") and status.get("phase") not in ("Succeeded", "Failed"):
                    grace = spec.get("terminationGracePeriodSeconds")
                    grace = 30 if grace is None else int(grace)
        if res.key != "Pod":
            grace = 0
        if dry_run:
            return copy.deepcopy(cur)
        finalizers = md.get("finalizers")
        if grace <= 0 and not finalizers:
            return self.remove(res, ns, name)
        new = copy.deepcopy(cur)
        nmd = new["metadata"]
        if grace > 0:
            end = time.time() + grace
            if (res.key,) + key in self.deadlines and self.deadlines[(res.key,) + key] <= end:
                return copy.deepcopy(cur)  # already ending sooner
            self.deadlines[(res.key,) + key] = end
            nmd["deletionTimestamp"] = rfc3339(end)
            nmd["deletionGracePeriodSeconds"] = grace
        else:
            self.deadlines.pop((res.key,) + key, None)
            nmd.setdefault("deletionTimestamp", now_rfc3339())
            nmd["deletionGracePeriodSeconds"] = 0
        nmd["resourceVersion"] = self._next_rv()
        self.objects[res.key][key] = new
        self._record(res.key, "MODIFIED", new, cur)
        return copy.deepcopy(new)

    def reap(self):
        """Ends the graceful deletions whose time is up, as a kubelet would: the
        pod goes, or stays with grace 0 until its finalizers are gone."""
        now = time.time()
        for dkey, end in sorted(self.deadlines.items(), key=lambda kv: kv[1]):
            if end > now:
                continue
            res, ns, name = BY_KEY[dkey[0]], dkey[1], dkey[2]
            del self.deadlines[dkey]
            if (ns, name) in self.objects[res.key]:
                self.delete(res, ns, name, grace=0)


def namespace_obj(name, rv):
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": rv,
                         "creationTimestamp": now_rfc3339(),
                         "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def watch_event(w, etype, obj, old):
    """What watch `w` sees for a change, or None (label-selector transitions)."""
    md = obj.get("metadata", {})
    if w.ns and md.get("namespace") != w.ns:
        return None

    def ok(o):
        return o is not None and w.sel.matches(o.get("metadata", {}).get("labels")) and w.fsel.matches(o)
    new_ok = ok(obj)
    if etype == "ADDED":
        return "ADDED" if new_ok else None
    if etype == "DELETED":
        return "DELETED" if ok(old) else None
    old_ok = ok(old)
    if new_ok and old_ok:
        return "MODIFIED"
    if new_ok:
        return "ADDED"
    if old_ok:
        return "DELETED"
    return None


# ---- TokenReview (authentication.k8s.io/v1) ----
# A self-contained block: the tokens the test registered, and the review.
TOKENREVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


def token_control(server, body):
    """POST /_fake/token: register (or with "revoke" forget) a bearer token."""
    tokens = server.__dict__.setdefault("tokens", {})
    token = body.get("token", "")
    if not token:
        return 400, status_obj(400, "BadRequest", "token: required")
    if body.get("revoke"):
        tokens.pop(token, None)
        return 200, {}
    expires_in = body.get("expires_in")
    tokens[token] = {
        "username": body.get("username", ""),
        "uid": body.get("uid", str(uuid.uuid4())),
        "groups": list(body.get("groups", [])),
        "extra": {k: list(v) for k, v in (body.get("extra") or {}).items()},
        "audiences": list(body.get("audiences", ["https://kubernetes.default.svc"])),
        "expires": None if expires_in is None else time.time() + float(expires_in),
    }
    return 200, {}


def token_review(server, raw):
    """The TokenReview create: 201 with the status filled in (never stored)."""
    try:
        review = json.loads(raw.decode() or "null")
        spec = review["spec"]
        token = spec["token"]
    except (ValueError, KeyError, TypeError):
        return 400, status_obj(400, "BadRequest", "TokenReview.spec.token: Required value")
    if review.get("kind") != "TokenReview" or review.get("apiVersion") != "authentication.k8s.io/v1":
        return 400, status_obj(400, "BadRequest", "expected an authentication.k8s.io/v1 TokenReview")
    wanted = spec.get("audiences") or ["https://kubernetes.default.svc"]
    t = server.__dict__.get("tokens", {}).get(token)
    status = {"authenticated": False, "user": {}}
    if t is None:
        status["error"] = "[invalid bearer token, token lookup failed]"
    elif t["expires"] is not None and time.time() >= t["expires"]:
        status["error"] = "[invalid bearer token, service account token has expired]"
    else:
        both = [a for a in wanted if a in t["audiences"]]
        if not both:
            status["error"] = "[invalid bearer token, token audiences %s is invalid for the target audiences %s]" % (
                json.dumps(t["audiences"]), json.dumps(wanted))
        else:
            status = {"authenticated": True, "audiences": both, "user": {
                "username": t["username"], "uid": t["uid"], "groups": t["groups"], "extra": t["extra"]}}
    out = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
           "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}
    return 201, out
# ---- end TokenReview ----


# ---- DRA (resource.k8s.io) and validating admission webhooks ----
# A self-contained block: the kube-apiserver rules of the resource.k8s.io kinds
# that duet's DRA lending mode (issue 26) leans on, the Kubernetes release the
# fake poses as (--kube-version), and ValidatingWebhookConfigurations, which
# the fake calls as kube-apiserver does. Handler._admit is the one entry point
# from the write paths (create, update, patch).

# --kube-version: the release whose group-versions the fake serves. None keeps
# the fake's older behaviour (v1.32.0-fake) with the GA DRA kinds at v1.
KUBE_VERSIONS = ("1.35", "1.36", "1.37")
DRA_GROUP = "resource.k8s.io"
# DRADeviceTaints: alpha in 1.33, beta (v1beta2, off by default) in 1.36, GA
# (v1, on by default) in 1.37 (KEP-5055).
FEATURE_GATES = {"DRADeviceTaints": {None: False, "1.35": False, "1.36": False, "1.37": True},
                 # The Workload API (KEP-4671): alpha in 1.35 and 1.36, beta in
                 # 1.37, off by default in all three (the gang block below).
                 "GenericWorkload": {None: False, "1.35": False, "1.36": False, "1.37": False}}
DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
DEVICE_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")
# Since 1.35 a DeviceTaintRule's selector names only these (no deviceClassName,
# no CEL selectors).
DEVICE_TAINT_SELECTOR_FIELDS = ("device", "driver", "pool")
VWC_KEY = "ValidatingWebhookConfiguration.admissionregistration.k8s.io"


def dra_ga_resources():
    """The GA kinds (resource.k8s.io/v1 since 1.34), served at every --kube-version."""
    return [
        Resource("ResourceSlice", "resourceslices", DRA_GROUP, "v1", False),
        Resource("ResourceClaim", "resourceclaims", DRA_GROUP, "v1", True, subresources=("status",)),
        Resource("ResourceClaimTemplate", "resourceclaimtemplates", DRA_GROUP, "v1", True),
        Resource("DeviceClass", "deviceclasses", DRA_GROUP, "v1", False),
        Resource("ValidatingWebhookConfiguration", "validatingwebhookconfigurations",
                 "admissionregistration.k8s.io", "v1", False, model="V1ValidatingWebhookConfiguration"),
    ]


def parse_feature_gates(text):
    """--feature-gates "A=true,B=false" (kube-apiserver's form) -> {name: bool}."""
    out = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, val = part.partition("=")
        if not sep or name not in FEATURE_GATES:
            raise ValueError("--feature-gates: unrecognized feature gate %r (known: %s)"
                             % (name or part, ", ".join(sorted(FEATURE_GATES))))
        try:
            out[name] = parse_bool(val)
        except ValueError:
            raise ValueError("--feature-gates: invalid value of %s: %r (true or false)" % (name, val))
    return out


def serve_kube_version(kube_version, gates):
    """Adds the resources `kube_version` serves beyond the GA ones to RESOURCES
    and its indexes, and sets the /version answer. Called once, before the
    State is made. DeviceTaintRule: v1beta2 in 1.36 with DRADeviceTaints on,
    v1 in 1.37 (unless the gate is turned off)."""
    global GIT_VERSION
    if kube_version is not None:
        GIT_VERSION = "v%s.0-fake" % kube_version
    on = gates.get("DRADeviceTaints", FEATURE_GATES["DRADeviceTaints"][kube_version])
    version = {"1.36": "v1beta2", "1.37": "v1"}.get(kube_version)
    if on and version:
        add_resources([Resource("DeviceTaintRule", "devicetaintrules", DRA_GROUP, version, False,
                                subresources=("status",))])
    if gates.get("GenericWorkload", FEATURE_GATES["GenericWorkload"][kube_version]):
        add_resources(workload_resources(kube_version))


def add_resources(add):
    """Serves `add` too: RESOURCES and its indexes (before the State is made)."""
    for r in add:
        RESOURCES.append(r)
        BY_KEY[r.key] = r
        BY_PATH[(r.prefix, r.plural)] = r
        GROUP_VERSIONS.setdefault(r.group, [])
        if r.version not in GROUP_VERSIONS[r.group]:
            GROUP_VERSIONS[r.group].append(r.version)


def invalid_all(res, name, errs):
    """422 Invalid with every cause, worded as kube-apiserver's: errs are
    (field, metav1.CauseType, detail). The message names the qualified kind."""
    d = _details(res, name, res.kind)
    d["causes"] = [{"reason": c, "message": m, "field": f} for f, c, m in errs]
    texts = ["%s: %s" % (f, m) for f, _, m in errs]
    qkind = res.kind if not res.group else "%s.%s" % (res.kind, res.group)
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s'
                    % (qkind, name, texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"), d)


def _subdomain_errs(field, value):
    if len(value) > 253:
        return [(field, "FieldValueInvalid", 'Invalid value: "%s": must be no more than 253 characters' % value)]
    if not re.fullmatch(DNS1123_SUBDOMAIN, value):
        return [(field, "FieldValueInvalid",
                 "Invalid value: \"%s\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
                 "'example.com', regex used for validation is '%s')" % (value, DNS1123_SUBDOMAIN))]
    return []


def _qualified_name_errs(field, value):
    """A label key: [prefix/]name, prefix a DNS subdomain, name at most 63."""
    prefix, _, name = value.rpartition("/")
    errs = []
    if "/" in value and not prefix:
        errs.append((field, "FieldValueInvalid", 'Invalid value: "%s": prefix part must be non-empty' % value))
    elif prefix:
        errs += [(f, c, m.replace("a lowercase RFC 1123", "prefix part a lowercase RFC 1123"))
                 for f, c, m in _subdomain_errs(field, prefix)]
    if not name:
        errs.append((field, "FieldValueInvalid", 'Invalid value: "%s": name part must be non-empty' % value))
    elif len(name) > 63:
        errs.append((field, "FieldValueInvalid",
                     'Invalid value: "%s": name part must be no more than 63 characters' % value))
    elif not re.fullmatch(QUALIFIED_NAME_PART, name):
        errs.append((field, "FieldValueInvalid",
                     "Invalid value: \"%s\": name part must consist of alphanumeric characters, '-', '_' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
                     "'123-abc', regex used for validation is '%s')" % (value, QUALIFIED_NAME_PART)))
    return errs


def _taint_errs(taint):
    if not isinstance(taint, dict):
        return [("spec.taint", "FieldValueRequired", "Required value")]
    errs = []
    key, value, effect = taint.get("key"), taint.get("value", ""), taint.get("effect")
    if not key:
        errs.append(("spec.taint.key", "FieldValueRequired", "Required value"))
    elif not isinstance(key, str):
        errs.append(("spec.taint.key", "FieldValueTypeInvalid", "Invalid value: must be a string"))
    else:
        errs += _qualified_name_errs("spec.taint.key", key)
    if value and (not isinstance(value, str) or len(value) > 63 or not re.fullmatch(LABEL_VALUE, value)):
        errs.append(("spec.taint.value", "FieldValueInvalid",
                     "Invalid value: %s: a valid label must be an empty string or consist of alphanumeric "
                     "characters, '-', '_' or '.', and must start and end with an alphanumeric character, at "
                     "most 63 characters" % json.dumps(value)))
    if not effect:
        errs.append(("spec.taint.effect", "FieldValueRequired", "Required value"))
    elif effect not in DEVICE_TAINT_EFFECTS:
        errs.append(("spec.taint.effect", "FieldValueNotSupported", "Unsupported value: %s: supported values: %s"
                     % (json.dumps(effect), ", ".join('"%s"' % e for e in DEVICE_TAINT_EFFECTS))))
    return errs


def _default(obj, field, value):
    """The API's defaulting: a missing or null field gets `value`."""
    if obj.get(field) is None:
        obj[field] = value


def _webhook_config_errs(obj):
    """A ValidatingWebhookConfiguration's rules (admissionregistration/v1), with
    its defaults applied in place."""
    errs = []
    hooks = obj.get("webhooks") or []
    if not isinstance(hooks, list):
        return [("webhooks", "FieldValueTypeInvalid", "Invalid value: must be a list")]
    seen = set()
    for i, h in enumerate(hooks):
        p = "webhooks[%d]" % i
        if not isinstance(h, dict):
            errs.append((p, "FieldValueTypeInvalid", "Invalid value: must be an object"))
            continue
        name = h.get("name") or ""
        if not name:
            errs.append((p + ".name", "FieldValueRequired", "Required value"))
        elif name.count(".") < 2 or _subdomain_errs("", name):
            errs.append((p + ".name", "FieldValueInvalid",
                         'Invalid value: "%s": should be a domain with at least three segments separated by dots'
                         % name))
        elif name in seen:
            errs.append((p + ".name", "FieldValueDuplicate", 'Duplicate value: "%s"' % name))
        seen.add(name)
        versions = h.get("admissionReviewVersions") or []
        if not versions:
            errs.append((p + ".admissionReviewVersions", "FieldValueRequired",
                         "Required value: must specify one of v1, v1beta1"))
        elif "v1" not in versions:
            # kube-apiserver would talk v1beta1 too; the fake speaks only v1.
            errs.append((p + ".admissionReviewVersions", "FieldValueNotSupported",
                         "Unsupported value: %s: the fake apiserver sends only v1 AdmissionReviews; include v1"
                         % json.dumps(versions)))
        side = h.get("sideEffects")
        if not side:
            errs.append((p + ".sideEffects", "FieldValueRequired", "Required value: must specify one of None, "
                         "NoneOnDryRun"))
        elif side not in ("None", "NoneOnDryRun"):
            errs.append((p + ".sideEffects", "FieldValueNotSupported",
                         'Unsupported value: %s: supported values: "None", "NoneOnDryRun"' % json.dumps(side)))
        _default(h, "failurePolicy", "Fail")
        if h["failurePolicy"] not in ("Fail", "Ignore"):
            errs.append((p + ".failurePolicy", "FieldValueNotSupported",
                         'Unsupported value: %s: supported values: "Fail", "Ignore"' % json.dumps(h["failurePolicy"])))
        _default(h, "matchPolicy", "Equivalent")
        if h["matchPolicy"] not in ("Equivalent", "Exact"):
            errs.append((p + ".matchPolicy", "FieldValueNotSupported",
                         'Unsupported value: %s: supported values: "Equivalent", "Exact"'
                         % json.dumps(h["matchPolicy"])))
        _default(h, "timeoutSeconds", 10)
        t = h["timeoutSeconds"]
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= 30:
            errs.append((p + ".timeoutSeconds", "FieldValueInvalid",
                         "Invalid value: %s: the timeout value must be between 1 and 30 seconds" % json.dumps(t)))
        _default(h, "namespaceSelector", {})
        _default(h, "objectSelector", {})
        cc = h.get("clientConfig") or {}
        has_url, svc = bool(cc.get("url")), cc.get("service")
        if has_url == bool(svc):
            errs.append((p + ".clientConfig", "FieldValueRequired",
                         "Required value: exactly one of url or service is required"))
        elif has_url:
            u = urllib.parse.urlsplit(cc["url"])
            if u.scheme != "https":
                errs.append((p + ".clientConfig.url", "FieldValueNotSupported",
                             'Unsupported value: "%s": supported values: "https"' % u.scheme))
            elif not u.hostname:
                errs.append((p + ".clientConfig.url", "FieldValueInvalid",
                             'Invalid value: "%s": host must be specified' % cc["url"]))
        else:
            for f in ("namespace", "name"):
                if not svc.get(f):
                    errs.append((p + ".clientConfig.service." + f, "FieldValueRequired",
                                 "Required value: service %s is required" % f))
            _default(svc, "port", 443)
            if svc.get("path") and not svc["path"].startswith("/"):
                errs.append((p + ".clientConfig.service.path", "FieldValueInvalid",
                             'Invalid value: "%s": must start with a \'/\'' % svc["path"]))
        if cc.get("caBundle"):
            try:
                base64.b64decode(cc["caBundle"], validate=True)
            except ValueError:
                errs.append((p + ".clientConfig.caBundle", "FieldValueInvalid",
                             "Invalid value: must be base64 (a PEM bundle)"))
        for j, r in enumerate(h.get("rules") or []):
            rp = "%s.rules[%d]" % (p, j)
            for op in r.get("operations") or []:
                if op not in ("*", "CREATE", "UPDATE", "DELETE", "CONNECT"):
                    errs.append((rp + ".operations", "FieldValueNotSupported",
                                 'Unsupported value: "%s": supported values: "*", "CONNECT", "CREATE", "DELETE", '
                                 '"UPDATE"' % op))
            for f in ("apiGroups", "apiVersions", "resources"):
                if not r.get(f):
                    errs.append((rp + "." + f, "FieldValueRequired", "Required value"))
            _default(r, "scope", "*")
            if r["scope"] not in ("*", "Cluster", "Namespaced"):
                errs.append((rp + ".scope", "FieldValueNotSupported",
                             'Unsupported value: "%s": supported values: "*", "Cluster", "Namespaced"' % r["scope"]))
    return errs


def _spec_changed(res, old, new):
    field = "webhooks" if res.key == VWC_KEY else "spec"
    return old is not None and old.get(field) != new.get(field)


def dra_prepare(res, sub, old, new, q):
    """kube-apiserver's strategy and validation for the kinds of this block
    (others pass unchanged): status only through the status subresource, spec
    and metadata kept by it, metadata.generation, DNS-subdomain names, a
    ResourceClaim's (and template's) immutable spec, a DeviceTaintRule's taint
    and selector, a webhook configuration's rules. Returns the object to
    store; raises the 422 (or 400 under fieldValidation=Strict)."""
    if res.group not in (DRA_GROUP, "admissionregistration.k8s.io"):
        return new
    md = new["metadata"]
    name = md.get("name") or ""
    has_status = "status" in res.subresources
    if sub == "status" and old is None:
        raise not_found(res, name)  # no create through /status (an apply to a missing object)
    if sub == "status":
        # The status subresource writes status only: spec and most metadata
        # come from the stored object (metav1.ResetObjectMetaForStatus).
        keep = copy.deepcopy(old)
        keep["status"] = new.get("status")
        if keep["status"] is None:
            del keep["status"]
        if "resourceVersion" in md:  # the writer's precondition (409 when stale)
            keep["metadata"]["resourceVersion"] = md["resourceVersion"]
        new = keep
        md = new["metadata"]
    elif has_status:
        # The main resource never writes status: dropped on create, kept on update.
        new.pop("status", None)
        if old is not None and "status" in old:
            new["status"] = copy.deepcopy(old["status"])
    errs = _subdomain_errs("metadata.name", name) if old is None else []
    if res.kind in ("ResourceClaim", "ResourceClaimTemplate") and old is not None and sub is None \
            and new.get("spec") != old.get("spec"):
        errs.append(("spec", "FieldValueInvalid", "Invalid value: %s: field is immutable"
                     % json.dumps(new.get("spec"), sort_keys=True)))
    if res.kind == "ResourceClaim" and sub == "status":
        was, now = (old.get("status") or {}).get("allocation"), (new.get("status") or {}).get("allocation")
        if was is not None and now is not None and was != now:
            errs.append(("status.allocation", "FieldValueInvalid", "Invalid value: %s: field is immutable"
                         % json.dumps(now, sort_keys=True)))
        if now is None and (new.get("status") or {}).get("reservedFor"):
            errs.append(("status.reservedFor", "FieldValueForbidden",
                         "Forbidden: may not be specified when `allocated` is not set"))
    if res.kind == "DeviceTaintRule" and sub is None:
        spec = new.get("spec")
        if not isinstance(spec, dict):
            errs.append(("spec", "FieldValueRequired", "Required value"))
        else:
            sel = spec.get("deviceSelector")
            if isinstance(sel, dict):
                unknown = sorted(k for k in sel if k not in DEVICE_TAINT_SELECTOR_FIELDS)
                if unknown and q.get("fieldValidation") == "Strict":
                    raise bad_request('%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                                      % (res.kind, res.version, res.kind, ", ".join(
                                          'unknown field "spec.deviceSelector.%s"' % k for k in unknown)))
                for k in unknown:
                    del sel[k]  # pruned, as the decoder drops unknown fields
            old_taint = ((old or {}).get("spec") or {}).get("taint") or {}
            errs += _taint_errs(spec.get("taint"))
            taint = spec.get("taint")
            if isinstance(taint, dict) and not errs:
                # timeAdded: set when missing, and renewed when the effect changes.
                if not taint.get("timeAdded") or (old_taint.get("effect") not in (None, taint.get("effect"))
                                                  and taint.get("timeAdded") == old_taint.get("timeAdded")):
                    taint["timeAdded"] = now_rfc3339()
    if res.key == VWC_KEY:
        errs += _webhook_config_errs(new)
    if errs:
        raise invalid_all(res, name, errs)
    if old is None:
        md["generation"] = 1
    else:
        md["generation"] = old["metadata"].get("generation", 1) + (1 if _spec_changed(res, old, new) else 0)
    return new


def label_selector_matches(selector, labels):
    """A metav1.LabelSelector as webhooks use it: empty or missing selects all."""
    selector = selector or {}
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def rule_matches(rule, res, sub, op):
    """One RuleWithOperations against a request (Exact: the served version)."""
    def has(field, value):
        vals = rule.get(field) or []
        return "*" in vals or value in vals
    if not (has("operations", op) and has("apiGroups", res.group) and has("apiVersions", res.version)):
        return False
    scope = rule.get("scope", "*")
    if scope == "Cluster" and res.namespaced or scope == "Namespaced" and not res.namespaced:
        return False
    for r in rule.get("resources") or []:
        base, _, rsub = r.partition("/")
        if rsub:
            if (base in ("*", res.plural)) and (rsub == "*" and sub or rsub == sub):
                return True
        elif sub is None and base in ("*", res.plural):
            return True
    return False


def webhook_service_control(server, body):
    """POST /_fake/webhook_service: where a clientConfig.service reference
    points (the fake has no Services): {"namespace", "name", "port", "url"}."""
    for f in ("namespace", "name", "url"):
        if not body.get(f):
            return 400, status_obj(400, "BadRequest", "%s: required" % f)
    if urllib.parse.urlsplit(body["url"]).scheme != "https":
        return 400, status_obj(400, "BadRequest", "url: must be https://host:port")
    services = server.__dict__.setdefault("webhook_services", {})
    services[(body["namespace"], body["name"], int(body.get("port", 443)))] = body["url"].rstrip("/")
    return 200, {}


class WebhookCallError(Exception):
    pass


def call_webhook(server, hook, review):
    """POSTs one AdmissionReview to the webhook as kube-apiserver does (HTTPS,
    the server verified against caBundle, or the system roots without one;
    the whole call within timeoutSeconds). Returns the response part of the
    reply; raises WebhookCallError with kube-apiserver's wording."""
    cc = hook.get("clientConfig") or {}
    timeout = hook.get("timeoutSeconds", 10)
    if cc.get("url"):
        u = urllib.parse.urlsplit(cc["url"])
        shown = cc["url"]
        connect_host, connect_port, tls_name = u.hostname, u.port or 443, u.hostname
        path = (u.path or "/") + ("?" + u.query if u.query else "")
    else:
        svc = cc["service"]
        port = int(svc.get("port", 443))
        tls_name = "%s.%s.svc" % (svc["name"], svc["namespace"])
        shown = "https://%s:%d%s" % (tls_name, port, svc.get("path") or "")
        target = server.__dict__.get("webhook_services", {}).get((svc["namespace"], svc["name"], port))
        if target is None:
            raise WebhookCallError('failed to call webhook: Post "%s?timeout=%ds": service "%s" not found'
                                   % (shown, timeout, svc["name"]))
        t = urllib.parse.urlsplit(target)
        connect_host, connect_port = t.hostname, t.port or 443
        path = svc.get("path") or "/"
    path += ("&" if "?" in path else "?") + "timeout=%ds" % timeout
    where = 'Post "%s%stimeout=%ds"' % (shown, "&" if "?" in shown else "?", timeout)
    deadline = time.monotonic() + timeout
    ctx = ssl.create_default_context()
    if cc.get("caBundle"):
        ctx = ssl.create_default_context(cadata=base64.b64decode(cc["caBundle"]).decode(errors="replace"))
    body = json.dumps(review).encode()
    try:
        sock = socket.create_connection((connect_host, connect_port), timeout=timeout)
        try:
            sock = ctx.wrap_socket(sock, server_hostname=tls_name)
            conn = http.client.HTTPConnection(tls_name, connect_port, timeout=timeout)
            conn.sock = sock
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                           "Accept": "application/json"})
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            r = conn.getresponse()
            raw = b""
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = r.read(65536)
                if not chunk:
                    break
                raw += chunk
                if time.monotonic() >= deadline:
                    raise socket.timeout()
        finally:
            sock.close()
    except (socket.timeout, TimeoutError):
        raise WebhookCallError("failed to call webhook: %s: context deadline exceeded" % where)
    except ssl.SSLCertVerificationError as e:
        raise WebhookCallError("failed to call webhook: %s: tls: failed to verify certificate: %s"
                               % (where, e.verify_message))
    except ConnectionRefusedError:
        raise WebhookCallError("failed to call webhook: %s: dial tcp %s:%d: connect: connection refused"
                               % (where, connect_host, connect_port))
    except (OSError, http.client.HTTPException) as e:
        raise WebhookCallError("failed to call webhook: %s: %s" % (where, e))
    if r.status != 200:
        raise WebhookCallError("failed to call webhook: the server responded with status %d" % r.status)
    try:
        reply = json.loads(raw.decode())
        resp = reply["response"]
    except (ValueError, KeyError, TypeError):
        raise WebhookCallError("received invalid webhook response: not an AdmissionReview")
    if reply.get("apiVersion") != "admission.k8s.io/v1" or reply.get("kind") != "AdmissionReview":
        raise WebhookCallError('received invalid webhook response: expected webhook response of '
                               'admission.k8s.io/v1, Kind=AdmissionReview, got %s, Kind=%s'
                               % (reply.get("apiVersion"), reply.get("kind")))
    if not isinstance(resp, dict) or resp.get("uid") != review["request"]["uid"]:
        got = resp.get("uid") if isinstance(resp, dict) else None
        raise WebhookCallError('received invalid webhook response: expected response.uid="%s", got "%s"'
                               % (review["request"]["uid"], got or ""))
    return resp


def webhook_denied(name, result):
    """The refusal kube-apiserver answers for allowed: false (webhook
    ToStatusErr): the webhook's code (at least 400), its message behind
    'admission webhook "NAME" denied the request'."""
    result = dict(result or {})
    code = result.get("code") or 0
    code = code if isinstance(code, int) and code >= 400 else 400
    denied = 'admission webhook "%s" denied the request' % name
    if result.get("message"):
        message = "%s: %s" % (denied, result["message"])
    elif result.get("reason"):
        message = "%s: %s" % (denied, result["reason"])
    else:
        message = denied + " without explanation"
    err = ApiError(code, result.get("reason") or "", message, result.get("details"))
    if not result.get("reason"):
        del err.status["reason"]
    if result.get("details") is None:
        err.status.pop("details", None)
    return err


def webhook_call_failed(name, why):
    """failurePolicy Fail on an unreachable, slow or malformed webhook: 500."""
    message = 'Internal error occurred: failed calling webhook "%s": %s' % (name, why)
    return ApiError(500, "InternalError", message, {"causes": [{"message": message}]})


add_resources(dra_ga_resources())
# ---- end DRA ----

# ---- Gangs (docs/gangs.md section 1) ----
# The objects duet's gang recognition reads. The custom resources are served
# only with --gang-crds (a cluster serves them once their CRDs are installed):
# scheduler-plugins' PodGroup (scheduling.x-k8s.io/v1alpha1), JobSet
# (jobset.x-k8s.io/v1alpha2), LeaderWorkerSet (leaderworkerset.x-k8s.io/v1).
# Kubernetes' own Workload API is served with --feature-gates
# GenericWorkload=true at the release's version: 1.35 scheduling.k8s.io/v1alpha1
# workloads; 1.36 v1alpha2 workloads and podgroups; 1.37 v1beta1 workloads and
# podgroups (sources: k8s_adapter/gang/gang_source.cc). Plain namespaced CRUD,
# list and watch, as for every kind here; no validation of their specs.


def gang_crd_resources():
    return [
        Resource("PodGroup", "podgroups", "scheduling.x-k8s.io", "v1alpha1", True, ("pg", "pgs"),
                 subresources=("status",)),
        Resource("JobSet", "jobsets", "jobset.x-k8s.io", "v1alpha2", True, subresources=("status",)),
        Resource("LeaderWorkerSet", "leaderworkersets", "leaderworkerset.x-k8s.io", "v1", True, ("lws",),
                 subresources=("status",)),
    ]


def workload_resources(kube_version):
    version = {"1.35": "v1alpha1", "1.36": "v1alpha2", "1.37": "v1beta1"}.get(kube_version)
    if version is None:
        return []
    out = [Resource("Workload", "workloads", "scheduling.k8s.io", version, True)]
    if version != "v1alpha1":
        out.append(Resource("PodGroup", "podgroups", "scheduling.k8s.io", version, True, subresources=("status",)))
    return out
# ---- end gangs ----


class DropConnection(Exception):
    pass


PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/apply-patch+yaml", "application/strategic-merge-patch+json")


def route(path):
    """(resource, namespace, name, subresource) for an API path, or None."""
    m = re.match(r"^(/api/[^/]+|/apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+)(?:/([^/]+))?)?$", path)
    if m and (m.group(1), m.group(3)) in BY_PATH and BY_PATH[(m.group(1), m.group(3))].namespaced:
        return BY_PATH[(m.group(1), m.group(3))], m.group(2), m.group(4), m.group(5)
    m = re.match(r"^(/api/[^/]+|/apis/[^/]+/[^/]+)/([^/]+)(?:/([^/]+)(?:/([^/]+))?)?$", path)
    if m and (m.group(1), m.group(2)) in BY_PATH:
        res = BY_PATH[(m.group(1), m.group(2))]
        if res.namespaced and m.group(3) is not None:
            return None  # a namespaced resource has no cluster-scoped objects
        return res, "", m.group(3), m.group(4)
    return None


def parse_body(raw, ctype="application/json"):
    if not raw:
        return None
    text = raw.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError as e:
        if ctype in ("application/apply-patch+yaml", "application/yaml"):
            try:
                import yaml  # noqa: PLC0415 (python3-yaml, only for YAML apply bodies)
            except ImportError:
                raise ApiError(415, "UnsupportedMediaType", "a YAML body needs python3-yaml in the fake")
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as ye:
                raise bad_request("error decoding YAML: %s" % ye)
        raise bad_request("invalid JSON body: %s" % e)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body
    # waits for the client's delayed ACK (40 ms a keep-alive request).
    disable_nagle_algorithm = True
    server_version = "fake-apiserver/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    @property
    def st(self):
        return self.server.state

    # ---- plumbing ----
    def _send_json(self, code, obj, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers.items() if isinstance(headers, dict) else headers or ()):
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code, reason, message):
        self._send_json(code, status_obj(code, reason, message))

    def _body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _json_body(self):
        raw = self._body()
        return json.loads(raw.decode() or "null"), raw

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _authorized(self):
        token = self.server.token
        if token is None:
            return True
        if self.headers.get("Authorization") == "Bearer " + token:
            return True
        conn = self.connection
        if isinstance(conn, ssl.SSLSocket) and conn.getpeercert():
            return True
        return False

    def _dispatch(self, method):
        u = urllib.parse.urlsplit(self.path)
        path = u.path.rstrip("/") or "/"
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(u.query, keep_blank_values=True).items()}
        try:
            if path.startswith("/_fake/"):
                return self._control(method, path[len("/_fake/"):], q)
            raw = self._body()  # DELETE may carry DeleteOptions too
            with self.st.cond:
                self.st.requests.append({
                    "method": method, "path": self.path,
                    "auth": self.headers.get("Authorization", ""),
                    "content_type": self.headers.get("Content-Type", ""),
                    "body": raw.decode(errors="replace")})
                if len(self.st.requests) > 10000:
                    del self.st.requests[:1000]
                fail = self.st.fail_count > 0
                if fail:
                    self.st.fail_count -= 1
                fail_code = self.st.fail_code
                delay = self.st.delay
            if delay:
                time.sleep(delay)
            if not self._authorized():
                return self._status(401, "Unauthorized", "Unauthorized")
            if fail:
                return self._status(fail_code, "InternalError", "injected failure")
            try:
                self._api(method, path, q, raw)
            except ApiError as e:
                retry = (e.status.get("details") or {}).get("retryAfterSeconds")
                self._send_json(e.code, e.status, [("Retry-After", str(retry))] if retry else None)
        except DropConnection:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True

    # ---- control API ----
    def _control(self, method, what, q):
        st = self.st
        if method == "GET" and what == "requests":
            with st.cond:
                return self._send_json(200, list(st.requests))
        if method == "GET" and what == "stats":
            with st.cond:
                return self._send_json(200, {"watches": len(st.watches), "resourceVersion": st.rv,
                                             "rv_waiters": st.rv_waiters,
                                             "duplicated": st.duplicated,
                                             "reordered": st.reordered})
        if method != "POST":
            return self._status(405, "MethodNotAllowed", "control calls are POST")
        body, _ = self._json_body()
        body = body or {}
        with st.cond:
            if what == "token":
                return self._send_json(*token_control(self.server, body))
            if what == "webhook_service":
                return self._send_json(*webhook_service_control(self.server, body))
            try:
                if what == "put":
                    code, obj = st.put(body)
                    return self._send_json(code, obj)
                if what == "delete":
                    res = resource_for(body.get("kind", ""), body.get("apiVersion"))
                    if res is None:
                        return self._status(400, "BadRequest", "unknown kind")
                    ns = body.get("namespace", "default") if res.namespaced else ""
                    return self._send_json(200, st.remove(res, ns, body.get("name", "")))
            except ApiError as e:
                return self._send_json(e.code, e.status)
            if what == "pod_deletion":
                if body.get("mode") not in ("graceful", "immediate"):
                    return self._status(400, "BadRequest", "mode: graceful or immediate")
                st.pod_deletion = body["mode"]
                return self._send_json(200, {})
            if what in ("drop", "garbage", "bigframe", "bookmark"):
                for w in st.watches:
                    w.inbox.append((what, body))
                st.cond.notify_all()
                return self._send_json(200, {"watches": len(st.watches)})
            if what == "compact":
                st.log = []
                st.floor = st.rv + 1
                if body.get("expire_watches"):
                    for w in st.watches:
                        w.inbox.append(("expire", body))
                st.cond.notify_all()
                return self._send_json(200, {"floor": st.floor})
            if what == "mangle":
                st.dup_left += int(body.get("duplicate", 0))
                st.reorder_left += int(body.get("reorder", 0))
                return self._send_json(200, {})
            if what == "gone_mode":
                st.gone_mode = body.get("mode", "frame")
                return self._send_json(200, {})
            if what == "slow":
                st.delay = float(body.get("delay_ms", 0)) / 1000.0
                return self._send_json(200, {})
            if what == "fail":
                st.fail_count = int(body.get("count", 1))
                st.fail_code = int(body.get("code", 500))
                return self._send_json(200, {})
        return self._status(404, "NotFound", "unknown control call " + what)

    # ---- discovery ----
    def _discovery(self, path):
        """The discovery and OpenAPI documents, or None for another path."""
        if path == "/version":
            return {"major": "1", "minor": GIT_VERSION.split(".")[1], "gitVersion": GIT_VERSION,
                    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
                    "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": GROUP_VERSIONS[""],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:%d" % self.server.server_port}]}

        def group(name):
            versions = [{"groupVersion": "%s/%s" % (name, v), "version": v} for v in GROUP_VERSIONS[name]]
            return {"name": name, "versions": versions, "preferredVersion": versions[0]}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [group(g) for g in GROUP_VERSIONS if g]}
        m = re.match(r"^/apis/([^/]+)$", path)
        if m and m.group(1) in GROUP_VERSIONS and m.group(1):
            return dict(group(m.group(1)), kind="APIGroup", apiVersion="v1")
        m = re.match(r"^/api/(v1)$|^/apis/([^/]+/[^/]+)$", path)
        if m:
            gv = m.group(1) or m.group(2)
            resources = [d for r in RESOURCES if r.gv == gv for d in r.discovery()]
            if gv == "v1":
                resources.append({"name": "bindings", "singularName": "binding", "namespaced": True,
                                  "kind": "Binding", "verbs": ["create"]})
            if resources:
                return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                        "resources": resources}
        if path.startswith("/openapi/v3"):
            docs = {}
            for r in RESOURCES:
                docs.setdefault(r.prefix[1:], []).append(r)
            docs = {k: schema.gv_document(v, GIT_VERSION) for k, v in docs.items()}
            if path == "/openapi/v3":
                return schema.v3_index(docs)
            return docs.get(path[len("/openapi/v3/"):])
        return None

    # ---- API ----
    def _api(self, method, path, q, raw):
        if method == "GET":
            doc = self._discovery(path)
            if doc is not None:
                return self._send_json(200, doc)

        if path == TOKENREVIEW_PATH and method == "POST":
            return self._send_json(*token_review(self.server, raw))
        m = re.match(r"^/api/v1/namespaces/([^/]+)/bindings$", path)
        if m and method == "POST":
            # The Binding resource (what client libraries post): the pod is
            # named by the body, as in POST pods/{name}/binding.
            body = parse_body(raw)
            pod_name = ((body or {}).get("metadata") or {}).get("name") if isinstance(body, dict) else None
            if not pod_name:
                raise invalid(BY_KEY["Pod"], "", "metadata.name", "FieldValueRequired", "Required value")
            return self._binding(m.group(1), pod_name, body)

        r = route(path)
        if r is None:
            raise no_route()
        res, ns, name, sub = r
        if sub is not None and sub not in res.subresources:
            raise no_route()

        if method == "GET" and name is None:
            try:
                sel = Selector(q.get("labelSelector"))
                fsel = FieldSelector(q.get("fieldSelector"))
                watch = parse_bool(q.get("watch", ""))
                bookmarks = parse_bool(q.get("allowWatchBookmarks", ""))
            except ValueError as e:
                raise bad_request(str(e))
            if watch:
                return self._watch(res, ns, sel, fsel, bookmarks, q)
            return self._list(res, ns, sel, fsel, q)

        if method == "GET" and sub in (None, "status"):
            with self.st.cond:
                obj = self.st.objects[res.key].get((ns, name))
                if obj is None:
                    raise not_found(res, name)
                return self._send_json(200, obj)

        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if raw and method in ("POST", "PUT") and ctype == "application/vnd.kubernetes.protobuf":
            try:
                raw = json.dumps(protobuf.decode(raw)).encode()
            except (protobuf.Unsupported, UnicodeDecodeError) as e:
                raise ApiError(415, "UnsupportedMediaType",
                               "the fake apiserver decodes protobuf bodies only for a Namespace (%s); send "
                               "application/json" % e)
        elif raw and method in ("POST", "PUT") and ctype not in ("application/json", "application/yaml"):
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           "application/json, application/yaml, application/vnd.kubernetes.protobuf")
        if method == "POST" and sub == "binding":
            return self._binding(ns, name, parse_body(raw))
        if method == "POST" and sub == "eviction":
            return self._eviction(ns, name, parse_body(raw), q)
        if method == "POST" and name is None:
            return self._create(res, ns, parse_body(raw, ctype), q)
        if method == "PUT" and name is not None and sub in (None, "status"):
            return self._update(res, ns, name, parse_body(raw, ctype), q, sub)
        if method == "PATCH" and name is not None and sub in (None, "status"):
            return self._patch(res, ns, name, raw, q, sub)
        if method == "DELETE" and name is not None and sub is None:
            return self._delete(res, ns, name, parse_body(raw), q)
        raise method_not_allowed()

    def _admit(self, res, ns, sub, op, old, new, q, dry):
        """Admission of a create or update, under st.cond just before it is
        stored: dra_prepare (the DRA block's strategy and validation), then the
        validating webhooks whose rules and selectors match, called at once in
        parallel with st.cond released (a webhook may read from this server
        while it decides). An object changed meanwhile is a 409 Conflict.
        Returns the object to store; raises the refusal."""
        st = self.st
        new = dra_prepare(res, sub, old, new, q)
        hooks = []
        for _, cfg in sorted(st.objects[VWC_KEY].items()):
            for h in cfg.get("webhooks") or []:
                if any(rule_matches(r, res, sub, op) for r in h.get("rules") or []) \
                        and self._webhook_selects(h, res, ns, old, new):
                    hooks.append(h)
        if not hooks:
            return new
        md = new["metadata"]
        gvk = {"group": res.group, "version": res.version, "kind": res.kind}
        gvr = {"group": res.group, "version": res.version, "resource": res.plural}
        request = {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk,
                   "requestResource": gvr, "name": md.get("name", ""), "operation": op,
                   "userInfo": self._user_info(), "object": copy.deepcopy(new),
                   "oldObject": copy.deepcopy(old), "dryRun": bool(dry),
                   "options": {"kind": "CreateOptions" if op == "CREATE" else "UpdateOptions",
                               "apiVersion": "meta.k8s.io/v1"}}
        if q.get("fieldManager"):
            request["options"]["fieldManager"] = q["fieldManager"]
        if sub:
            request["subResource"] = request["requestSubResource"] = sub
        if res.namespaced:
            request["namespace"] = ns
        review = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}
        results = [None] * len(hooks)

        def one(i, h):
            try:
                results[i] = call_webhook(self.server, h, review)
            except WebhookCallError as e:
                results[i] = e
        threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(hooks)]
        st.cond.release()
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            st.cond.acquire()
        cur = st.objects[res.key].get((ns, md.get("name")))
        if old is not None and (cur is None or cur["metadata"]["resourceVersion"]
                                != old["metadata"]["resourceVersion"]):
            raise conflict(res, md.get("name"))
        for h, r in zip(hooks, results):
            if isinstance(r, WebhookCallError):
                if h.get("failurePolicy", "Fail") == "Fail":
                    raise webhook_call_failed(h["name"], str(r))
                continue  # Ignore: as if the webhook had allowed it
            if r.get("allowed") is not True:
                raise webhook_denied(h["name"], r.get("status"))
        return new

    def _webhook_selects(self, hook, res, ns, old, new):
        """namespaceSelector (on the object's namespace's labels; a cluster-scoped
        object other than a Namespace always passes) and objectSelector (on the
        new or the old object's labels)."""
        if res.namespaced:
            nsobj = self.st.objects["Namespace"].get(("", ns)) or {}
            if not label_selector_matches(hook.get("namespaceSelector"),
                                          (nsobj.get("metadata") or {}).get("labels")):
                return False
        elif res.kind == "Namespace" and not label_selector_matches(hook.get("namespaceSelector"),
                                                                     new["metadata"].get("labels")):
            return False
        sel = hook.get("objectSelector")
        return any(o is not None and label_selector_matches(sel, o["metadata"].get("labels")) for o in (new, old))

    def _user_info(self):
        """The requester as a webhook sees it: a token registered with
        /_fake/token names its user; anyone else is the cluster admin."""
        auth = self.headers.get("Authorization") or ""
        t = self.server.__dict__.get("tokens", {}).get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        if t is not None:
            info = {"username": t["username"], "uid": t["uid"], "groups": t["groups"]}
            if t["extra"]:
                info["extra"] = t["extra"]
            return info
        return {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}

    def _dry_run(self, q):
        v = q.get("dryRun")
        if v not in (None, "", "All"):
            raise bad_request('dryRun: Unsupported value: "%s": supported values: "All"' % v)
        return v == "All"

    def _validate_fields(self, res, obj, q):
        """Server-side field validation; the Warning headers to send."""
        mode = q.get("fieldValidation", "")
        if mode not in ("", "Ignore", "Warn", "Strict"):
            raise bad_request('fieldValidation: Unsupported value: "%s": supported values: "Ignore", '
                              '"Warn", "Strict"' % mode)
        if mode in ("", "Ignore") or not isinstance(obj, dict):
            return []
        unknown = ['unknown field "%s"' % p for p in schema.unknown_fields(res.model, obj)]
        if unknown and mode == "Strict":
            raise bad_request('%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                              % (res.kind, res.version, res.kind, ", ".join(unknown)))
        return [("Warning", '299 - %s' % json.dumps(u)) for u in unknown]

    def _check_object(self, res, body):
        """The body's metadata after checking that it is a `res` object."""
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a %s object" % res.kind)
        if body.get("kind") not in (None, "", res.kind):
            raise bad_request('%s in version "%s" cannot be handled as a %s: the object kind is %s'
                              % (res.kind, res.version, res.kind, body["kind"]))
        if body.get("apiVersion") not in (None, "", res.gv):
            raise bad_request("the API version in the data (%s) does not match the expected API version (%s)"
                              % (body["apiVersion"], res.gv))
        body["kind"], body["apiVersion"] = res.kind, res.gv
        md = body.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        return md

    def _create(self, res, ns, body, q):
        md = self._check_object(res, body)
        if res.namespaced:
            if md.get("namespace", ns) not in (ns, ""):
                raise bad_request("the namespace of the provided object does not match the namespace sent "
                                  "on the request")
            md["namespace"] = ns
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
        if not md.get("name"):
            raise invalid(res, "", "metadata.name", "FieldValueRequired",
                          "Required value: name or generateName is required")
        warnings = self._validate_fields(res, body, q)
        dry = self._dry_run(q)
        with self.st.cond:
            body = self._admit(res, ns, None, "CREATE", None, body, q, dry)
            code, obj = self.st.put(body, create_only=True, api=True, dry_run=dry)
            obj = copy.deepcopy(obj)
        self._send_json(code, obj, warnings)

    def _update(self, res, ns, name, body, q, sub=None):
        md = self._check_object(res, body)
        if md.get("name") != name:
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (md.get("name"), name))
        if res.namespaced:
            md["namespace"] = ns
        warnings = self._validate_fields(res, body, q)
        dry = self._dry_run(q)
        with self.st.cond:
            if (ns, name) not in self.st.objects[res.key]:
                raise not_found(res, name)
            body = self._admit(res, ns, sub, "UPDATE", self.st.objects[res.key][(ns, name)], body, q, dry)
            code, obj = self.st.put(body, expect_rv=md.get("resourceVersion") or None, api=True, dry_run=dry)
            obj = copy.deepcopy(obj)
        self._send_json(200, obj, warnings)

    def _patch(self, res, ns, name, raw, q, sub=None):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           + ", ".join(PATCH_TYPES))
        body = parse_body(raw, ctype)
        dry = self._dry_run(q)
        apply = ctype == "application/apply-patch+yaml"
        if apply:
            if not q.get("fieldManager"):
                raise bad_request("PATCH %s: fieldManager is required for apply requests" % self.path.split("?")[0])
            md = self._check_object(res, body)
            if md.get("name") not in (None, name):
                raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                                  % (md.get("name"), name))
            if res.namespaced and md.get("namespace") not in (None, "", ns):
                raise bad_request("the namespace of the object (%s) does not match the namespace on the "
                                  "URL (%s)" % (md.get("namespace"), ns))
        with self.st.cond:
            cur = self.st.objects[res.key].get((ns, name))
            if cur is None and not apply:
                raise not_found(res, name)
            try:
                if ctype == "application/json-patch+json":
                    new = patches.json_patch(cur, body)
                elif ctype == "application/merge-patch+json":
                    if not isinstance(body, dict):
                        raise patches.PatchError(400, "merge patch: the patch must be a JSON object")
                    new = patches.merge_patch(cur, body)
                elif apply:
                    try:
                        force = parse_bool(q.get("force", ""))
                    except ValueError:
                        raise bad_request("force: %r is not a boolean" % q.get("force"))
                    new = patches.server_side_apply(cur, body, res.kind, q["fieldManager"], force, res.gv,
                                                    now_rfc3339())
                else:
                    new = patches.apply_strategic(cur, body, res.kind)
            except patches.PatchError as e:
                if e.code == 422:
                    raise ApiError(422, "Invalid", e.message, _details(res, name, res.kind))
                raise bad_request(e.message)
            except patches.ApplyConflict as e:
                d = _details(res, name)
                d["causes"] = [{"reason": "FieldManagerConflict", "message": 'conflict with "%s"' % m,
                                "field": patches.path_text(p)} for m, p in e.conflicts]
                raise ApiError(409, "Conflict", e.message, d)
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise bad_request("the patched object is not a %s" % res.kind)
            want_rv = None
            if cur is not None:
                want_rv = new["metadata"].get("resourceVersion")
                if want_rv == cur["metadata"]["resourceVersion"]:
                    want_rv = None
                if want_rv and (ctype == "application/json-patch+json" or
                                (body.get("metadata") or {}).get("resourceVersion")):
                    raise conflict(res, name)
            new["metadata"]["name"], new["kind"], new["apiVersion"] = name, res.kind, res.gv
            warnings = self._validate_fields(res, new, q)  # the patched object, as kube-apiserver does
            if res.namespaced:
                new["metadata"]["namespace"] = ns
            new = self._admit(res, ns, sub, "CREATE" if cur is None else "UPDATE", cur, new, q, dry)
            code, obj = self.st.put(new, api=True, dry_run=dry)
            obj = copy.deepcopy(obj)
        self._send_json(code if cur is None else 200, obj, warnings)

    def _delete(self, res, ns, name, body, q):
        opts = body if isinstance(body, dict) else {}
        grace = q.get("gracePeriodSeconds", opts.get("gracePeriodSeconds"))
        try:
            grace = None if grace in (None, "") else int(grace)
        except (TypeError, ValueError):
            raise bad_request("gracePeriodSeconds: %r is not an integer" % grace)
        dry = self._dry_run(q) or opts.get("dryRun") == ["All"]
        with self.st.cond:
            obj = self.st.delete(res, ns, name, grace=grace, preconditions=opts.get("preconditions"),
                                 dry_run=dry)
            gone = (ns, name) not in self.st.objects[res.key]
        if gone and res.kind not in ("Pod", "Namespace"):
            # kube-apiserver returns the deleted object only for some resources
            # (ReturnDeletedObject); the others answer with a Status.
            d = _details(res, name)
            d["uid"] = obj["metadata"]["uid"]
            obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d}
        self._send_json(200, obj)

    def _binding(self, ns, name, body):
        pods = BY_KEY["Pod"]
        target = (body.get("target") or {}) if isinstance(body, dict) else {}
        if target.get("kind") not in (None, "", "Node") or not target.get("name"):
            raise invalid(pods, name, "target.name", "FieldValueRequired", "Required value: a Node name")
        with self.st.cond:
            pod = self.st.objects["Pod"].get((ns, name))
            if pod is None:
                raise not_found(pods, name)
            uid = (body.get("metadata") or {}).get("uid")
            if uid and uid != pod["metadata"]["uid"]:
                raise conflict(pods, name, "Precondition failed: UID in precondition: %s, UID in object meta: %s"
                               % (uid, pod["metadata"]["uid"]))
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict(pods, name, "pod %s is being deleted, cannot be assigned to a host" % name)
            if (pod.get("spec") or {}).get("nodeName"):
                raise conflict(pods, name, 'pod %s is already assigned to node "%s"'
                               % (name, pod["spec"]["nodeName"]))
            new = copy.deepcopy(pod)
            new.setdefault("spec", {})["nodeName"] = target["name"]
            ann = (body.get("metadata") or {}).get("annotations") or {}
            if ann:
                new["metadata"].setdefault("annotations", {}).update(ann)
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            sched = next((c for c in conds if c.get("type") == "PodScheduled"), None)
            if sched is None:
                sched = {"type": "PodScheduled"}
                conds.append(sched)
            if sched.get("status") != "True":
                sched.update({"status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()})
                sched.pop("reason", None)
                sched.pop("message", None)
            self.st.put(new, api=True)
        self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success", "code": 201})

    def _eviction(self, ns, name, body, q):
        """POST pods/{name}/eviction: a policy/v1 (or v1beta1) Eviction. The
        pod's PodDisruptionBudget (pdb_allow_eviction) gives one disruption,
        then the pod is deleted as a DELETE with the Eviction's deleteOptions
        would delete it (graceful for a bound pod). Pods that are Pending,
        Succeeded, Failed or already being deleted skip the budgets, as on the
        real server. The fake checks the deleteOptions preconditions before the
        budget (the real server decrements first, and its disruption
        controller later returns a disruption the failed delete did not use)."""
        pods = BY_KEY["Pod"]
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a policy/v1 Eviction object")
        if body.get("kind") not in (None, "", "Eviction") or \
                body.get("apiVersion") not in (None, "", "policy/v1", "policy/v1beta1"):
            raise bad_request("the body of the request must be a policy/v1 Eviction, not %s %s"
                              % (body.get("apiVersion"), body.get("kind")))
        md = body.get("metadata") or {}
        if not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        if md.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        if md.get("name") != name:
            raise bad_request("name in URL does not match name in Eviction object")
        opts = body.get("deleteOptions") or {}
        if not isinstance(opts, dict):
            raise bad_request("deleteOptions must be an object")
        grace = opts.get("gracePeriodSeconds")
        if grace is not None and not isinstance(grace, int):
            raise bad_request("deleteOptions.gracePeriodSeconds: %r is not an integer" % grace)
        dry = self._dry_run(q) or opts.get("dryRun") == ["All"]
        st = self.st
        with st.cond:
            pod = st.objects["Pod"].get((ns, name))
            if pod is None:
                raise not_found(pods, name)
            st.delete(pods, ns, name, preconditions=opts.get("preconditions"), dry_run=True)  # 409s
            phase = (pod.get("status") or {}).get("phase")
            if phase not in ("Pending", "Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                budgets = [p for (pns, _), p in sorted(st.objects["PodDisruptionBudget.policy"].items())
                           if pns == ns and pdb_selects((p.get("spec") or {}).get("selector"),
                                                        pod["metadata"].get("labels"))]
                if len(budgets) > 1:
                    err = ApiError(500, None, "This pod has more than one PodDisruptionBudget, which the eviction "
                                   "subresource does not support.")
                    del err.status["reason"]  # the real reply has none
                    raise err
                new = pdb_allow_eviction(budgets[0], pod) if budgets else None
                if new is not None and not dry:
                    st.put(new, api=True)  # as an update of its status: MODIFIED, new resourceVersion
            st.delete(pods, ns, name, grace=grace, preconditions=opts.get("preconditions"), dry_run=dry)
        self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success", "code": 201})

    def _wait_for_rv(self, rv):
        """Blocks (holding st.cond) until the store reaches `rv` or too_large_wait
        passes; raises the 504 Too large resource version error then."""
        st = self.st
        end = time.monotonic() + st.too_large_wait
        st.rv_waiters += 1
        st.cond.notify_all()  # a test may wait for the waiter (stats "rv_waiters")
        try:
            while st.rv < rv:
                left = end - time.monotonic()
                if left <= 0:
                    raise too_large(rv, st.rv)
                st.cond.wait(min(left, 0.2))
        finally:
            st.rv_waiters -= 1

    def _list(self, res, ns, sel, fsel, q):
        st = self.st
        limit = int(q.get("limit") or 0)
        cont = q.get("continue") or ""
        rv_text = q.get("resourceVersion") or ""
        with st.cond:
            if rv_text not in ("", "0") and not cont:
                try:
                    self._wait_for_rv(int(rv_text))
                except ValueError:
                    raise bad_request("invalid resourceVersion %r" % rv_text)
            if cont:
                snap = st.snapshots.get(cont)
                if snap is None:
                    raise ApiError(410, "Expired", "The provided continue parameter is too old")
                rv, items = snap
            else:
                rv = str(st.rv)
                items = [copy.deepcopy(o) for (ons, _), o in sorted(st.objects[res.key].items())
                         if (not ns or ons == ns) and sel.matches(o["metadata"].get("labels"))
                         and fsel.matches(o)]
            page, rest = (items[:limit], items[limit:]) if limit > 0 else (items, [])
            meta = {"resourceVersion": rv}
            if rest:
                token = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
                st.snapshots[token] = (rv, rest)
                if len(st.snapshots) > 64:
                    st.snapshots.pop(next(iter(st.snapshots)))
                meta["continue"] = token
                meta["remainingItemCount"] = len(rest)
            if cont:
                st.snapshots.pop(cont, None)
        self._send_json(200, {"kind": res.kind + "List", "apiVersion": res.gv, "metadata": meta, "items": page})

    # ---- watch ----
    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self):
        # A watcher that hung up is noticed here, not only at the next write.
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return socket.socket.recv(self.connection, 1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _frame(self, etype, obj):
        self._chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

    @staticmethod
    def _mangle(st, w, out):
        """/_fake/mangle on one batch of watch events (under st.cond)."""
        now = time.monotonic()
        if out and st.reorder_left > 0 and not w.held:
            st.reorder_left -= 1
            st.reordered += 1
            if len(out) >= 2:
                out = list(out)
                out[-1], out[-2] = out[-2], out[-1]
            else:
                w.held, w.held_since, out = out, now, []
        elif w.held and (out or now - w.held_since >= 0.3):
            out, w.held = list(out) + w.held, []
        if out and st.dup_left > 0:
            doubled = []
            for e in out:
                doubled.append(e)
                if st.dup_left > 0 and e[0] != "ERROR":
                    doubled.append(e)
                    st.dup_left -= 1
                    st.duplicated += 1
            out = doubled
        return out

    def _watch(self, res, ns, sel, fsel, bookmarks, q):
        st = self.st
        kind, gv = res.key, res.gv
        rv_text = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or 0) or None
        w = Watch(kind, ns, sel, fsel, bookmarks)
        pending = []
        with st.cond:
            if rv_text in ("", "0"):
                # Synthetic ADDED events for the current state, then live.
                pos_rv = st.rv
                for (ons, _), o in sorted(st.objects[kind].items()):
                    if watch_event(w, "ADDED", o, None):
                        pending.append(("ADDED", copy.deepcopy(o)))
            else:
                try:
                    pos_rv = int(rv_text)
                except ValueError:
                    raise bad_request("invalid resourceVersion %r" % rv_text)
                if pos_rv + 1 < st.floor:
                    gone = status_obj(410, "Expired", "too old resource version: %d (%d)"
                                      % (pos_rv, st.floor - 1))
                    if st.gone_mode == "http":
                        return self._send_json(410, gone)
                    pending.append(("ERROR", gone))
                    pos_rv = None
                else:
                    # A version not reached yet: the watch cache waits a while
                    # for it, then answers with an ERROR frame.
                    try:
                        self._wait_for_rv(pos_rv)
                    except ApiError as e:
                        pending.append(("ERROR", e.status))
                        pos_rv = None
            if pos_rv is not None:
                st.watches.add(w)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for etype, obj in pending:
                self._frame(etype, obj)
            if pos_rv is None:
                self._chunk(b"")
                return
            deadline = time.monotonic() + timeout if timeout else None
            next_bookmark = time.monotonic() + st.bookmark_interval
            while True:
                out = []
                with st.cond:
                    while True:
                        now = time.monotonic()
                        if w.inbox:
                            break
                        if st.log and st.log[-1][0] > pos_rv:
                            break
                        if deadline and now >= deadline:
                            break
                        if bookmarks and now >= next_bookmark:
                            break
                        if w.held and now - w.held_since >= 0.3:
                            break
                        wake = min([t for t in (deadline, next_bookmark if bookmarks else None) if t]
                                   or [now + 1.0])
                        st.cond.wait(min(0.2, max(0.01, wake - now)))
                        if self._client_gone():
                            raise DropConnection()
                    actions, w.inbox = w.inbox, []
                    if any(a == "expire" for a, _ in actions):
                        out.append(("ERROR", status_obj(410, "Expired", "too old resource version")))
                    else:
                        for rv, k, etype, obj, old in st.log:
                            if rv <= pos_rv or k != kind:
                                continue
                            t = watch_event(w, etype, obj, old)
                            if t:
                                out.append((t, obj))
                        if st.log:
                            pos_rv = max(pos_rv, st.log[-1][0])
                        out = self._mangle(st, w, out)
                    cur_rv = st.rv
                    delay = st.delay
                for a, body in actions:
                    if a == "drop":
                        raise DropConnection()
                    if a == "garbage":
                        self._chunk((body.get("text") or "{not json").encode() + b"\n")
                    if a == "bigframe":
                        n = int(body.get("bytes", 1 << 20))
                        self._chunk(b'{"type":"MODIFIED","object":{"pad":"' + b"x" * n + b'"}}\n')
                for etype, obj in out:
                    if delay:
                        time.sleep(delay)
                    self._frame(etype, obj)
                    if etype == "ERROR":
                        self._chunk(b"")
                        return
                now = time.monotonic()
                if bookmarks and not w.held and (now >= next_bookmark or
                                                 any(a == "bookmark" for a, _ in actions)):
                    self._frame("BOOKMARK", {"kind": res.kind, "apiVersion": gv,
                                             "metadata": {"resourceVersion": str(max(pos_rv, cur_rv))}})
                    next_bookmark = now + st.bookmark_interval
                if deadline and now >= deadline:
                    self._chunk(b"")
                    return
        except DropConnection:
            # Mid-stream: no terminating chunk, just a closed socket.
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            raise
        finally:
            with st.cond:
                st.watches.discard(w)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that hangs up mid-request is normal; anything else is a bug.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            return
        import traceback
        sys.stderr.write("fake-apiserver: error serving %s:\n%s" % (client_address, traceback.format_exc()))
        sys.stderr.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--client-ca", help="accept client certificates signed by this CA")
    ap.add_argument("--token", help="require this bearer token (or a client certificate)")
    ap.add_argument("--bookmark-interval", type=float, default=60.0)
    ap.add_argument("--window", type=int, default=100000, help="events retained for watch replay")
    ap.add_argument("--pod-deletion", choices=("graceful", "immediate"), default="graceful",
                    help="DELETE of a pod bound to a node: graceful (kube-apiserver's) or immediate")
    ap.add_argument("--too-large-wait", type=float, default=3.0,
                    help="seconds a watch or list from a future resourceVersion waits for it")
    ap.add_argument("--kube-version", choices=KUBE_VERSIONS,
                    help="serve the group-versions of this release (resource.k8s.io's DeviceTaintRule: v1beta2 "
                         "in 1.36 behind DRADeviceTaints, v1 in 1.37); default v1.32 plus the GA DRA kinds")
    ap.add_argument("--feature-gates", default="",
                    help="kube-apiserver's form, e.g. DRADeviceTaints=true or GenericWorkload=true "
                         "(the only gates the fake knows)")
    ap.add_argument("--gang-crds", action="store_true",
                    help="serve the gang CRDs: PodGroup (scheduling.x-k8s.io), JobSet, LeaderWorkerSet")
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="exit once this process is no longer our parent (a test that crashed)")
    args = ap.parse_args()
    try:
        gates = parse_feature_gates(args.feature_gates)
    except ValueError as e:
        ap.error(str(e))
    if gates and args.kube_version is None:
        ap.error("--feature-gates needs --kube-version (the gates belong to a release)")
    serve_kube_version(args.kube_version, gates)
    if args.gang_crds:
        add_resources(gang_crd_resources())

    if args.parent_pid:
        def watch_parent():
            while os.getppid() == args.parent_pid:
                time.sleep(0.5)
            os._exit(0)
        threading.Thread(target=watch_parent, daemon=True).start()

    srv = Server((args.host, args.port), Handler)
    srv.state = State(args.window, args.bookmark_interval, args.pod_deletion, args.too_large_wait)
    srv.token = args.token
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        if args.client_ca:
            ctx.load_verify_locations(args.client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)

    def reaper():
        while True:
            with srv.state.cond:
                srv.state.reap()
                srv.state.cond.wait(0.2)
    threading.Thread(target=reaper, daemon=True).start()
    port = srv.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print("PORT %d" % port, flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
