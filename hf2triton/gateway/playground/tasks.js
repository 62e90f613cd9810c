// hf2triton playground: the views of the tasks that answer one JSON per text (app.js has the page, the key and chat):
// classify (text-classification), entities (token-classification), fill mask, rerank (text-ranking), images
// (image-classification, zero-shot-image-classification). Every text from a model or the user is written
// with textContent (app.js's el), never as HTML; entity spans are cut from the text at the model's character offsets.
"use strict";

// Python's character offsets count code points; JavaScript's string indexes count UTF-16 units: cut by code point
function codePoints(text) {
  return Array.from(text);
}

// one colour per entity group (a PER in one answer is the same colour as in the next)
function groupColour(group) {
  let hash = 0;
  for (const char of group) hash = (hash * 31 + char.codePointAt(0)) % 360;
  return `hsl(${hash}, 70%, 82%)`;
}

function entityGroup(entity) {  // aggregation "none" labels tokens B-PER / I-PER: one group PER
  return (entity.entity_group || entity.entity || "?").replace(/^[BIES]-/, "");
}

function scoreBar(score) {
  const fill = el("span", { className: "bar-fill" });
  fill.style.width = `${Math.max(0, Math.min(1, score)) * 100}%`;
  return el("span", { className: "bar", title: score.toFixed(6) }, fill);
}

async function predict(model, body) {
  const answer = await (await api(`/v1/models/${encodeURIComponent(model)}:predict`, body)).json();
  return answer.predictions;
}

async function showing(button, work) {  // one request at a time per view, its error on the page
  showError(null);
  button.disabled = true;
  try {
    await work();
  } catch (err) {
    showError(err);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- classify

$("classify-send").addEventListener("click", () => showing($("classify-send"), async () => {
  const texts = $("classify-input").value.split("\n").map((t) => t.trim()).filter(Boolean);
  if (!texts.length) return;
  const labels = await predict($("classify-model").value, { instances: texts });
  $("classify-results").replaceChildren(...labels.map((answer, i) => el("li", { "data-label": answer.label, "data-score": String(answer.score) },
    el("span", { className: "token", text: answer.label }), scoreBar(answer.score), el("span", { className: "score", text: answer.score.toFixed(4) }),
    el("span", { className: "sequence", text: texts[i] }))));
}));

// ---------------------------------------------------------------- entities

function highlight(text, entities) {
  const chars = codePoints(text);
  const parts = [];
  let at = 0;
  for (const entity of [...entities].sort((a, b) => a.start - b.start)) {
    if (entity.start < at) continue;  // overlapping spans: the first one shown
    parts.push(chars.slice(at, entity.start).join(""));
    const group = entityGroup(entity);
    const span = el("mark", {
      className: "entity", text: chars.slice(entity.start, entity.end).join(""), "data-group": group,
      "data-start": String(entity.start), "data-end": String(entity.end),
      title: `${entity.entity_group || entity.entity} · score ${entity.score.toFixed(4)} · [${entity.start}:${entity.end}]`,
    });
    span.style.backgroundColor = groupColour(group);
    parts.push(span);
    at = entity.end;
  }
  parts.push(chars.slice(at).join(""));
  return parts;
}

function legend(entities) {
  const counts = new Map();
  for (const entity of entities) counts.set(entityGroup(entity), (counts.get(entityGroup(entity)) || 0) + 1);
  return [...counts].sort().map(([group, count]) => {
    const swatch = el("span", { className: "swatch" });
    swatch.style.backgroundColor = groupColour(group);
    return el("li", { "data-group": group }, swatch, `${group} (${count})`);
  });
}

$("entities-send").addEventListener("click", () => showing($("entities-send"), async () => {
  const text = $("entities-input").value;
  if (!text.trim()) return;
  const [entities] = await predict($("entities-model").value, { instances: [text], aggregation_strategy: $("entities-strategy").value });
  $("entities-text").replaceChildren(...highlight(text, entities));
  $("entities-legend").replaceChildren(...legend(entities));
  $("entities-note").textContent = `${entities.length} entities; hover one for its label, score and character span`;
}));

// ---------------------------------------------------------------- fill mask

$("fill-send").addEventListener("click", () => showing($("fill-send"), async () => {
  const text = $("fill-input").value.trim();
  if (!text) return;
  const [candidates] = await predict($("fill-model").value, { instances: [text], top_k: numberOf($("fill-top-k")) });
  $("fill-candidates").replaceChildren(...candidates.map((c) => el("li", { "data-score": String(c.score) },
    el("span", { className: "token", text: c.token_str }), scoreBar(c.score), el("span", { className: "score", text: c.score.toFixed(4) }),
    el("span", { className: "sequence", text: c.sequence }))));
}));

// ---------------------------------------------------------------- rerank

$("rerank-send").addEventListener("click", () => showing($("rerank-send"), async () => {
  const query = $("rerank-query").value.trim();
  const documents = $("rerank-documents").value.split("\n").map((d) => d.trim()).filter(Boolean);
  if (!query || !documents.length) return;
  const answer = await (await api("/v1/rerank", { model: $("rerank-model").value, query, documents })).json();
  $("rerank-results").replaceChildren(...answer.results.map((r) => el("li", { "data-index": String(r.index), "data-score": String(r.relevance_score) },
    el("span", { className: "score", text: r.relevance_score.toFixed(4) }), scoreBar(r.relevance_score),
    el("span", { className: "document", text: r.document.text }), el("span", { className: "stats", text: ` (document ${r.index + 1})` }))));
  $("rerank-note").textContent = `${answer.results.length} documents, best first; ${answer.usage.total_tokens} tokens`;
}));

// ---------------------------------------------------------------- images

let pickedImage = null;  // the File the user dropped or picked

function pickImage(file) {
  if (!file) return;
  pickedImage = file;
  const preview = $("images-preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(file);  // the user's own file, shown beside its labels (img-src blob:)
  preview.hidden = false;
  $("images-note").textContent = `${file.name}, ${file.size} bytes`;
}

function base64Of(file) {  // the file's bytes as base64 (KServe's {"image_bytes": {"b64": ...}})
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] || "");
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

$("images-file").addEventListener("change", (event) => pickImage(event.target.files[0]));
const imageDrop = $("images-drop");
imageDrop.addEventListener("dragover", (event) => { event.preventDefault(); imageDrop.classList.add("over"); });
imageDrop.addEventListener("dragleave", () => imageDrop.classList.remove("over"));
imageDrop.addEventListener("drop", (event) => {
  event.preventDefault();
  imageDrop.classList.remove("over");
  pickImage(event.dataTransfer.files[0]);
});

$("images-send").addEventListener("click", () => showing($("images-send"), async () => {
  if (!pickedImage) throw new Error("pick or drop an image first");
  const model = $("images-model").value;
  const task = (state.models.find((m) => m.id === model) || {}).task;
  const parameters = task === "zero-shot-image-classification"
    ? { candidate_labels: $("images-labels").value.split(",").map((l) => l.trim()).filter(Boolean) }
    : { top_k: numberOf($("images-top-k")) };
  const [labels] = await predict(model, { instances: [{ image_bytes: { b64: await base64Of(pickedImage) } }], parameters });
  $("images-labels-out").replaceChildren(...labels.map((l) => el("li", { "data-score": String(l.score) },
    el("span", { className: "token", text: l.label }), scoreBar(l.score), el("span", { className: "score", text: l.score.toFixed(4) }))));
  $("images-note").textContent = `${pickedImage.name}: ${labels.length} labels, best first`;
}));
