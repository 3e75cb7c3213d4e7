"""Schemas for tests/fakes/fake_apiserver.py: server-side field validation
(`fieldValidation=Strict|Warn`) and the OpenAPI v3 documents kubectl reads to
learn that the server validates fields itself.

The field names and types come from python3-kubernetes' generated models
(`openapi_types` / `attribute_map`, made from the Kubernetes OpenAPI), imported
on first use. Without python3-kubernetes, `available()` is False: the fake then
neither validates fields nor advertises `fieldValidation`, and kubectl needs
`--validate=false`.
"""

import hashlib
import json

_models = None
_PRIMITIVE = {"str", "int", "bool", "float", "object", "datetime", "date"}


def _load():
    global _models
    if _models is None:
        try:
            import kubernetes.client as models  # noqa: PLC0415 (slow: only when used)
            _models = models
        except ImportError:
            _models = False
    return _models or None


def available():
    return _load() is not None


def _walk_type(m, t, value, path, out):
    if t.startswith("list[") and isinstance(value, list):
        for i, el in enumerate(value):
            _walk_type(m, t[5:-1], el, "%s[%d]" % (path, i), out)
    elif t.startswith("dict(") and isinstance(value, dict):
        inner = t[t.index(",") + 1:-1].strip()
        for k, el in value.items():
            _walk_type(m, inner, el, "%s[%s]" % (path, k), out)
    elif t not in _PRIMITIVE and isinstance(value, dict):
        cls = getattr(m, t, None)
        if cls is None:
            return
        by_json = {j: py for py, j in cls.attribute_map.items()}
        for k, v in value.items():
            p = "%s.%s" % (path, k) if path else k
            if k not in by_json:
                out.append(p)
            else:
                _walk_type(m, cls.openapi_types[by_json[k]], v, p, out)


def unknown_fields(model, obj):
    """Paths of the fields of `obj` that the schema of `model` (a python3-kubernetes
    model class name, e.g. "V1Pod") does not declare, e.g. ["spec.containers[0].imagee"]."""
    m = _load()
    if m is None or not model:
        return []
    out = []
    _walk_type(m, model, obj, "", out)
    return out


def _op(action, gvk, params=(), body=False):
    op = {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
          "parameters": [{"name": p, "in": "query", "schema": {"type": "boolean" if p == "force" else "string"}}
                         for p in params],
          "responses": {"200": {"description": "OK"}}}
    if body:
        op["requestBody"] = {"required": True}
    return op


def gv_document(resources, git_version):
    """The OpenAPI v3 document of one group/version: every path the fake serves
    for `resources`, with the query parameters it honours. Operations name their
    kind (x-kubernetes-group-version-kind) the way kube-apiserver's do."""
    validate = available()
    write = ("dryRun", "fieldManager") + (("fieldValidation",) if validate else ())
    paths = {}
    for r in resources:
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        base = r.prefix + ("/namespaces/{namespace}" if r.namespaced else "") + "/" + r.plural
        ns_param = [{"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}}] \
            if r.namespaced else []
        name_param = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
        lists = ("labelSelector", "fieldSelector", "limit", "continue", "resourceVersion",
                 "resourceVersionMatch", "watch", "allowWatchBookmarks", "timeoutSeconds")
        paths[base] = {"parameters": ns_param,
                       "get": _op("list", gvk, lists),
                       "post": _op("post", gvk, write, body=True)}
        paths[base + "/{name}"] = {"parameters": ns_param + name_param,
                                   "get": _op("get", gvk),
                                   "put": _op("put", gvk, write, body=True),
                                   "patch": _op("patch", gvk, write + ("force",), body=True),
                                   "delete": _op("delete", gvk, ("dryRun", "gracePeriodSeconds"))}
        if r.namespaced:
            paths[r.prefix + "/" + r.plural] = {"get": _op("list", gvk, lists)}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": git_version},
            "paths": paths, "components": {"schemas": {}}}


def v3_index(docs):
    """/openapi/v3: each group/version's document by relative URL and content hash."""
    out = {}
    for key, doc in docs.items():
        h = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        out[key] = {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (key, h)}
    return {"paths": out}
