// Runs converted models in the real transformers.js (node) and prints what they computed, as JSON.
// Usage: node run.mjs JOB.json — JOB: {"root": folder of model folders, "cases": [...]}, each case
//   {"kind": "logits" | "hidden", "model": folder name, "dtype": "q8", "texts": [...]}: token ids and the
//       model's first output (logits of a masked LM, last_hidden_state of an encoder), one row per text;
//   {"kind": "generate", "model": ..., "dtype": ..., "prompt": "...", "max_new_tokens": n}: greedy token ids.
// A case that fails reports its error instead of stopping the others.
import { readFileSync } from "node:fs";
import { env, AutoTokenizer, AutoModel, AutoModelForMaskedLM, AutoModelForCausalLM } from "@huggingface/transformers";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
env.allowRemoteModels = false; // local folders only: a missing file must fail, not be fetched
env.localModelPath = job.root;
env.useFSCache = false;

const MODELS = { logits: AutoModelForMaskedLM, hidden: AutoModel, generate: AutoModelForCausalLM };

async function run(c) {
  const tokenizer = await AutoTokenizer.from_pretrained(c.model);
  const model = await MODELS[c.kind].from_pretrained(c.model, { dtype: c.dtype, device: "cpu" });
  try {
    if (c.kind === "generate") {
      const inputs = tokenizer(c.prompt);
      const out = await model.generate({ ...inputs, max_new_tokens: c.max_new_tokens, do_sample: false });
      return { ids: Array.from(out.tolist()[0], Number) };
    }
    const rows = [];
    for (const text of c.texts) {
      const inputs = tokenizer(text);
      const out = await model(inputs);
      const tensor = out.logits ?? out.last_hidden_state;
      rows.push({ ids: Array.from(inputs.input_ids.data, Number), dims: tensor.dims, values: Array.from(tensor.data) });
    }
    return { rows };
  } finally {
    await model.dispose();
  }
}

const results = [];
for (const c of job.cases) {
  try {
    results.push({ ...c, ...(await run(c)) });
  } catch (e) {
    results.push({ ...c, error: String(e && e.message ? e.message : e) });
  }
}
process.stdout.write(JSON.stringify(results));
