// nmt-export format=onnx's page: transformers.js from runtime/, the model beside the page, no
// remote models, ONNX Runtime's WebAssembly from runtime/ on one thread. Each line of the text
// box is translated alone (greedy, as nmt-translate split=none), with nmt-translate's length
// limit: source tokens + 50.
import { env, pipeline } from "./runtime/transformers.min.js";

const here = new URL(".", location.href).href.replace(/\/$/, "");
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.useBrowserCache = false;
env.useWasmCache = false;
env.backends.onnx.wasm.numThreads = 1;
env.backends.onnx.wasm.proxy = false;
env.backends.onnx.wasm.wasmPaths = {
  mjs: `${here}/runtime/ort-wasm-simd-threaded.asyncify.mjs`,
  wasm: `${here}/runtime/ort-wasm-simd-threaded.asyncify.wasm`,
};

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
if (params.get("dtype")) $("dtype").value = params.get("dtype");
let translator = null;

async function load() {
  $("go").disabled = true;
  $("status").textContent = "Loading the model\u2026";
  const started = performance.now();
  // "." is no model id and no URL: transformers.js fetches "./config.json" and so on, beside
  // the page, as local files
  translator = await pipeline("translation", ".", { dtype: $("dtype").value, device: "wasm" });
  window.nmtLoadSeconds = (performance.now() - started) / 1000;
  window.nmtTranslator = translator;  // for tests and the console
  $("status").textContent = `Ready (${$("dtype").value}, loaded in ${window.nmtLoadSeconds.toFixed(2)} s).`;
  $("go").disabled = false;
}

// The translation of each line (empty lines stay empty), one at a time.
async function translateLines(lines) {
  const out = [];
  for (const line of lines) {
    if (!line.trim()) { out.push(""); continue; }
    const n = translator.tokenizer.encode(line).length - 1;  // without </s>
    const [result] = await translator(line, { max_new_tokens: n + 50 });
    out.push(result.translation_text);
  }
  return out;
}
window.nmtTranslateLines = async (lines) => translateLines(lines);

$("go").addEventListener("click", async () => {
  $("error").hidden = true;
  try {
    const started = performance.now();
    const lines = $("source").value.split("\n");
    $("translation").textContent = (await translateLines(lines)).join("\n");
    $("status").textContent = `${lines.length} lines in ${((performance.now() - started) / 1000).toFixed(2)} s.`;
  } catch (e) {
    $("error").textContent = String(e);
    $("error").hidden = false;
  }
});
$("dtype").addEventListener("change", () => load().catch(showError));

function showError(e) {
  $("error").textContent = String(e);
  $("error").hidden = false;
  $("status").textContent = "Not loaded.";
}
window.nmtReady = load().then(() => true, (e) => { showError(e); return false; });
