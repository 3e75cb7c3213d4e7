#!/usr/bin/python3
"""A fake Kubernetes API server for duet's tests (Python 3 stdlib only).

It speaks the real wire protocol for what duet uses, so real clients
(kubectl, python3-kubernetes) and duet's own client can be tested against it:

  discovery   GET /version, /api, /apis, /api/v1, /apis/coordination.k8s.io[/v1]
  nodes       GET list (labelSelector, fieldSelector metadata.name, limit/continue),
              GET one, watch, PUT, PATCH, DELETE
  pods        same, namespaced and across namespaces; POST pods/{name}/binding
  events      POST/GET (core v1)
  leases      coordination.k8s.io/v1: GET, POST (409 AlreadyExists),
              PUT (409 Conflict on a stale metadata.resourceVersion), DELETE

Watches (`watch=` in any Go ParseBool form) stream newline-delimited
{"type","object"} frames over chunked encoding, replay from `resourceVersion`,
send BOOKMARK frames when `allowWatchBookmarks` is true, end after
`timeoutSeconds`, and answer a resourceVersion older than the retained event
window with an ERROR frame carrying a 410 Gone Status (as the watch cache
does), or with an HTTP 410 when the control API asks for that form.

Control API (tests drive the fake through it; JSON bodies):
  POST /_fake/put       an object (kind Node/Pod/Event/Lease): create or replace
  POST /_fake/delete    {"kind","namespace","name"}
  POST /_fake/drop      close every open watch mid-stream (no final chunk)
  POST /_fake/garbage   {"text": "..."} write a non-JSON line into every watch
  POST /_fake/bigframe  {"bytes": N} write one N-byte frame into every watch
  POST /_fake/bookmark  send a BOOKMARK now to every watch that allows them
  POST /_fake/compact   forget all retained events: older versions get 410;
                        {"expire_watches": true} also ends open watches with 410
  POST /_fake/gone_mode {"mode": "frame" | "http"}
  POST /_fake/slow      {"delay_ms": N} delay every reply and every frame
  POST /_fake/fail      {"count": N, "code": 500} fail the next N API requests
  GET  /_fake/requests  the API requests seen: [{"method","path","auth","body"}]
  GET  /_fake/stats     {"watches": open watches, "resourceVersion": N}
  POST /_fake/token     register a bearer token for TokenReview (below)

TokenReview (authentication.k8s.io/v1, POST /apis/authentication.k8s.io/v1/tokenreviews):
tokens are registered by the test with POST /_fake/token {"token", "username",
"groups", "extra", "audiences", "expires_in"} ({"token", "revoke": true} forgets
one). A review answers authenticated only for a registered, unexpired token
whose audiences meet spec.audiences (status.audiences is the intersection),
with the error messages the API server uses otherwise.

Usage: fake_apiserver.py [--port 0] [--port-file F] [--tls-cert C --tls-key K]
       [--client-ca CA] [--token T] [--bookmark-interval S] [--window N]
       [--parent-pid PID]
With --port 0 the chosen port is printed as "PORT <n>" on stdout.
"""

import argparse
import base64
import copy
import datetime
import http.server
import json
import re
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid

# kind -> (plural, group/version, namespaced)
KINDS = {
    "Node": ("nodes", "v1", False),
    "Pod": ("pods", "v1", True),
    "Event": ("events", "v1", True),
    "Lease": ("leases", "coordination.k8s.io/v1", True),
}
PLURAL_TO_KIND = {v[0]: k for k, v in KINDS.items()}


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_bool(v):
    # Go's strconv.ParseBool forms, which the apiserver accepts.
    if v in ("1", "t", "T", "true", "True", "TRUE"):
        return True
    if v in ("0", "f", "F", "false", "False", "FALSE", ""):
        return False
    raise ValueError(v)


