// Runs saved reference cases in the real transformers.js (node), on the sessions it loads for a folder, for every
// dtype asked: one node process per job, transformers.js imported and the config read once.
// Usage: node transformers_js.mjs NODE_MODULES JOB.json. JOB: {"root", "model" (folder name under root),
//   "variants": [{"variant", "dtype", "cases": [{"inputs": [{name, type, dims, file}], "outputs": [names]}], "timed": n,
//   "out": folder for its outputs}]}.
// Prints JSON: {"unsupported": msg} | {"error": msg} | {"ms": {"import", "config"}, "variants": [{"error": msg, "ms"} |
//   {"sessions": {...}, "cases": [{"outputs": [...]} | {"error"}], "seconds": [...], "ms": {"load", "cases", "timed"}}]},
// the variants in the job's order. Each output is written raw (little-endian) to OUT/case-N-M.bin.
// With "park": true, each checked model stays loaded; node prints READY and a newline, waits for a line on stdin,
// then makes the timed calls and prints the JSON.
// node transformers_js.mjs NODE_MODULES --known: prints the model types it has an architecture for, as a JSON list.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const [modules, jobPath] = process.argv.slice(2);
const job = jobPath === "--known" ? { root: "." } : JSON.parse(readFileSync(jobPath, "utf8"));
let clock = performance.now();
const lap = () => {
  const now = performance.now();
  const ms = now - clock;
  clock = now;
  return Math.round(ms * 10) / 10;
};
const tf = await import(pathToFileURL(join(modules, "@huggingface/transformers/dist/transformers.node.mjs")).href);
const { env, AutoConfig, AutoModel, Tensor } = tf;
env.allowRemoteModels = false; // local folders only: a missing file must fail, not be fetched
env.localModelPath = job.root;
env.useFSCache = false;
const imported = lap();

const ARRAYS = {
  float32: Float32Array, float16: Uint16Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
  int8: Int8Array, uint8: Uint8Array, bool: Uint8Array,
};
// One inference thread per session, as the other targets' (ONNX Runtime's default pool spin-waits on every core).
const SESSION_OPTIONS = { intraOpNumThreads: 1, interOpNumThreads: 1 };

function tensor(spec) {
  const buf = readFileSync(spec.file);
  const Arr = ARRAYS[spec.type];
  const data = new Arr(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
  return new Tensor(spec.type, data, spec.dims).ort_tensor;
}

function known(modelType) {
  return AutoModel.MODEL_CLASS_MAPPINGS.some(
    (m) => m.has(modelType) || [...m.values()].some((cls) => cls[0] === modelType),
  );
}

function knownTypes() {
  const types = new Set();
  for (const m of AutoModel.MODEL_CLASS_MAPPINGS) for (const [key, cls] of m) types.add(key).add(cls[0]);
  return [...types].sort();
}

async function variant(v) {
  lap();
  let model;
  try {
    model = await AutoModel.from_pretrained(job.model, { dtype: v.dtype, device: "cpu", session_options: SESSION_OPTIONS });
  } catch (e) {
    return { error: `transformers.js could not load the ${v.dtype} model: ${e.message ?? e}`, ms: { load: lap() } };
  }
  const ms = { load: lap() };
  const sessions = Object.entries(model.sessions);
  const loaded = Object.fromEntries(sessions.map(([k, s]) => [k, { inputs: s.inputNames, outputs: s.outputNames }]));
  const pick = (c) =>
    sessions.find(([, s]) => s.inputNames.every((n) => c.feed.includes(n)) && c.outputs.every((n) => s.outputNames.includes(n)));
  const run = async (c) => {
    const found = pick(c);
    if (!found) throw new Error(`no session transformers.js loaded takes these inputs and gives ${c.outputs.join(", ")}`);
    const [, session] = found;
    const feeds = Object.fromEntries(c.inputs.filter((i) => session.inputNames.includes(i.name)).map((i) => [i.name, tensor(i)]));
    return await session.run(feeds);
  };
  const cases = [];
  for (const [n, c] of v.cases.entries()) {
    c.feed = c.inputs.map((i) => i.name);
    try {
      const result = await run(c);
      const outputs = c.outputs.filter((name) => name in result).map((name, m) => {
        const t = result[name];
        const file = join(v.out, `case-${n}-${m}.bin`);
        writeFileSync(file, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
        return { name, type: t.type, dims: Array.from(t.dims, Number), file };
      });
      cases.push({ outputs });
    } catch (e) {
      cases.push({ error: String(e && e.message ? e.message : e) });
    }
  }
  ms.cases = lap();
  const answer = { sessions: loaded, cases, seconds: [], ms };
  const time = async () => {
    lap();
    if (v.cases.length && !cases[0].error) {
      for (let i = 0; i < v.timed; i++) {
        const t0 = performance.now();
        await run(v.cases[0]);
        answer.seconds.push((performance.now() - t0) / 1000);
      }
    }
    ms.timed = lap();
    await model.dispose();
  };
  if (job.park) parked.push(time); // timed once the node is the job's alone (main)
  else await time();
  return answer;
}

const parked = [];

// A parked job says READY once every model is checked and loaded, then waits for one line on stdin before timing
// them; stdin closed without one (the job is gone) ends the process.
async function go() {
  process.stdout.write("READY\n");
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const line = await lines.next();
  if (line.done) process.exit(0);
  process.stdin.destroy();
}

async function main() {
  let config;
  try {
    config = await AutoConfig.from_pretrained(job.model);
  } catch (e) {
    return { unsupported: `transformers.js cannot read the folder's config.json: ${e.message ?? e}` };
  }
  if (!known(config.model_type)) {
    return { unsupported: `transformers.js ${tf.env.version} has no architecture for model type "${config.model_type}"` };
  }
  const ms = { import: imported, config: lap() };
  const variants = [];
  for (const v of job.variants) variants.push(await variant(v));
  if (parked.length) {
    await go();
    for (const time of parked) await time();
  }
  return { ms, variants };
}

process.stdout.write(JSON.stringify(jobPath === "--known" ? knownTypes() : await main()));
