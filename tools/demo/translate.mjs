// The translator of chapters/exporting.md in the reader's browser: the committed model's two ONNX
// graphs (encoder, one decoder step) run by onnxruntime-web on WebAssembly, single-threaded (GitHub
// Pages gives no cross-origin isolation, so no SharedArrayBuffer and no worker threads), the book's
// BPE tokenizer by @huggingface/tokenizers. Every file comes from this folder of the site; nothing
// is fetched before the reader asks for a translation.
const BOS_ID = 1, EOS_ID = 2, EXTRA_LEN = 50;  // transformer.multi30k's ids; the paper's limit
const here = new URL("./", import.meta.url).href;
let loaded = null;

// The files of the model, fetched together; the WebAssembly runtime is handed to onnxruntime-web as
// bytes (env.wasm.wasmBinary), so that every large file is counted by the progress bar.
const FILES = ["ort-wasm-simd-threaded.wasm", "encoder.onnx", "decoder_step.onnx", "tokenizer.json"];

function showProgress(received, total) {  // total: NaN when a size is unknown (no Content-Length)
  const progress = document.getElementById("demo-progress");
  const mb = (bytes) => (bytes / 1e6).toFixed(1);
  document.getElementById("demo-download").hidden = false;
  if (Number.isFinite(total) && total > 0) {
    progress.value = Math.min(received / total, 1);
    const percent = Math.floor(100 * Math.min(received / total, 1));
    document.getElementById("demo-received").textContent =
      `model: ${mb(received)} of ${mb(total)} MB downloaded (${percent} %)`;
  } else {
    progress.removeAttribute("value");  // an indeterminate bar
    document.getElementById("demo-received").textContent = `model: ${mb(received)} MB downloaded`;
  }
}

async function download(names) {  // the bytes of each file, reading the bodies as they arrive
  const responses = await Promise.all(names.map(async (name) => {
    const response = await fetch(here + name);
    if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
    return response;
  }));
  // A compressed response's Content-Length counts the compressed bytes, not those the body gives.
  const sizes = responses.map((r) => (r.headers.get("content-encoding")
    ? NaN : Number(r.headers.get("content-length") ?? NaN)));
  const total = sizes.reduce((sum, size) => sum + size, 0);
  let received = 0;
  showProgress(received, total);
  const files = await Promise.all(responses.map(async (response) => {
    const reader = response.body.getReader(), chunks = [];
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      chunks.push(chunk.value);
      received += chunk.value.length;
      showProgress(received, total);
    }
    return new Uint8Array(await new Blob(chunks).arrayBuffer());
  }));
  showProgress(received, received);  // all of it, whether or not the sizes were known
  return files;
}

async function load(status) {
  const ort = await import(here + "ort.wasm.min.mjs");
  const { Tokenizer } = await import(here + "tokenizers.min.mjs");
  const [wasm, encoderBytes, stepBytes, json] = await download(FILES);
  status.textContent = "starting the model…";
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = here;
  ort.env.wasm.wasmBinary = wasm;
  const options = { executionProviders: ["wasm"] };
  const encoder = await ort.InferenceSession.create(encoderBytes, options);
  const step = await ort.InferenceSession.create(stepBytes, options);
  const tokenizer = new Tokenizer(JSON.parse(new TextDecoder().decode(json)), {});
  return { ort, encoder, step, tokenizer };
}

function ids(ort, values) {  // int64 ids, (1, length)
  return new ort.Tensor("int64", BigInt64Array.from(values.map(BigInt)), [1, values.length]);
}

async function translate(text, status) {
  loaded = loaded || (await load(status));
  const { ort, encoder, step, tokenizer } = loaded;
  const source = tokenizer.encode(text, { add_special_tokens: false });
  if (source.ids.length === 0) return { english: "", source: [], target: [], rows: [] };
  const { memory } = await encoder.run({ src: ids(ort, source.ids) });
  const tokens = [BOS_ID], rows = [];
  for (let i = 0; i < source.ids.length + EXTRA_LEN; i++) {  // greedy, at most S + 50 tokens
    const out = await step.run({ tgt: ids(ort, tokens), memory });
    const logits = out.logits.data;
    let best = 0;
    for (let v = 1; v < logits.length; v++) if (logits[v] > logits[best]) best = v;
    if (best === EOS_ID) break;
    tokens.push(best);
    rows.push(Array.from(out.cross_attention.data));
  }
  const target = tokens.slice(1);
  return {
    english: tokenizer.decode(target, { skip_special_tokens: true }),
    source: source.tokens,
    target: target.map((id) => tokenizer.id_to_token ? tokenizer.id_to_token(id) : tokenizer.decode([id])),
    rows,
  };
}

function heatmap(table, result) {  // rows: English pieces, columns: German pieces
  table.replaceChildren();
  const head = table.insertRow();
  head.insertCell().textContent = "";
  for (const piece of result.source) head.insertCell().textContent = piece.replace(/^\u2581/, "");
  result.rows.forEach((row, t) => {
    const tr = table.insertRow();
    tr.insertCell().textContent = result.target[t].replace(/^\u2581/, "");
    for (const weight of row) {
      const cell = tr.insertCell();
      cell.className = "demo-weight";
      cell.title = weight.toFixed(2);
      cell.style.background = `rgba(31, 119, 180, ${weight.toFixed(3)})`;
    }
  });
}

const button = document.getElementById("demo-translate");
button.addEventListener("click", async () => {
  const status = document.getElementById("demo-status");
  const target = document.getElementById("demo-target");
  button.disabled = true;
  target.textContent = "";
  target.removeAttribute("data-done");
  status.textContent = loaded ? "translating…" : "downloading the model…";
  const start = performance.now();
  try {
    const result = await translate(document.getElementById("demo-source").value, status);
    heatmap(document.getElementById("demo-heatmap"), result);
    target.textContent = result.english;
    target.setAttribute("data-done", "true");
    status.textContent = `done in ${((performance.now() - start) / 1000).toFixed(1)} s`;
  } catch (err) {
    status.textContent = `failed: ${err}`;
    throw err;
  } finally {
    button.disabled = false;
  }
});
