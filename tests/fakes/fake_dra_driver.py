#!/usr/bin/python3
"""A fake DRA vendor driver for duet's DRA lending tests (issue 26): it
publishes ResourceSlices to the fake apiserver (tests/fakes/fake_apiserver.py)
in the shapes two real drivers publish, and checks an allocated claim the way
each driver's kubelet plugin does at NodePrepareResources. Stdlib only; it
talks to the apiserver over its HTTP API like a real driver's controller.

Shapes (resource.k8s.io/v1 ResourceSlice: spec.driver, spec.nodeName,
spec.pool {name, generation, resourceSliceCount}, spec.devices[] {name,
attributes {NAME: {string|int|bool|version}}, capacity {NAME: {value}}}):

  nvidia  driver `gpu.nvidia.com`; one slice and one pool per node, the pool
          named after the node. A whole GPU is `gpu-<minor>` with attributes
          type=gpu, uuid (`GPU-<uuid>`), productName, brand, architecture,
          cudaComputeCapability/driverVersion/cudaDriverVersion (version),
          the PCI address both as `pcieBusID` and as the standard
          `resource.kubernetes.io/pciBusID`, and capacity `memory`; no
          index or minor attribute. Optional siblings of the same GPU:
          MIG devices `gpu-<minor>-mig-<giProfileId>-<start>-<size>` (type=mig,
          parentUUID, profile) and `gpu-vfio-<index>` (type=vfio).
  tpu     driver `tpu.google.com`; one slice and pool per node; chips
          `accel0`..`accel<N-1>` with attributes index, uuid, tpuGen, brand
          (Google), accelerator, chipCount and topology. Every chip of a node
          carries the same uuid (the shape issue 26 records); `per_chip_uuid`
          gives each chip its own, as the newest driver derives it from
          node name and chip name.

Prepare refusals (`prepare()`):
  nvidia  a result naming a device this node's slice does not publish.
  tpu     the same, and any claim whose tpu.google.com results do not take
          every chip of the node (the driver supports whole-host claims only);
          results of other drivers in the same claim are not counted.

Checked against public sources (facts only, no code copied):
  - ResourceSlice/ResourceClaim field names and the v1 attribute value forms:
    the Kubernetes API reference for resource.k8s.io/v1.
  - NVIDIA: github.com/NVIDIA/k8s-dra-driver-gpu,
    cmd/gpu-kubelet-plugin/deviceinfo.go (device names gpu-<minor>,
    gpu-<minor>-mig-<profile>-<start>-<size>, gpu-vfio-<index>; attribute and
    capacity names). The stored version publishes `pcieBusID`; issue 26 and
    consumers of later releases use `resource.kubernetes.io/pciBusID`, so both
    are published. NVIDIA's partitionable-device counters (a GPU and its MIG
    devices consuming one budget) are not modelled.
  - TPU: github.com/kubernetes-sigs/dra-driver-google-tpu,
    cmd/tpu-dra-kubeletplugin/manager.go (accel<N> names, attributes) and
    state.go (prepare refuses a claim whose results for tpu.google.com do not
    number the node's chip count). The wording of the refusal here is ours.

CLI:
  fake_dra_driver.py publish --server URL --shape nvidia|tpu --nodes N
                             [--devices K] [--mig] [--vfio] [--node-prefix P]
  fake_dra_driver.py prepare --server URL --shape nvidia|tpu --node NODE
                             --namespace NS --claim NAME [--devices K]
prints the slices made, or the prepared devices (exit 1 with the refusal on
stderr when the driver would refuse).
"""

import argparse
import http.client
import json
import sys
import urllib.parse
import uuid as uuidlib

NVIDIA = "gpu.nvidia.com"
TPU = "tpu.google.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


class ApiError(Exception):
    """A non-2xx answer from the apiserver: `code` and the Status body."""

    def __init__(self, code, body):
        self.code = code
        self.body = body
        msg = body.get("message") if isinstance(body, dict) else body
        super().__init__("HTTP %d: %s" % (code, msg))


