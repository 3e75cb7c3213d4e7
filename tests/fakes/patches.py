"""The four PATCH forms kube-apiserver accepts, for tests/fakes/fake_apiserver.py.

  application/json-patch+json             RFC 6902 (add, remove, replace, move,
                                          copy, test)
  application/merge-patch+json            RFC 7386
  application/strategic-merge-patch+json  Kubernetes' strategic merge patch:
                                          lists with a patchMergeKey merge by
                                          that key, other lists are replaced;
                                          $patch, $retainKeys,
                                          $setElementOrder/ and
                                          $deleteFromPrimitiveList/ directives
  application/apply-patch+yaml            server-side apply (merged like a
                                          strategic merge patch; see
                                          tests/fakes/README.md for its gaps)

The list strategies come from the Go types' `patchStrategy`/`patchMergeKey`
tags for the fields of the kinds the fake serves (MERGE_KEYS). Errors raise
PatchError(code, message): 400 for a malformed patch document, 422 for a patch
that does not apply (a failed `test`, a missing path). Python 3 stdlib only.
"""

import copy
import json

# Field paths (list indices left out) -> patchMergeKey; "" marks a list of
# primitives merged as a set (patchStrategy:"merge" without a key). A list not
# named here is atomic: a patch replaces it whole (tolerations, taints, ...).
_CONTAINER = {"env": "name", "ports": "containerPort", "volumeMounts": "mountPath",
              "volumeDevices": "devicePath"}
_POD_SPEC = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
             "volumes": "name", "imagePullSecrets": "name", "hostAliases": "ip",
             "topologySpreadConstraints": "topologyKey", "schedulingGates": "name",
             "resourceClaims": "name"}


def _merge_keys():
    keys = {("metadata", "ownerReferences"): "uid", ("metadata", "finalizers"): ""}
    pod = {}
    for field, key in _POD_SPEC.items():
        pod[("spec", field)] = key
    for c in ("containers", "initContainers", "ephemeralContainers"):
        for field, key in _CONTAINER.items():
            pod[("spec", c, field)] = key
    pod[("status", "conditions")] = "type"
    pod[("status", "podIPs")] = "ip"
    node = {("status", "conditions"): "type", ("status", "addresses"): "type",
            ("spec", "podCIDRs"): ""}
    return {"Pod": {**keys, **pod}, "Node": {**keys, **node}, "*": keys}


MERGE_KEYS = _merge_keys()

_ABSENT = object()


class PatchError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def strategy(kind):
    """The list strategy lookup for objects of `kind`: path tuple -> key, "" or None."""
    table = MERGE_KEYS.get(kind, MERGE_KEYS["*"])
    return lambda path: table.get(tuple(path))


# ---- RFC 7386 ----
def merge_patch(target, patch):
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


# ---- RFC 6902 ----
def _pointer(path, what="path"):
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(400, "invalid JSON Patch: %s %r is not a JSON pointer" % (what, path))
    if path == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(container, token, path, allow_end=False):
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(422, "json patch: %s: %r is not an array index" % (path, token))
    i = int(token)
    if i > len(container) or (i == len(container) and not allow_end):
        raise PatchError(422, "json patch: %s: index %d out of range" % (path, i))
    return i


def _walk(doc, tokens, path):
    cur = doc
    for t in tokens:
        if isinstance(cur, dict):
            if t not in cur:
                raise PatchError(422, "json patch: %s: path does not exist" % path)
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_index(cur, t, path)]
        else:
            raise PatchError(422, "json patch: %s: path does not exist" % path)
    return cur


def _add(doc, tokens, value, path):
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, allow_end=True), value)
    else:
        raise PatchError(422, "json patch: %s: parent is not an object or array" % path)
    return doc


def _remove(doc, tokens, path):
    if not tokens:
        raise PatchError(422, "json patch: cannot remove the whole document")
    parent = _walk(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(422, "json patch: %s: path does not exist" % path)
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path))
    raise PatchError(422, "json patch: %s: path does not exist" % path)