def status_obj(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {},
         "status": "Failure" if code >= 300 else "Success",
         "message": message, "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


def merge_patch(target, patch):
    # RFC 7386.
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


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


class Watch:
    def __init__(self, kind, ns, sel, fsel, bookmarks):
        self.kind, self.ns, self.sel, self.fsel = kind, ns, sel, fsel
        self.bookmarks = bookmarks
        self.inbox = []  # control actions, under State.cond


class State:
    def __init__(self, window, bookmark_interval):
        self.cond = threading.Condition()
        self.rv = 100
        self.objects = {k: {} for k in KINDS}  # kind -> {(ns, name): obj}
        self.log = []  # (rv, kind, type, obj, old_obj)
        self.window = window
        self.floor = self.rv  # versions below this are gone
        self.watches = set()
        self.bookmark_interval = bookmark_interval
        self.gone_mode = "frame"
        self.delay = 0.0
        self.fail_count = 0
        self.fail_code = 500
        self.requests = []
        self.snapshots = {}  # continue token -> (rv, items)

    # All mutators hold self.cond.
    def _next_rv(self):
        self.rv += 1
        return str(self.rv)

    def _record(self, kind, etype, obj, old):
        self.log.append((self.rv, kind, etype, copy.deepcopy(obj), old))
        if len(self.log) > self.window:
            drop = len(self.log) - self.window
            self.floor = self.log[drop - 1][0]
            del self.log[:drop]
        self.cond.notify_all()

    def put(self, obj, create_only=False, expect_rv=None):
        """Create or replace. Returns (code, object or Status)."""
        kind = obj.get("kind")
        if kind not in KINDS:
            return 400, status_obj(400, "BadRequest", "unknown kind %r" % kind)
        md = obj.setdefault("metadata", {})
        name = md.get("name")
        if not name:
            return 422, status_obj(422, "Invalid", "metadata.name: Required value")
        plural, gv, namespaced = KINDS[kind]
        ns = md.get("namespace", "default") if namespaced else ""
        if namespaced:
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        obj["apiVersion"] = gv
        key = (ns, name)
        old = self.objects[kind].get(key)
        if old is not None and create_only:
            return 409, status_obj(409, "AlreadyExists", '%s "%s" already exists' % (plural, name),
                                   {"name": name, "kind": plural})
        if old is not None and expect_rv is not None and expect_rv != old["metadata"]["resourceVersion"]:
            return 409, status_obj(
                409, "Conflict",
                'Operation cannot be fulfilled on %s "%s": the object has been modified; '
                'please apply your changes to the latest version and try again' % (plural, name),
                {"name": name, "kind": plural})
        if old is not None:
            md["uid"] = old["metadata"]["uid"]
            md["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        else:
            md.setdefault("uid", str(uuid.uuid4()))
            md.setdefault("creationTimestamp", now_rfc3339())
        md["resourceVersion"] = self._next_rv()
        self.objects[kind][key] = obj
        self._record(kind, "MODIFIED" if old is not None else "ADDED", obj, old)
        return (200 if old is not None else 201), obj

    def delete(self, kind, ns, name):
        key = (ns if KINDS[kind][2] else "", name)
        old = self.objects[kind].pop(key, None)
        if old is None:
            return 404, status_obj(404, "NotFound", '%s "%s" not found' % (KINDS[kind][0], name),
                                   {"name": name, "kind": KINDS[kind][0]})
        obj = copy.deepcopy(old)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._record(kind, "DELETED", obj, old)
        return 200, obj


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


class DropConnection(Exception):
    pass


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
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
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code, reason, message):
        self._send_json(code, status_obj(code, reason, message))

    def _body(self):
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
            self._api(method, path, q, raw)
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
                return self._send_json(200, {"watches": len(st.watches), "resourceVersion": st.rv})
        if method != "POST":
            return self._status(405, "MethodNotAllowed", "control calls are POST")
        body, _ = self._json_body()
        body = body or {}
        with st.cond:
            if what == "token":
                return self._send_json(*token_control(self.server, body))
            if what == "put":
                code, obj = st.put(body)
                return self._send_json(code, obj)
            if what == "delete":
                kind = body.get("kind", "")
                if kind not in KINDS:
                    return self._status(400, "BadRequest", "unknown kind")
                code, obj = st.delete(kind, body.get("namespace", "default"), body.get("name", ""))
                return self._send_json(code, obj)
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

    # ---- API ----
    def _api(self, method, path, q, raw):
        st = self.st
        if path == "/version":
            return self._send_json(200, {
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-fake",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
                "platform": "linux/amd64"})
        if path == "/api":
            return self._send_json(200, {
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:%d" % self.server.server_port}]})
        if path == "/apis":
            gv = {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
            return self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": "coordination.k8s.io", "versions": [gv], "preferredVersion": gv}]})
        if path == "/apis/coordination.k8s.io":
            gv = {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
            return self._send_json(200, {"kind": "APIGroup", "apiVersion": "v1", "name": "coordination.k8s.io",
                                         "versions": [gv], "preferredVersion": gv})
        if path == "/api/v1":
            rw = ["create", "delete", "get", "list", "patch", "update", "watch"]
            return self._send_json(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
                 "verbs": rw, "shortNames": ["no"]},
                {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
                 "verbs": rw, "shortNames": ["po"], "categories": ["all"]},
                {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                 "verbs": ["create"]},
                {"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
                 "verbs": ["create"]},
                {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
                 "verbs": rw, "shortNames": ["ev"]}]})
        if path == "/apis/coordination.k8s.io/v1":
            return self._send_json(200, {
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "coordination.k8s.io/v1",
                "resources": [{"name": "leases", "singularName": "lease", "namespaced": True,
                               "kind": "Lease",
                               "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]})

        if path == TOKENREVIEW_PATH and method == "POST":
            return self._send_json(*token_review(self.server, raw))
        m = re.match(r"^/api/v1/namespaces/([^/]+)/bindings$", path)
        if m and method == "POST":
            # The Binding resource (what client libraries post): the pod is
            # named by the body, as in POST pods/{name}/binding.
            try:
                body = json.loads(raw.decode() or "null")
                pod_name = body["metadata"]["name"]
            except (ValueError, KeyError, TypeError):
                return self._status(422, "Invalid", "Binding.metadata.name: Required value")
            return self._api(method, "/api/v1/namespaces/%s/pods/%s/binding" % (m.group(1), pod_name), q, raw)
        m = re.match(r"^/api/v1/(nodes)(?:/([^/]+))?$", path) \
            or re.match(r"^/api/v1/(pods|events)$", path)
        ns, plural, name, sub = "", None, None, None
        if m:
            plural, name = m.group(1), (m.group(2) if m.lastindex >= 2 else None)
        else:
            m = re.match(r"^/(?:api/v1|apis/coordination\.k8s\.io/v1)/namespaces/([^/]+)/"
                         r"(pods|events|leases)(?:/([^/]+)(?:/(binding|status))?)?$", path)
            if not m:
                return self._status(404, "NotFound", "the server could not find the requested resource")
            ns, plural, name, sub = m.group(1), m.group(2), m.group(3), m.group(4)
            is_lease_path = path.startswith("/apis/")
            if (plural == "leases") != is_lease_path:
                return self._status(404, "NotFound", "the server could not find the requested resource")
        kind = PLURAL_TO_KIND[plural]
        namespaced = KINDS[kind][2]

        if method == "GET" and name is None:
            try:
                sel = Selector(q.get("labelSelector"))
                fsel = FieldSelector(q.get("fieldSelector"))
                watch = parse_bool(q.get("watch", ""))
                bookmarks = parse_bool(q.get("allowWatchBookmarks", ""))
            except ValueError as e:
                return self._status(400, "BadRequest", str(e))
            if watch:
                return self._watch(kind, ns, sel, fsel, bookmarks, q)
            return self._list(kind, ns, sel, fsel, q)

        if method == "GET":
            with st.cond:
                obj = st.objects[kind].get((ns, name))
                if obj is None:
                    return self._status(404, "NotFound", '%s "%s" not found' % (plural, name))
                return self._send_json(200, obj)

        try:
            body = json.loads(raw.decode() or "null") if raw else None
        except ValueError as e:
            return self._status(400, "BadRequest", "invalid JSON body: %s" % e)

        if method == "POST" and sub == "binding":
            if not isinstance(body, dict) or (body.get("target") or {}).get("kind") != "Node" \
                    or not (body.get("target") or {}).get("name"):
                return self._status(422, "Invalid", "Binding.target: a Node name is required")
            with st.cond:
                pod = st.objects["Pod"].get((ns, name))
                if pod is None:
                    return self._status(404, "NotFound", 'pods "%s" not found' % name)
                uid = (body.get("metadata") or {}).get("uid")
                if uid and uid != pod["metadata"]["uid"]:
                    return self._status(409, "Conflict", "Precondition failed: UID in precondition: %s, "
                                        "UID in object meta: %s" % (uid, pod["metadata"]["uid"]))
                if (pod.get("spec") or {}).get("nodeName"):
                    return self._status(409, "Conflict", 'pod %s is already assigned to node "%s"'
                                        % (name, pod["spec"]["nodeName"]))
                new = copy.deepcopy(pod)
                new.setdefault("spec", {})["nodeName"] = body["target"]["name"]
                st.put(new)
            return self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                         "status": "Success", "code": 201})

        if method == "POST" and name is None:
            if not isinstance(body, dict):
                return self._status(400, "BadRequest", "body must be an object")
            body["kind"] = kind
            md = body.setdefault("metadata", {})
            if namespaced:
                if md.get("namespace", ns) != ns:
                    return self._status(400, "BadRequest", "the namespace of the object does not match the namespace on the request")
                md["namespace"] = ns
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
            with st.cond:
                code, obj = st.put(body, create_only=True)
            return self._send_json(code, obj)

        if method == "PUT" and name is not None and sub is None:
            if not isinstance(body, dict):
                return self._status(400, "BadRequest", "body must be an object")
            body["kind"] = kind
            md = body.setdefault("metadata", {})
            if md.get("name") != name:
                return self._status(400, "BadRequest", "the name of the object does not match the name on the URL")
            if namespaced:
                md["namespace"] = ns
            with st.cond:
                if (ns, name) not in st.objects[kind]:
                    return self._status(404, "NotFound", '%s "%s" not found' % (plural, name))
                code, obj = st.put(body, expect_rv=md.get("resourceVersion") or None)
            return self._send_json(code, obj)

        if method == "PATCH" and name is not None and sub in (None, "status"):
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                return self._status(415, "UnsupportedMediaType",
                                    "the body of the request was in an unknown format - accepted media types "
                                    "include: application/merge-patch+json, application/strategic-merge-patch+json")
            if not isinstance(body, dict):
                return self._status(400, "BadRequest", "patch must be an object")
            with st.cond:
                cur = st.objects[kind].get((ns, name))
                if cur is None:
                    return self._status(404, "NotFound", '%s "%s" not found' % (plural, name))
                want_rv = (body.get("metadata") or {}).get("resourceVersion")
                if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                    return self._status(409, "Conflict", "the object has been modified")
                new = merge_patch(cur, body)
                new["metadata"]["name"], new["kind"] = name, kind
                code, obj = st.put(new)
            return self._send_json(200, obj)

        if method == "DELETE" and name is not None and sub is None:
            with st.cond:
                code, obj = st.delete(kind, ns, name)
            return self._send_json(code, obj)

        return self._status(405, "MethodNotAllowed", "method %s not allowed on %s" % (method, path))

    def _list(self, kind, ns, sel, fsel, q):
        st = self.st
        plural, gv, _ = KINDS[kind]
        limit = int(q.get("limit") or 0)
        cont = q.get("continue") or ""
        with st.cond:
            if cont:
                snap = st.snapshots.get(cont)
                if snap is None:
                    return self._status(410, "Expired", "The provided continue parameter is too old")
                rv, items = snap
            else:
                rv = str(st.rv)
                items = [copy.deepcopy(o) for (ons, _), o in sorted(st.objects[kind].items())
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
        self._send_json(200, {"kind": kind + "List", "apiVersion": gv, "metadata": meta, "items": page})

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

    def _watch(self, kind, ns, sel, fsel, bookmarks, q):
        st = self.st
        plural, gv, _ = KINDS[kind]
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
                    return self._status(400, "BadRequest", "invalid resourceVersion %r" % rv_text)
                if pos_rv + 1 < st.floor:
                    gone = status_obj(410, "Expired", "too old resource version: %d (%d)"
                                      % (pos_rv, st.floor - 1))
                    if st.gone_mode == "http":
                        return self._send_json(410, gone)
                    pending.append(("ERROR", gone))
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
                if bookmarks and (now >= next_bookmark or any(a == "bookmark" for a, _ in actions)):
                    self._frame("BOOKMARK", {"kind": kind, "apiVersion": gv,
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
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="exit once this process is no longer our parent (a test that crashed)")
    args = ap.parse_args()

    if args.parent_pid:
        import os

        def watch_parent():
            while os.getppid() == args.parent_pid:
                time.sleep(0.5)
            os._exit(0)
        threading.Thread(target=watch_parent, daemon=True).start()

    srv = Server((args.host, args.port), Handler)
    srv.state = State(args.window, args.bookmark_interval)
    srv.token = args.token
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        if args.client_ca:
            ctx.load_verify_locations(args.client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    port = srv.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os
        os.replace(args.port_file + ".tmp", args.port_file)
    print("PORT %d" % port, flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
