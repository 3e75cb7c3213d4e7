// Evaluates CEL expressions (the chart's ValidatingAdmissionPolicy
// validations and webhook matchConditions) against given variables, with the
// npm package @marcbachmann/cel-js: standard CEL (has, exists, in), untyped,
// without Kubernetes' CEL libraries and without the API server's type check
// against the OpenAPI schema. NODE_PATH points at the installed packages.
//
// stdin: a JSON array of {expression, vars}. stdout: a JSON array with one
// entry per case: the result, or {"error": message}.
import {createRequire} from "node:module";
import {readFileSync} from "node:fs";
import {pathToFileURL} from "node:url";
import path from "node:path";

// ESM ignores NODE_PATH: resolve the package from it by hand.
const require = createRequire(path.join(process.env.NODE_PATH || ".", "noop.js"));
const {evaluate} = await import(pathToFileURL(require.resolve("@marcbachmann/cel-js")).href);

const cases = JSON.parse(readFileSync(0, "utf8"));
const results = cases.map(({expression, vars}) => {
  try {
    return evaluate(expression, vars);
  } catch (e) {
    return {error: String(e.message || e)};
  }
});
process.stdout.write(JSON.stringify(results));