class PrepareError(Exception):
    """The driver's kubelet plugin would refuse NodePrepareResources."""


def request(server, method, path, body=None, ctype="application/json"):
    """One HTTP request to the apiserver at `server` (http://host:port); the
    decoded JSON answer, or ApiError."""
    u = urllib.parse.urlsplit(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    obj = json.loads(text) if text else None
    if r.status >= 300:
        raise ApiError(r.status, obj)
    return obj


def _s(v):
    return {"string": v}


def _v(v):
    return {"version": v}


def _uuid(*parts):
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "duet-fake-dra/" + "/".join(parts)))


def nvidia_devices(node, gpus=8, mig=False, vfio=False):
    """The devices NVIDIA's driver would publish for `gpus` GPUs on `node`
    (H100-like figures); with `mig`, two 1g.10gb MIG devices per GPU; with
    `vfio`, one gpu-vfio-<i> per GPU."""
    out = []
    for minor in range(gpus):
        gpu_uuid = "GPU-" + _uuid(node, "gpu", str(minor))
        bus = "0000:%02x:00.0" % (0x18 + minor * 0x10)
        common = {"productName": _s("NVIDIA H100 80GB HBM3"), "brand": _s("Nvidia"),
                  "architecture": _s("Hopper"), "cudaComputeCapability": _v("9.0.0"),
                  "driverVersion": _v("550.90.7"), "cudaDriverVersion": _v("12.4.0")}
        out.append({"name": "gpu-%d" % minor,
                    "attributes": dict(common, type=_s("gpu"), uuid=_s(gpu_uuid), pcieBusID=_s(bus),
                                       **{PCI_BUS_ID: _s(bus)}),
                    "capacity": {"memory": {"value": "80Gi"}}})
        if mig:
            for start in (0, 1):
                out.append({"name": "gpu-%d-mig-19-%d-1" % (minor, start),
                            "attributes": dict(common, type=_s("mig"), profile=_s("1g.10gb"),
                                               uuid=_s("MIG-" + _uuid(node, "mig", str(minor), str(start))),
                                               parentUUID=_s(gpu_uuid), pcieBusID=_s(bus),
                                               **{PCI_BUS_ID: _s(bus)}),
                            "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}}})
        if vfio:
            out.append({"name": "gpu-vfio-%d" % minor,
                        "attributes": {"type": _s("vfio"), "uuid": _s(gpu_uuid), "productName": common["productName"],
                                       "pcieBusID": _s(bus), PCI_BUS_ID: _s(bus), "vendorID": _s("0x10de"),
                                       "deviceID": _s("0x2330"), "numa": {"int": minor // 4}},
                        "capacity": {"addressableMemory": {"value": "80Gi"}}})
    return out


def tpu_devices(node, chips=4, per_chip_uuid=False, accelerator="tpu-v6e-slice", topology="2x2"):
    """The chips Google's TPU driver would publish for a `chips`-chip host."""
    shared = "tpu-" + _uuid(node)
    return [{"name": "accel%d" % i,
             "attributes": {"index": {"int": i},
                            "uuid": _s("tpu-" + _uuid(node, "accel%d" % i) if per_chip_uuid else shared),
                            "tpuGen": _s("v6e"), "brand": _s("Google"), "accelerator": _s(accelerator),
                            "chipCount": {"int": chips}, "topology": _s(topology)}}
            for i in range(chips)]


def resource_slice(shape, node, devices, generation=1):
    driver = NVIDIA if shape == "nvidia" else TPU
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "%s-%s" % (node, driver)},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}


def node_names(nodes, prefix=None, shape="nvidia"):
    prefix = prefix or ("gpu-node-" if shape == "nvidia" else "tpu-node-")
    return ["%s%d" % (prefix, i + 1) for i in range(nodes)]


def publish(server, shape, nodes=1, devices=None, mig=False, vfio=False, node_prefix=None,
            per_chip_uuid=False):
    """Creates one ResourceSlice per node (gpu-node-1.. or tpu-node-1..) and
    returns the stored slices. `devices`: GPUs (default 8) or chips (default 4)
    per node. A slice that exists already is replaced with the pool's
    generation raised, as a driver republishing does."""
    if shape not in ("nvidia", "tpu"):
        raise ValueError("shape: must be 'nvidia' or 'tpu', got %r" % (shape,))
    out = []
    for node in node_names(nodes, node_prefix, shape):
        if shape == "nvidia":
            devs = nvidia_devices(node, 8 if devices is None else devices, mig, vfio)
        else:
            devs = tpu_devices(node, 4 if devices is None else devices, per_chip_uuid)
        obj = resource_slice(shape, node, devs)
        name = obj["metadata"]["name"]
        try:
            out.append(request(server, "POST", SLICES, obj))
        except ApiError as e:
            if e.code != 409:
                raise
            old = request(server, "GET", SLICES + "/" + name)
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            obj["spec"]["pool"]["generation"] = old["spec"]["pool"].get("generation", 0) + 1
            out.append(request(server, "PUT", SLICES + "/" + name, obj))
    return out


def prepare(server, shape, node, claim):
    """What the driver's kubelet plugin on `node` would do with the allocated
    `claim` (a ResourceClaim object): the list of (request, pool, device) it
    prepares, or PrepareError with the reason it refuses."""
    driver = NVIDIA if shape == "nvidia" else TPU
    alloc = (claim.get("status") or {}).get("allocation")
    name = claim["metadata"]["name"]
    if not alloc:
        raise PrepareError("claim %s is not allocated" % name)
    slices = request(server, "GET", SLICES)
    published = {(s["spec"]["pool"]["name"], d["name"]) for s in slices["items"]
                 if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node
                 for d in s["spec"].get("devices", [])}
    mine = [r for r in alloc.get("devices", {}).get("results", []) if r.get("driver") == driver]
    for r in mine:
        if (r.get("pool"), r.get("device")) not in published:
            raise PrepareError("claim %s: device %s/%s is not published by %s on node %s"
                               % (name, r.get("pool"), r.get("device"), driver, node))
    if shape == "tpu":
        chips = len({d for _, d in published})
        if len(mine) != chips:
            raise PrepareError("claim %s takes %d of the %d TPU chips of node %s: the TPU driver prepares "
                               "only claims for every chip of the node" % (name, len(mine), chips, node))
    return [(r["request"], r["pool"], r["device"]) for r in mine]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pub = sub.add_parser("publish")
    pub.add_argument("--server", required=True)
    pub.add_argument("--shape", required=True, choices=("nvidia", "tpu"))
    pub.add_argument("--nodes", type=int, default=1)
    pub.add_argument("--devices", type=int)
    pub.add_argument("--mig", action="store_true")
    pub.add_argument("--vfio", action="store_true")
    pub.add_argument("--node-prefix")
    pub.add_argument("--per-chip-uuid", action="store_true")
    pre = sub.add_parser("prepare")
    pre.add_argument("--server", required=True)
    pre.add_argument("--shape", required=True, choices=("nvidia", "tpu"))
    pre.add_argument("--node", required=True)
    pre.add_argument("--namespace", default="default")
    pre.add_argument("--claim", required=True)
    a = p.parse_args(argv)
    try:
        if a.cmd == "publish":
            if a.nodes < 1 or (a.devices is not None and a.devices < 1):
                p.error("--nodes and --devices: must be at least 1")
            for s in publish(a.server, a.shape, a.nodes, a.devices, a.mig, a.vfio, a.node_prefix,
                             a.per_chip_uuid):
                print(s["metadata"]["name"], " ".join(d["name"] for d in s["spec"]["devices"]))
        else:
            claim = request(a.server, "GET", "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/%s"
                            % (a.namespace, a.claim))
            for r in prepare(a.server, a.shape, a.node, claim):
                print(*r)
    except PrepareError as e:
        print("prepare refused: %s" % e, file=sys.stderr)
        return 1
    except (ApiError, OSError) as e:
        print("fake_dra_driver: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
