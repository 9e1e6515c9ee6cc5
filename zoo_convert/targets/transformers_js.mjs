// Runs saved reference cases in the real transformers.js (node), on the sessions it loads for a folder and dtype.
// Usage: node transformers_js.mjs NODE_MODULES JOB.json. JOB: {"root", "model" (folder name under root), "dtype",
//   "cases": [{"inputs": [{name, type, dims, file}], "outputs": [names]}], "timed": n, "out": folder for outputs}.
// Prints JSON: {"unsupported": msg} | {"error": msg} | {"sessions": {...}, "cases": [{"outputs": [...]} | {"error"}],
//   "seconds": [...]}. Each output is written raw (little-endian) to OUT/case-N-M.bin.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, jobPath] = process.argv.slice(2);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const tf = await import(pathToFileURL(join(modules, "@huggingface/transformers/dist/transformers.node.mjs")).href);
const { env, AutoConfig, AutoModel, Tensor } = tf;
env.allowRemoteModels = false; // local folders only: a missing file must fail, not be fetched
env.localModelPath = job.root;
env.useFSCache = false;

const ARRAYS = {
  float32: Float32Array, float16: Uint16Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
  int8: Int8Array, uint8: Uint8Array, bool: Uint8Array,
};

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
  let model;
  try {
    model = await AutoModel.from_pretrained(job.model, { dtype: job.dtype, device: "cpu" });
  } catch (e) {
    return { error: `transformers.js could not load the ${job.dtype} model: ${e.message ?? e}` };
  }
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
  for (const [n, c] of job.cases.entries()) {
    c.feed = c.inputs.map((i) => i.name);
    try {
      const result = await run(c);
      const outputs = c.outputs.filter((name) => name in result).map((name, m) => {
        const t = result[name];
        const file = join(job.out, `case-${n}-${m}.bin`);
        writeFileSync(file, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
        return { name, type: t.type, dims: Array.from(t.dims, Number), file };
      });
      cases.push({ outputs });
    } catch (e) {
      cases.push({ error: String(e && e.message ? e.message : e) });
    }
  }
  const seconds = [];
  if (job.cases.length && !cases[0].error) {
    for (let i = 0; i < job.timed; i++) {
      const t0 = performance.now();
      await run(job.cases[0]);
      seconds.push((performance.now() - t0) / 1000);
    }
  }
  await model.dispose();
  return { sessions: loaded, cases, seconds };
}

process.stdout.write(JSON.stringify(await main()));
