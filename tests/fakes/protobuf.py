"""Decodes the few Kubernetes protobuf request bodies the fake accepts.

kubectl's typed commands (`kubectl create namespace ml`) send
application/vnd.kubernetes.protobuf: the magic b"k8s\\x00", then a
runtime.Unknown {1: TypeMeta {1: apiVersion, 2: kind}, 2: raw, 3:
contentEncoding, 4: contentType} whose raw bytes are the object's message
(field numbers from Kubernetes' generated.proto files). Only a Namespace is
decoded (metadata name, generateName, labels, annotations, finalizers; spec
finalizers); anything else, or a field this decoder does not know that is set,
raises Unsupported so that the fake answers 415 instead of storing half an
object. Python 3 stdlib only.
"""

MAGIC = b"k8s\x00"


class Unsupported(Exception):
    pass


def _varint(buf, i):
    out = shift = 0
    while True:
        if i >= len(buf):
            raise Unsupported("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def fields(buf):
    """[(number, value)] of one message: ints for varints, bytes otherwise."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
            if len(v) != n:
                raise Unsupported("truncated field %d" % num)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise Unsupported("wire type %d" % wire)
        out.append((num, v))
    return out


def _str(v):
    return v.decode("utf-8")


def _map(entries):
    out = {}
    for e in entries:
        kv = dict(fields(e))
        out[_str(kv.get(1, b""))] = _str(kv.get(2, b""))
    return out


def _object_meta(buf):
    md, labels, annotations, finalizers = {}, [], [], []
    for num, v in fields(buf):
        if num in (1, 2, 3, 4, 5, 6, 8) and not v or num == 7 and v == 0:
            pass  # empty strings and creationTimestamp, generation 0
        elif num in (1, 2, 3):
            md[{1: "name", 2: "generateName", 3: "namespace"}[num]] = _str(v)
        elif num == 11:
            labels.append(v)
        elif num == 12:
            annotations.append(v)
        elif num == 14:
            finalizers.append(_str(v))
        else:
            raise Unsupported("ObjectMeta field %d" % num)
    if labels:
        md["labels"] = _map(labels)
    if annotations:
        md["annotations"] = _map(annotations)
    if finalizers:
        md["finalizers"] = finalizers
    return md


def _namespace(raw):
    obj = {"kind": "Namespace", "apiVersion": "v1", "metadata": {}}
    for num, v in fields(raw):
        if num == 1:
            obj["metadata"] = _object_meta(v)
        elif num == 2:
            spec = [_str(x) for n, x in fields(v) if n == 1]
            if spec:
                obj["spec"] = {"finalizers": spec}
        elif num == 3:
            for n, x in fields(v):
                if n == 1 and x:
                    obj["status"] = {"phase": _str(x)}
                elif n != 1:
                    raise Unsupported("NamespaceStatus field %d" % n)
        else:
            raise Unsupported("Namespace field %d" % num)
    return obj


DECODERS = {("v1", "Namespace"): _namespace}


def decode(body):
    """The JSON form of a protobuf request body; raises Unsupported."""
    if not body.startswith(MAGIC):
        raise Unsupported("no k8s protobuf magic")
    unknown = dict(fields(body[len(MAGIC):]))
    tm = dict(fields(unknown.get(1, b"")))
    api_version, kind = _str(tm.get(1, b"")), _str(tm.get(2, b""))
    if unknown.get(3) or (unknown.get(4) or b"") not in (b"",):
        raise Unsupported("content encoding or type in runtime.Unknown")
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise Unsupported("%s %s" % (api_version or "?", kind or "?"))
    return decoder(unknown.get(2, b""))
