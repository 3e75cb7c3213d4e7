// Validates Kubernetes objects against the OpenAPI schemas that the npm
// packages kubernetes-models and @kubernetes-models/prometheus-operator carry
// (offline; installed by scripts/helm.sh, NODE_PATH points at them).
//
// stdin: a JSON array of objects. stdout: a JSON array with one entry per
// object, "" when it is valid, else the validator's message. Exit status 2
// when an object's apiVersion/kind has no model here (so nothing is skipped
// silently); 0 otherwise, whether or not objects were valid.
"use strict";

function modelFor(apiVersion, kind) {
  const group = apiVersion;  // "v1" is the core group: kubernetes-models/v1
  const modules = group.startsWith("monitoring.coreos.com/")
    ? [`@kubernetes-models/prometheus-operator/${group}`]
    : [`kubernetes-models/${group}`];
  for (const m of modules) {
    try {
      const exported = require(m);
      if (exported[kind]) return exported[kind];
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND" && e.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw e;
    }
  }
  return null;
}

const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const results = [];
let unknown = false;
for (const obj of input) {
  const Model = modelFor(obj.apiVersion, obj.kind);
  if (!Model) {
    results.push(`no model for ${obj.apiVersion} ${obj.kind}`);
    unknown = true;
    continue;
  }
  try {
    new Model(obj).validate();
    results.push("");
  } catch (e) {
    results.push(String(e.message || e));
  }
}
process.stdout.write(JSON.stringify(results));
process.exit(unknown ? 2 : 0);
