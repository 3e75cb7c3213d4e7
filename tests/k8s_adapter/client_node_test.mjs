// The fake apiserver (tests/fakes/fake_apiserver.py) against a third real
// client, @kubernetes/client-node 1.x, over HTTPS with a bearer token: list,
// watch, create, patch (its default JSON Patch, merge patch, strategic merge
// patch, server-side apply), binding, eviction under a PodDisruptionBudget,
// events.k8s.io/v1, namespaces, leases across namespaces, graceful deletion
// and the Status error bodies; resource.k8s.io/v1 (DRA): ResourceV1Api for
// the GA kinds, and KubernetesObjectApi for DeviceTaintRule, which client-node
// 1.4.0 models only at v1alpha3 (a version the fake's 1.36/1.37 do not serve).
// The client is installed outside the clone by scripts/client-node.sh; this
// test only looks it up (offline). Run: node tests/k8s_adapter/client_node_test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..', '..');
const fakePath = join(repo, 'tests', 'fakes', 'fake_apiserver.py');
const TOKEN = 'duet-client-node-token';

function clientModulePath() {
  const out = execFileSync(join(repo, 'scripts', 'client-node.sh'), ['--offline'], { encoding: 'utf8' });
  const nm = out.trim().split('=', 2)[1];
  return join(nm, '@kubernetes', 'client-node', 'dist', 'index.js');
}

const k8s = await import(pathToFileURL(clientModulePath()).href);

let tmp, certs, fake, url, kc, core, coord, events, policy;

function makeTls(dir) {
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' });
  run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2',
      '-subj', '/CN=duet-test-ca');
  run('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'server.key', '-out', 'server.csr', '-subj',
      '/CN=127.0.0.1');
  writeFileSync(join(dir, 'ext.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out',
      'server.crt', '-days', '2', '-extfile', 'ext.cnf');
  return { ca: join(dir, 'ca.crt'), cert: join(dir, 'server.crt'), key: join(dir, 'server.key') };
}

function startFake(extra = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn('/usr/bin/python3', [fakePath, '--port', '0', '--parent-pid', String(process.pid),
      '--tls-cert', certs.cert, '--tls-key', certs.key, '--token', TOKEN, ...extra],
    { stdio: ['ignore', 'pipe', 'inherit'] });
    let buf = '';
    proc.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/^PORT (\d+)\n/);
      if (m) resolve({ proc, port: Number(m[1]) });
    });
    proc.on('exit', (code) => reject(new Error(`fake apiserver exited ${code}: ${buf}`)));
  });
}

// The fake's control API (and raw API reads), over the same TLS.
function call(method, path, body) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = https.request(`${url}${path}`, {
      method, ca: readFileSync(certs.ca),
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${TOKEN}` },
    }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ code: res.statusCode, body: text ? JSON.parse(text) : null }));
    });
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}
const put = async (obj) => (await call('POST', '/_fake/put', obj)).body;
const requests = async () => (await call('GET', '/_fake/requests')).body;

function node(name, labels = {}) {
  return { kind: 'Node', apiVersion: 'v1', metadata: { name, labels },
    status: { capacity: { 'nvidia.com/gpu': '8' }, allocatable: { 'nvidia.com/gpu': '8' } } };
}

function pod(name, extra = {}) {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name, namespace: 'default', labels: { app: 'trainer' } },
    spec: {
      schedulerName: 'duet',
      containers: [{ name: 'main', image: 'nvcr.io/nvidia/pytorch:24.10-py3',
        resources: { limits: { 'nvidia.com/gpu': '1' } } }],
      tolerations: [{ key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' }],
      ...extra,
    },
  };
}

// The Status an ApiException carries (client-node keeps the body as text).
function statusOf(e) {
  assert.ok(e instanceof k8s.ApiException, `not an ApiException: ${e}`);
  return typeof e.body === 'string' ? JSON.parse(e.body) : e.body;
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'duet-client-node-'));
  certs = makeTls(tmp);
  const started = await startFake();
  fake = started.proc;
  url = `https://127.0.0.1:${started.port}`;
  kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'fake', server: url, caFile: certs.ca }],
    users: [{ name: 'duet', token: TOKEN }],
    contexts: [{ name: 'fake', cluster: 'fake', user: 'duet' }],
    currentContext: 'fake',
  });
  core = kc.makeApiClient(k8s.CoreV1Api);
  coord = kc.makeApiClient(k8s.CoordinationV1Api);
  events = kc.makeApiClient(k8s.EventsV1Api);
  policy = kc.makeApiClient(k8s.PolicyV1Api);
  await put(node('gpu-node-1', { 'cloud.google.com/gke-accelerator': 'nvidia-h100-80gb' }));
  await put(node('tpu-node-1', { 'cloud.google.com/gke-nodepool': 'shared-v5e' }));
});