def json_patch(doc, ops):
    """Applies the RFC 6902 operations `ops` to a copy of `doc`."""
    if not isinstance(ops, list):
        raise PatchError(400, "invalid JSON Patch: the document must be an array of operations")
    doc = copy.deepcopy(doc)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError(400, "invalid JSON Patch: operation %d has no \"op\"" % n)
        kind = op["op"]
        path = op.get("path")
        tokens = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, "invalid JSON Patch: %s operation %d has no \"value\"" % (kind, n))
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op["value"]), path)
        elif kind == "remove":
            _remove(doc, tokens, path)
        elif kind == "replace":
            if not tokens:
                doc = copy.deepcopy(op["value"])
                continue
            _walk(doc, tokens, path)  # must exist
            parent = _walk(doc, tokens[:-1], path)
            if isinstance(parent, list):
                parent[_index(parent, tokens[-1], path)] = copy.deepcopy(op["value"])
            else:
                parent[tokens[-1]] = copy.deepcopy(op["value"])
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from"), "from")
            if kind == "move" and tokens[:len(src)] == src and len(tokens) > len(src):
                raise PatchError(422, "json patch: cannot move %s into its own child %s" % (op["from"], path))
            value = _walk(doc, src, op["from"])
            if kind == "move":
                _remove(doc, src, op["from"])
            else:
                value = copy.deepcopy(value)
            doc = _add(doc, tokens, value, path)
        elif kind == "test":
            got = _walk(doc, tokens, path)
            if json.dumps(got, sort_keys=True) != json.dumps(op["value"], sort_keys=True):
                raise PatchError(422, "json patch: test operation for path %s failed: value differs" % path)
        else:
            raise PatchError(400, "invalid JSON Patch: unknown operation %r" % kind)
    return doc


# ---- strategic merge patch ----
def _strip(value):
    """A patch value with its directives removed (what lands in the object)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if k not in ("$patch", "$retainKeys") and not k.startswith("$setElementOrder/")
                and not k.startswith("$deleteFromPrimitiveList/") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and "$patch" in v and len(v) == 1)]
    return value


def _reorder(items, order, key):
    if key:
        pos = {json.dumps(o.get(key)): i for i, o in enumerate(order) if isinstance(o, dict)}
        rank = [pos.get(json.dumps(x.get(key)) if isinstance(x, dict) else None) for x in items]
    else:
        pos = {json.dumps(o): i for i, o in enumerate(order)}
        rank = [pos.get(json.dumps(x)) for x in items]
    known = sorted((r, i) for i, r in enumerate(rank) if r is not None)
    return [items[i] for _, i in known] + [x for x, r in zip(items, rank) if r is None]


def _smp_list(orig, patch, path, strat):
    key = strat(path)
    if key is None:
        return _strip(patch)
    orig = copy.deepcopy(orig) if isinstance(orig, list) else []
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return _strip([x for x in patch if not (isinstance(x, dict) and x.get("$patch") == "replace")])
    if key == "":
        return orig + [x for n, x in enumerate(patch) if x not in orig and x not in patch[:n]]
    for el in patch:
        if not isinstance(el, dict) or key not in el:
            raise PatchError(400, "map: %s does not contain declared merge key: %s"
                             % (json.dumps(el), key))
        idx = next((i for i, o in enumerate(orig) if isinstance(o, dict) and o.get(key) == el[key]), None)
        if el.get("$patch") == "delete":
            if idx is not None:
                del orig[idx]
            continue
        if idx is None:
            orig.append(_strip(el))
        else:
            orig[idx] = strategic_merge(orig[idx], el, path, strat)
    return orig


def strategic_merge(orig, patch, path, strat):
    """Applies a strategic merge patch map `patch` at `path` to `orig`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(orig, dict):
        orig = {}
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip(patch)
    if directive == "delete":
        return _ABSENT
    if directive not in (None, "merge"):
        raise PatchError(400, "unknown patch type: %s in map: %s" % (directive, json.dumps(patch)))
    out = copy.deepcopy(orig)
    orders = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list) and isinstance(v, list):
                out[field] = [x for x in out[field] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list):
            out[k] = _smp_list(out.get(k), v, path + (k,), strat)
        elif isinstance(v, dict):
            r = strategic_merge(out.get(k), v, path + (k,), strat)
            if r is _ABSENT:
                out.pop(k, None)
            else:
                out[k] = r
        else:
            out[k] = v
    for field, order in orders.items():
        if isinstance(out.get(field), list) and isinstance(order, list):
            out[field] = _reorder(out[field], order, strat(path + (field,)))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def apply_strategic(obj, patch, kind):
    if not isinstance(patch, dict):
        raise PatchError(400, "strategic merge patch: the patch must be a JSON object")
    r = strategic_merge(obj, patch, (), strategy(kind))
    return {} if r is _ABSENT else r


# ---- server-side apply bookkeeping ----
def fields_v1(obj, kind, path=()):
    """The FieldsV1 set (metadata.managedFields) of the fields `obj` sets."""
    strat = strategy(kind)
    out = {}
    for k, v in obj.items():
        if not path and k in ("apiVersion", "kind"):
            continue
        if path == ("metadata",) and k in ("name", "namespace", "managedFields"):
            continue
        sub = path + (k,)
        if isinstance(v, dict):
            out["f:" + k] = fields_v1(v, kind, sub)
        elif isinstance(v, list):
            key = strat(sub)
            items = {}
            if key:
                for el in v:
                    if isinstance(el, dict) and key in el:
                        entry = fields_v1(el, kind, sub)
                        entry["."] = {}
                        items["k:" + json.dumps({key: el[key]}, separators=(",", ":"))] = entry
            elif key == "":
                for el in v:
                    items["v:" + json.dumps(el, separators=(",", ":"))] = {}
            out["f:" + k] = items
        else:
            out["f:" + k] = {}
    return out


