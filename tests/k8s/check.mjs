// Checks the Kubernetes manifests of deploy/k8s against the Kubernetes API's schemas (the
// kubernetes-models package, offline): every document parses as YAML, names a kind the API has,
// and validates (types, formats, enums, required fields; like the API server's default, fields the
// schema does not name are not refused); kustomization.yaml lists exactly the other manifests.
// Then, so that the check itself is known to catch something, it breaks a copy of each document
// in two ways (a name of the wrong type, labels that are not a map) and expects both refused.
//
//   node tests/k8s/check.mjs [DIR]      (DIR: deploy/k8s)
// Exit status 0 when every check passes; 1 with the reasons otherwise.
import { readFileSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = fileURLToPath(new URL(".", import.meta.url));
const dir = resolve(process.argv[2] ?? join(here, "../../deploy/k8s"));
const failures = [];

// The model class of an apiVersion and kind, e.g. apps/v1 StatefulSet.
async function modelOf(apiVersion, kind) {
  const path = apiVersion.includes("/") ? apiVersion : `${apiVersion}`;
  let mod;
  try {
    mod = await import(`kubernetes-models/${path}`);
  } catch {
    return null;
  }
  return mod[kind] ?? null;
}

function refused(Model, doc) {
  try {
    new Model(doc).validate();
    return false;
  } catch {
    return true;
  }
}

const files = readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort();
let checked = 0;
let broken = 0;
let kustomization = null;
for (const file of files) {
  const text = readFileSync(join(dir, file), "utf8");
  const docs = parseAllDocuments(text);
  for (const [i, d] of docs.entries()) {
    const where = `${file}, document ${i + 1}`;
    if (d.errors.length > 0) {
      failures.push(`${where}: not YAML: ${d.errors[0].message}`);
      continue;
    }
    const doc = d.toJS();
    if (doc == null) continue;
    if (doc.kind === "Kustomization") {
      kustomization = { file, doc };
      continue;
    }
    const Model = await modelOf(doc.apiVersion ?? "", doc.kind ?? "");
    if (Model == null) {
      failures.push(`${where}: no kind ${doc.kind} in ${doc.apiVersion} of the Kubernetes API`);
      continue;
    }
    try {
      new Model(doc).validate();
    } catch (e) {
      failures.push(`${where} (${doc.kind} ${doc.metadata?.name}): ${e.message}`);
      continue;
    }
    checked++;
    // The check must refuse a broken copy: a name of the wrong type, and labels that are not a map.
    const wrongType = structuredClone(doc);
    wrongType.metadata.name = 42;
    const notAMap = structuredClone(doc);
    notAMap.metadata.labels = "app=vericache";
    for (const [what, copy] of [["a name that is a number", wrongType], ["labels that are a string", notAMap]]) {
      if (refused(Model, copy)) broken++;
      else failures.push(`${where}: the schema check let through ${what}`);
    }
  }
}
if (kustomization == null) {
  failures.push("no kustomization.yaml");
} else {
  const listed = [...(kustomization.doc.resources ?? [])].sort();
  const others = files.filter((f) => f !== kustomization.file);
  if (JSON.stringify(listed) !== JSON.stringify(others)) {
    failures.push(`${kustomization.file} lists ${listed.join(", ")}; the directory has ${others.join(", ")}`);
  }
}
console.log(`${checked} manifests in ${files.length} files valid against the Kubernetes API schemas; ` +
            `${broken} broken copies refused`);
for (const f of failures) console.log(`FAIL ${f}`);
process.exit(failures.length === 0 && checked > 0 ? 0 : 1);