after(() => {
  fake?.kill();
  rmSync(tmp, { recursive: true, force: true });
});

test('list nodes with a label selector and pages', async () => {
  const all = await core.listNode();
  assert.deepEqual(all.items.map((n) => n.metadata.name), ['gpu-node-1', 'tpu-node-1']);
  const sel = await core.listNode({ labelSelector: 'cloud.google.com/gke-accelerator' });
  assert.deepEqual(sel.items.map((n) => n.metadata.name), ['gpu-node-1']);
  const page = await core.listNode({ limit: 1 });
  assert.equal(page.items.length, 1);
  const rest = await core.listNode({ limit: 1, _continue: page.metadata._continue });
  assert.equal(rest.items[0].metadata.name, 'tpu-node-1');
  assert.ok((await requests()).every((r) => r.auth === `Bearer ${TOKEN}`));
});

test('watch sees create, patch and delete in order', async () => {
  const rv = (await core.listNamespacedPod({ namespace: 'default' })).metadata.resourceVersion;
  const seen = [];
  let wake;
  const enough = new Promise((resolve) => { wake = resolve; });
  const ctl = await new k8s.Watch(kc).watch('/api/v1/namespaces/default/pods',
    { resourceVersion: rv, allowWatchBookmarks: true },
    (type, obj) => {
      seen.push([type, obj.metadata.name]);
      if (seen.length === 3) wake();
    }, () => wake());
  await core.createNamespacedPod({ namespace: 'default', body: pod('watched-0') });
  await core.patchNamespacedPod({ name: 'watched-0', namespace: 'default',
    body: [{ op: 'add', path: '/metadata/labels/stage', value: 'two' }] });
  await core.deleteNamespacedPod({ name: 'watched-0', namespace: 'default' });  // unbound: at once
  await enough;
  ctl.abort();
  assert.deepEqual(seen, [['ADDED', 'watched-0'], ['MODIFIED', 'watched-0'], ['DELETED', 'watched-0']]);
});

