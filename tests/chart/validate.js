// Validates rendered chart manifests: each document against its Kubernetes (or CRD) schema
// with kubernetes-models, then the chart's own rules. Writes each ConfigMap's moongate.conf
// to OUTDIR so the daemon itself can check it.
//
//   node validate.js RENDERED.yaml OUTDIR      (NODE_PATH: where the npm packages are)
"use strict";
const fs = require("fs");
const path = require("path");
const YAML = require("yaml");

const [file, outdir] = process.argv.slice(2);
const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))
  .map((d) => d.toJS())
  .filter((d) => d && typeof d === "object");
const problems = [];
const fail = (doc, msg) => problems.push(`${doc.kind}/${doc.metadata && doc.metadata.name}: ${msg}`);

function model(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const mod =
    group === "monitoring.coreos.com" ? `@kubernetes-models/prometheus-operator/${apiVersion}`
    : group === "cert-manager.io" ? `@kubernetes-models/cert-manager/${apiVersion}`
    : group === "" ? `kubernetes-models/${version}`
    : `kubernetes-models/${apiVersion}`;
  const Kind = require(mod)[kind];
  if (!Kind) throw new Error(`no schema for ${apiVersion} ${kind}`);
  return Kind;
}

let configs = 0;
for (const doc of docs) {
  try {
    const Kind = model(doc.apiVersion, doc.kind);
    new Kind(doc).validate();
  } catch (e) {
    fail(doc, `schema: ${e.message.split("\n").slice(0, 4).join(" ")}`);
    continue;
  }
  if (doc.metadata.namespace) fail(doc, "sets metadata.namespace (leave it to --namespace)");
  if (doc.kind === "ConfigMap" && doc.data && doc.data["moongate.conf"]) {
    fs.writeFileSync(path.join(outdir, `${doc.metadata.name}.conf`), doc.data["moongate.conf"]);
    configs++;
  }
  if (doc.kind !== "DaemonSet" && doc.kind !== "Deployment") continue;
  const spec = doc.spec;
  const pod = spec.template.spec;
  const labels = spec.template.metadata.labels || {};
  for (const [k, v] of Object.entries(spec.selector.matchLabels))
    if (labels[k] !== v) fail(doc, `selector label ${k}=${v} missing from the pod template`);
  const strategy = doc.kind === "DaemonSet" ? spec.updateStrategy : spec.strategy;
  const nodeDirs = (pod.volumes || []).filter((v) => v.hostPath && ["shm", "socket"].includes(v.name));
  if (nodeDirs.length && String(strategy.rollingUpdate.maxSurge) !== "0")
    fail(doc, `${nodeDirs.map((v) => v.name).join(" and ")} on a hostPath with maxSurge != 0: ` +
      "two daemons of one node would share its directory");
  if (pod.hostNetwork) {
    if (String(strategy.rollingUpdate.maxSurge) !== "0")
      fail(doc, "hostNetwork with maxSurge != 0: a second daemon cannot bind the node's ports");
    if (pod.dnsPolicy !== "ClusterFirstWithHostNet")
      fail(doc, "hostNetwork without dnsPolicy ClusterFirstWithHostNet");
  }
  const conf = docs.find((d) => d.kind === "ConfigMap")?.data?.["moongate.conf"] || "";
  const grace = Number((conf.match(/^grace = (\d+)/m) || [0, 30])[1]);
  for (const c of pod.containers) {
    if (!/[:@]/.test(c.image.split("/").pop()) || /:latest$/.test(c.image))
      fail(doc, `image ${c.image} is not pinned to a tag or digest`);
    const ports = new Set((c.ports || []).map((p) => p.name));
    for (const pr of ["startupProbe", "livenessProbe", "readinessProbe"]) {
      const port = c[pr] && c[pr].httpGet && c[pr].httpGet.port;
      if (port !== undefined && typeof port === "string" && !ports.has(port))
        fail(doc, `${pr} uses port ${port}, which the container does not declare`);
    }
    const req = (c.resources && c.resources.requests) || {};
    const lim = (c.resources && c.resources.limits) || {};
    for (const k of Object.keys({ ...req, ...lim }))
      if ((k.startsWith("rdma/") || k.includes("hugepages") || k.startsWith("nvidia.com/")) &&
          String(req[k]) !== String(lim[k]))
        fail(doc, `${k}: extended resources need requests equal to limits`);
    const rdma = /^ibverbs-lib = \S+/m.test(conf);
    const caps = (c.securityContext && c.securityContext.capabilities &&
                  c.securityContext.capabilities.add) || [];
    if (rdma && !caps.includes("IPC_LOCK") && !c.securityContext.privileged)
      fail(doc, "RDMA on without IPC_LOCK: memory cannot be pinned");
    if (rdma && caps.includes("IPC_LOCK") && c.securityContext.runAsUser !== 0)
      fail(doc, "IPC_LOCK takes effect for root only (no ambient capabilities)");
    for (const m of c.volumeMounts || []) {
      const v = (pod.volumes || []).find((x) => x.name === m.name);
      if (!v) fail(doc, `volume mount ${m.name} has no volume`);
      else if (v.secret && m.subPath) fail(doc, `secret ${m.name} mounted with subPath: renewals never arrive`);
    }
    const stop = c.lifecycle && c.lifecycle.preStop && c.lifecycle.preStop.sleep
      ? c.lifecycle.preStop.sleep.seconds : 0;
    if ((pod.terminationGracePeriodSeconds || 30) < stop + grace)
      fail(doc, `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} < preStop ${stop} + grace ${grace}`);
  }
}
if (configs !== 1) problems.push(`expected one moongate.conf, found ${configs}`);
if (problems.length) {
  console.error(problems.map((p) => `  ${file}: ${p}`).join("\n"));
  process.exit(1);
}
console.log(`  ${path.basename(file)}: ${docs.length} documents valid`);