def leaves(fields, prefix=()):
    """The leaf paths of a FieldsV1 set, as tuples of its keys ("f:spec", ...)."""
    out = set()
    for k, v in fields.items():
        p = prefix + (k,)
        if k == "." or not v:
            out.add(p)
        else:
            out |= leaves(v, p)
    return out


def _step(cur, token):
    if token.startswith("f:"):
        return cur.get(token[2:], _ABSENT) if isinstance(cur, dict) else _ABSENT
    if not isinstance(cur, list):
        return _ABSENT
    want = json.loads(token[2:])
    for el in cur:
        if token.startswith("k:") and isinstance(el, dict) and all(el.get(a) == b for a, b in want.items()):
            return el
        if token.startswith("v:") and el == want:
            return el
    return _ABSENT


def value_at(obj, path):
    """The value a FieldsV1 path names in `obj` (_ABSENT if none)."""
    cur = obj
    for token in path:
        if token == ".":
            break
        cur = _step(cur, token)
        if cur is _ABSENT:
            return _ABSENT
    return cur


def remove_at(obj, path):
    """Removes the field, keyed list element or set value a FieldsV1 path names."""
    if path[-1] == ".":
        path = path[:-1]
    parent = obj
    for token in path[:-1]:
        parent = _step(parent, token)
        if parent is _ABSENT:
            return
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif isinstance(parent, list):
        el = _step(parent, last)
        if el is not _ABSENT:
            parent.remove(el)


def path_text(path):
    """A FieldsV1 path as kube-apiserver prints it: .spec.containers[name="main"].image"""
    out = ""
    for token in path:
        if token == ".":
            continue
        if token.startswith("f:"):
            out += "." + token[2:]
        elif token.startswith("k:"):
            out += "[" + ",".join("%s=%s" % (k, json.dumps(v)) for k, v in json.loads(token[2:]).items()) + "]"
        else:
            out += "[=" + token[2:] + "]"
    return out


def _drop(fields, path):
    node = fields
    for token in path[:-1]:
        node = node.get(token)
        if node is None:
            return
    node.pop(path[-1], None)


def server_side_apply(cur, applied, kind, manager, force, api_version, now):
    """Applies `applied` for `manager` to `cur` (None: create). Returns the new
    object with metadata.managedFields, or raises ApplyConflict when another
    applier owns a field this one sets to a different value (unless `force`).
    Fields the manager applied before and no longer applies are removed unless
    another manager owns them. Only appliers (operation Apply) own fields."""
    mine = fields_v1(applied, kind)
    entries = copy.deepcopy((cur or {}).get("metadata", {}).get("managedFields") or [])
    prev = next((e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"), None)
    others = [e for e in entries if e is not prev and e.get("operation") == "Apply"]
    new_leaves = leaves(mine)
    conflicts = []
    for e in others:
        for p in sorted(new_leaves & leaves(e.get("fieldsV1") or {})):
            if p[-1] != "." and json.dumps(value_at(cur, p), sort_keys=True, default=str) != \
                    json.dumps(value_at(applied, p), sort_keys=True, default=str):
                conflicts.append((e["manager"], p))
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    for e in others:
        for m, p in conflicts:
            if m == e["manager"]:
                _drop(e["fieldsV1"], p)
    new = apply_strategic(cur or {}, applied, kind)
    if prev is not None:
        kept = set()
        for e in others:
            kept |= leaves(e.get("fieldsV1") or {})
        for p in sorted(leaves(prev.get("fieldsV1") or {}) - new_leaves - kept, key=len):
            remove_at(new, p)
    entries = [e for e in entries if e is not prev]
    entries.append({"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now,
                    "fieldsType": "FieldsV1", "fieldsV1": mine})
    new.setdefault("metadata", {})["managedFields"] = entries
    return new


class ApplyConflict(Exception):
    def __init__(self, conflicts):
        self.conflicts = conflicts  # [(manager, path)]
        managers = sorted({m for m, _ in conflicts})
        if len(conflicts) == 1:
            text = 'Apply failed with 1 conflict: conflict with "%s": %s' % (managers[0], path_text(conflicts[0][1]))
        else:
            text = "Apply failed with %d conflicts: %s" % (len(conflicts), "; ".join(
                'conflicts with "%s": %s' % (m, ", ".join(path_text(p) for mm, p in conflicts if mm == m))
                for m in managers))
        super().__init__(text)
        self.message = text