test('create, then patch with JSON Patch (the default), merge patch and strategic merge patch', async () => {
  const created = await core.createNamespacedPod({ namespace: 'default', body: pod('trainer-0') });
  assert.equal(created.metadata.namespace, 'default');
  assert.ok(created.metadata.uid);

  // client-node's default patch type is JSON Patch.
  let p = await core.patchNamespacedPod({ name: 'trainer-0', namespace: 'default', body: [
    { op: 'test', path: '/spec/schedulerName', value: 'duet' },
    { op: 'add', path: '/metadata/annotations', value: { 'duet.dev/devices': 'gpu:0' } },
    { op: 'replace', path: '/spec/containers/0/image', value: 'nvcr.io/nvidia/pytorch:25.01-py3' },
  ] });
  assert.equal(p.metadata.annotations['duet.dev/devices'], 'gpu:0');
  assert.equal(p.spec.containers[0].image, 'nvcr.io/nvidia/pytorch:25.01-py3');
  const types = (await requests()).filter((r) => r.method === 'PATCH').map((r) => r.content_type);
  assert.equal(types.at(-1), 'application/json-patch+json');

  // A failed "test" changes nothing: 422 with a Status.
  await assert.rejects(core.patchNamespacedPod({ name: 'trainer-0', namespace: 'default',
    body: [{ op: 'test', path: '/spec/schedulerName', value: 'default-scheduler' },
      { op: 'remove', path: '/metadata/annotations' }] }), (e) => {
    const s = statusOf(e);
    assert.equal(e.code, 422);
    assert.equal(s.reason, 'Invalid');
    return true;
  });

  p = await core.patchNamespacedPod({ name: 'trainer-0', namespace: 'default',
    body: { metadata: { annotations: { 'duet.dev/devices': 'gpu:0,1' } } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
  assert.equal(p.metadata.annotations['duet.dev/devices'], 'gpu:0,1');

  // Strategic merge: containers merge by name, tolerations (no merge key) are replaced.
  p = await core.patchNamespacedPod({ name: 'trainer-0', namespace: 'default', body: {
    spec: { containers: [{ name: 'sidecar', image: 'busybox' }],
      tolerations: [{ key: 'google.com/tpu', operator: 'Exists' }] } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch));
  assert.deepEqual(p.spec.containers.map((c) => c.name), ['main', 'sidecar']);
  assert.deepEqual(p.spec.tolerations.map((t) => t.key), ['google.com/tpu']);

  await assert.rejects(core.patchNamespacedPod({ name: 'trainer-0', namespace: 'default', body: {} },
    k8s.setHeaderOptions('Content-Type', 'application/yaml')), (e) => {
    assert.equal(e.code, 415);
    assert.equal(statusOf(e).reason, 'UnsupportedMediaType');
    return true;
  });
});

test('server-side apply creates, then merges and records the field manager', async () => {
  const apply = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.ServerSideApply);
  const body = pod('applied-0');
  let p = await core.patchNamespacedPod({ name: 'applied-0', namespace: 'default', body,
    fieldManager: 'duet-test' }, apply);
  assert.equal(p.metadata.name, 'applied-0');
  body.metadata.labels.tier = 'gold';
  p = await core.patchNamespacedPod({ name: 'applied-0', namespace: 'default', body,
    fieldManager: 'duet-test' }, apply);
  assert.equal(p.metadata.labels.tier, 'gold');
  const mf = p.metadata.managedFields.filter((m) => m.manager === 'duet-test');
  assert.equal(mf.length, 1);
  assert.equal(mf[0].operation, 'Apply');
  assert.ok(mf[0].fieldsV1['f:spec']['f:containers']['k:{"name":"main"}']);
  await assert.rejects(core.patchNamespacedPod({ name: 'applied-0', namespace: 'default', body }, apply),
    (e) => e.code === 400 && /fieldManager is required/.test(statusOf(e).message));
});

test('binding sets nodeName and PodScheduled; delete of a bound pod is graceful', async () => {
  await core.createNamespacedPod({ namespace: 'default', body: pod('bound-0') });
  const uid = (await core.readNamespacedPod({ name: 'bound-0', namespace: 'default' })).metadata.uid;
  await core.createNamespacedPodBinding({ name: 'bound-0', namespace: 'default', body: {
    apiVersion: 'v1', kind: 'Binding', metadata: { name: 'bound-0', uid },
    target: { apiVersion: 'v1', kind: 'Node', name: 'gpu-node-1' } } });
  let p = await core.readNamespacedPod({ name: 'bound-0', namespace: 'default' });
  assert.equal(p.spec.nodeName, 'gpu-node-1');
  const sched = p.status.conditions.find((c) => c.type === 'PodScheduled');
  assert.equal(sched.status, 'True');
  assert.ok(sched.lastTransitionTime);
  await assert.rejects(core.createNamespacedPodBinding({ name: 'bound-0', namespace: 'default', body: {
    metadata: { name: 'bound-0' }, target: { kind: 'Node', name: 'tpu-node-1' } } }),
  (e) => e.code === 409 && statusOf(e).reason === 'Conflict');

  // Strategic merge on status: conditions merge by type.
  p = await core.patchNamespacedPodStatus({ name: 'bound-0', namespace: 'default', body: {
    status: { conditions: [{ type: 'Ready', status: 'False' }] } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch));
  assert.deepEqual(p.status.conditions.map((c) => c.type).sort(), ['PodScheduled', 'Ready']);

  const t0 = Date.now();
  const marked = await core.deleteNamespacedPod({ name: 'bound-0', namespace: 'default',
    gracePeriodSeconds: 1 });
  assert.equal(marked.metadata.deletionGracePeriodSeconds, 1);
  assert.ok(marked.metadata.deletionTimestamp);
  // Still there while the grace period runs (no kubelet ends it sooner)...
  assert.ok((await core.readNamespacedPod({ name: 'bound-0', namespace: 'default' })).metadata.deletionTimestamp);
  // ...and gone once it has passed.
  for (;;) {
    const r = await call('GET', '/api/v1/namespaces/default/pods/bound-0');
    if (r.code === 404) break;
    assert.ok(Date.now() - t0 < 10000, 'bound-0 outlived its grace period');
    await new Promise((res) => setTimeout(res, 100));
  }
  assert.ok(Date.now() - t0 >= 900, `deleted after ${Date.now() - t0} ms, before its grace period`);
});

test('eviction spends the PodDisruptionBudget, then gets 429', async () => {
  for (const name of ['evict-0', 'evict-1']) {
    const p = pod(name);
    p.metadata.labels = { app: 'evictable' };
    p.status = { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] };
    await put(p);
  }
  await policy.createNamespacedPodDisruptionBudget({ namespace: 'default', body: {
    metadata: { name: 'evictable' },
    spec: { minAvailable: 1, selector: { matchLabels: { app: 'evictable' } } } } });
  await policy.patchNamespacedPodDisruptionBudgetStatus({ name: 'evictable', namespace: 'default',
    body: { status: { disruptionsAllowed: 1, currentHealthy: 2, desiredHealthy: 1, expectedPods: 2 } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
  const evict = (name) => core.createNamespacedPodEviction({ name, namespace: 'default', body: {
    apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name, namespace: 'default' } } });

  await evict('evict-0');
  assert.equal((await call('GET', '/api/v1/namespaces/default/pods/evict-0')).code, 404);
  const pdb = await policy.readNamespacedPodDisruptionBudget({ name: 'evictable', namespace: 'default' });
  assert.equal(pdb.status.disruptionsAllowed, 0);
  await assert.rejects(evict('evict-1'), (e) => {
    const s = statusOf(e);
    assert.equal(e.code, 429);
    assert.equal(s.reason, 'TooManyRequests');
    assert.equal(s.details.causes[0].reason, 'DisruptionBudget');
    return true;
  });
  assert.equal((await call('GET', '/api/v1/namespaces/default/pods/evict-1')).code, 200);
  await core.deleteNamespacedPod({ name: 'evict-1', namespace: 'default' });
});

test('events.k8s.io/v1 events and namespaces', async () => {
  await core.createNamespace({ body: { metadata: { name: 'ml' } } });
  const ns = await core.listNamespace();
  assert.ok(ns.items.map((n) => n.metadata.name).includes('default'));
  assert.equal(ns.items.find((n) => n.metadata.name === 'ml').status.phase, 'Active');

  const ev = await events.createNamespacedEvent({ namespace: 'ml', body: {
    metadata: { generateName: 'trainer-0.' }, eventTime: new Date(), type: 'Warning',
    reason: 'DuetRefused', action: 'Scheduling', note: 'no free GPU',
    reportingController: 'duet.dev/bridge', reportingInstance: 'duet-bridge-0',
    regarding: { kind: 'Pod', namespace: 'ml', name: 'trainer-0' } } });
  assert.ok(ev.metadata.name.startsWith('trainer-0.'));
  assert.equal(ev.apiVersion, 'events.k8s.io/v1');
  const all = await events.listEventForAllNamespaces();
  assert.deepEqual(all.items.map((e) => e.note), ['no free GPU']);
});

test('leases: create, conflict on a stale replace, list across namespaces; error bodies', async () => {
  const lease = (ns) => ({ metadata: { name: 'duet-bridge', namespace: ns },
    spec: { holderIdentity: 'a', leaseDurationSeconds: 15 } });
  const got = await coord.createNamespacedLease({ namespace: 'duet-system', body: lease('duet-system') });
  await coord.createNamespacedLease({ namespace: 'kube-system', body: lease('kube-system') });
  await assert.rejects(coord.createNamespacedLease({ namespace: 'duet-system', body: lease('duet-system') }),
    (e) => {
      const s = statusOf(e);
      assert.equal(e.code, 409);
      assert.deepEqual(s.details, { name: 'duet-bridge', group: 'coordination.k8s.io', kind: 'leases' });
      assert.equal(s.reason, 'AlreadyExists');
      return true;
    });
  got.spec.holderIdentity = 'b';
  await coord.replaceNamespacedLease({ name: 'duet-bridge', namespace: 'duet-system', body: got });
  await assert.rejects(coord.replaceNamespacedLease({ name: 'duet-bridge', namespace: 'duet-system', body: got }),
    (e) => e.code === 409 && statusOf(e).reason === 'Conflict');
  const list = await coord.listLeaseForAllNamespaces();
  assert.deepEqual(list.items.map((l) => `${l.metadata.namespace}/${l.metadata.name}`).sort(),
    ['duet-system/duet-bridge', 'kube-system/duet-bridge']);

  await assert.rejects(coord.readNamespacedLease({ name: 'nope', namespace: 'duet-system' }), (e) => {
    assert.equal(e.code, 404);
    assert.deepEqual(statusOf(e), {
      kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure',
      message: 'leases.coordination.k8s.io "nope" not found', reason: 'NotFound',
      details: { name: 'nope', group: 'coordination.k8s.io', kind: 'leases' }, code: 404 });
    return true;
  });
  await assert.rejects(core.createNamespacedPod({ namespace: 'default',
    body: { metadata: {}, spec: { containers: [] } } }), (e) => {
    const s = statusOf(e);
    assert.equal(e.code, 422);
    assert.equal(s.reason, 'Invalid');
    assert.equal(s.details.kind, 'Pod');
    assert.equal(s.details.causes[0].field, 'metadata.name');
    return true;
  });
});

// ---- resource.k8s.io (DRA, issue 26) ----
const ALLOCATION = { devices: { results: [{ request: 'gpu', driver: 'gpu.nvidia.com', pool: 'gpu-node-1',
  device: 'gpu-0' }] } };
const CLAIM_SPEC = { devices: { requests: [{ name: 'gpu', exactly: { deviceClassName: 'gpu.nvidia.com' } }] } };

test('resource.k8s.io/v1 through ResourceV1Api: the GA kinds, a watch, the claim status subresource', async () => {
  const res = kc.makeApiClient(k8s.ResourceV1Api);
  await res.createDeviceClass({ body: { apiVersion: 'resource.k8s.io/v1', kind: 'DeviceClass',
    metadata: { name: 'gpu.nvidia.com' },
    spec: { selectors: [{ cel: { expression: "device.driver == 'gpu.nvidia.com'" } }] } } });
  const rv = (await res.listResourceSlice()).metadata.resourceVersion;
  const seen = [];
  let wake;
  const enough = new Promise((resolve) => { wake = resolve; });
  const ctl = await new k8s.Watch(kc).watch('/apis/resource.k8s.io/v1/resourceslices', { resourceVersion: rv },
    (type, obj) => {
      seen.push([type, obj.spec.devices.length]);
      if (seen.length === 2) wake();
    }, () => wake());
  await res.createResourceSlice({ body: { apiVersion: 'resource.k8s.io/v1', kind: 'ResourceSlice',
    metadata: { name: 'gpu-node-1-gpu' },
    spec: { driver: 'gpu.nvidia.com', nodeName: 'gpu-node-1',
      pool: { name: 'gpu-node-1', generation: 1, resourceSliceCount: 1 }, devices: [{ name: 'gpu-0' }] } } });
  await res.patchResourceSlice({ name: 'gpu-node-1-gpu',
    body: [{ op: 'add', path: '/spec/devices/-', value: { name: 'gpu-1' } }] });
  await enough;
  ctl.abort();
  assert.deepEqual(seen, [['ADDED', 1], ['MODIFIED', 2]]);
  assert.deepEqual((await res.listDeviceClass()).items.map((c) => c.metadata.name), ['gpu.nvidia.com']);

  await res.createNamespacedResourceClaimTemplate({ namespace: 'default', body: { apiVersion: 'resource.k8s.io/v1',
    kind: 'ResourceClaimTemplate', metadata: { name: 'one-gpu' }, spec: { spec: CLAIM_SPEC } } });
  const tpl = await res.readNamespacedResourceClaimTemplate({ name: 'one-gpu', namespace: 'default' });
  assert.equal(tpl.spec.spec.devices.requests[0].exactly.deviceClassName, 'gpu.nvidia.com');

  await res.createNamespacedResourceClaim({ namespace: 'default', body: { apiVersion: 'resource.k8s.io/v1',
    kind: 'ResourceClaim', metadata: { name: 'train-gpu' }, spec: CLAIM_SPEC } });
  const allocated = await res.patchNamespacedResourceClaimStatus({ name: 'train-gpu', namespace: 'default',
    body: [{ op: 'add', path: '/status', value: { allocation: ALLOCATION } }] });
  assert.equal(allocated.status.allocation.devices.results[0].device, 'gpu-0');
  const read = await res.readNamespacedResourceClaimStatus({ name: 'train-gpu', namespace: 'default' });
  assert.equal(read.status.allocation.devices.results[0].pool, 'gpu-node-1');
  // The claim's spec is immutable: a 422 naming the field, nothing changed.
  await assert.rejects(res.patchNamespacedResourceClaim({ name: 'train-gpu', namespace: 'default',
    body: [{ op: 'replace', path: '/spec/devices/requests/0/name', value: 'other' }] }), (e) => {
    const s = statusOf(e);
    assert.equal(e.code, 422);
    assert.equal(s.details.causes[0].field, 'spec');
    return true;
  });
  const claims = await res.listNamespacedResourceClaim({ namespace: 'default' });
  assert.deepEqual(claims.items.map((c) => c.spec.devices.requests[0].name), ['gpu']);
});

test('DeviceTaintRule at resource.k8s.io/v1 (--kube-version 1.37) through KubernetesObjectApi', async () => {
  const started = await startFake(['--kube-version', '1.37']);
  try {
    const kc37 = new k8s.KubeConfig();
    kc37.loadFromOptions({
      clusters: [{ name: 'fake', server: `https://127.0.0.1:${started.port}`, caFile: certs.ca }],
      users: [{ name: 'duet', token: TOKEN }],
      contexts: [{ name: 'fake', cluster: 'fake', user: 'duet' }],
      currentContext: 'fake',
    });
    const objs = k8s.KubernetesObjectApi.makeApiClient(kc37);
    const rule = { apiVersion: 'resource.k8s.io/v1', kind: 'DeviceTaintRule', metadata: { name: 'duet-gpu-0' },
      spec: { deviceSelector: { driver: 'gpu.nvidia.com', pool: 'gpu-node-1', device: 'gpu-0' },
        taint: { key: 'duet.dev/slurm', value: 'held', effect: 'NoSchedule' } } };
    const made = await objs.create(rule);
    assert.equal(made.spec.taint.effect, 'NoSchedule');
    assert.ok(made.spec.taint.timeAdded);
    const got = await objs.read({ apiVersion: 'resource.k8s.io/v1', kind: 'DeviceTaintRule',
      metadata: { name: 'duet-gpu-0' } });
    assert.equal(got.spec.deviceSelector.device, 'gpu-0');
    await assert.rejects(objs.create({ ...rule, metadata: { name: 'bad' },
      spec: { ...rule.spec, taint: { key: 'duet.dev/slurm', effect: 'PreferNoSchedule' } } }), (e) => {
      assert.equal(e.code, 422);
      assert.equal(statusOf(e).details.causes[0].field, 'spec.taint.effect');
      return true;
    });
  } finally {
    started.proc.kill();
  }
});
