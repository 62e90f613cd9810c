// hf2triton playground: chat, compare, embeddings and status on the gateway's own /v1 API (tasks.js: the other tasks).
// Everything the page shows from a model or the server goes through textContent, never HTML.
// The API key (when the gateway has one) lives in this tab's sessionStorage only: never in a URL, never logged.
"use strict";

const KEY_ITEM = "hf2triton-api-key";
const state = { key: sessionStorage.getItem(KEY_ITEM) || "", models: [], history: [], running: [] };
const $ = (id) => document.getElementById(id);

class ApiFailure extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "text") node.textContent = value;
    else if (name === "className") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function headers(json = true) {
  const sent = json ? { "Content-Type": "application/json" } : {};
  if (state.key) sent.Authorization = `Bearer ${state.key}`;
  return sent;
}

// A GET without a body; a POST of JSON, or of a FormData (the audio endpoints' multipart form: the browser sets its
// Content-Type with the boundary).
async function api(path, body, signal) {
  const form = body instanceof FormData;
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: headers(!form),
    body: body === undefined || form ? body : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error.message;
    } catch (_) { /* not the API's error object */ }
    throw new ApiFailure(response.status, message);
  }
  return response;
}

function showError(err) {
  $("error").textContent = err ? (err.message || String(err)) : "";
}

// ---------------------------------------------------------------- key and start

async function start() {
  try {
    const listed = await (await api("/v1/models")).json();
    state.models = listed.data;
  } catch (err) {
    if (err.status === 401) return askForKey(state.key ? err.message : "");
    showError(err);
    return;
  }
  $("login").hidden = true;
  $("tabs").hidden = false;
  $("logout").hidden = !state.key;  // nothing to forget on a gateway without a key
  fillModelLists();
  show("chat");
}

function askForKey(message) {
  sessionStorage.removeItem(KEY_ITEM);
  state.key = "";
  $("tabs").hidden = true;
  for (const view of document.querySelectorAll(".view")) view.hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("key").focus();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("key").value.trim();
  $("key").value = "";
  sessionStorage.setItem(KEY_ITEM, state.key);
  start();
});

$("logout").addEventListener("click", () => askForKey(""));

function show(view) {
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== view;
  for (const tab of document.querySelectorAll("#tabs button[data-view]")) tab.classList.toggle("active", tab.dataset.view === view);
  showError(null);
  if (view === "status") refreshStatus();
}

for (const tab of document.querySelectorAll("#tabs button[data-view]")) tab.addEventListener("click", () => show(tab.dataset.view));

// a select lists the models of its data-tasks; a tab with data-tasks shows only while such a model is served
function fillModelLists() {
  const ofTasks = (node) => state.models.filter((m) => node.dataset.tasks.split(" ").includes(m.task)).map((m) => m.id);
  for (const select of document.querySelectorAll("select[data-tasks]")) {
    const names = ofTasks(select);
    select.replaceChildren(...names.map((name) => el("option", { value: name, text: name })));
    if (!names.length) select.append(el("option", { value: "", text: "(none served)" }));
  }
  for (const tab of document.querySelectorAll("#tabs button[data-tasks]")) tab.hidden = !ofTasks(tab).length;
  limitMaxTokens($("chat-model"), $("chat-max-tokens"));
  for (const column of document.querySelectorAll("#compare .column")) limitMaxTokens(column.querySelector(".side-model"), column.querySelector(".side-max-tokens"));
}

// max_tokens fields offer the selected model's own range (its card's max_tokens), not a guess
function limitMaxTokens(select, input) {
  const apply = () => {
    const card = state.models.find((m) => m.id === select.value);
    if (card && card.max_tokens) input.max = String(card.max_tokens);
  };
  select.addEventListener("change", apply);
  apply();
}

// ---------------------------------------------------------------- streaming

function numberOf(input) {
  return input.value === "" ? undefined : Number(input.value);
}

// Streams one chat completion; onPiece(text, logprobs) per chunk with text or log-probabilities (logprobs: the chunk's
// list of {token, logprob, top_logprobs}, or null). Resolves {ttft_ms, tokens_per_s, finish_reason, usage}.
async function streamChat(body, onPiece, signal) {
  const started = performance.now();
  const response = await api("/v1/chat/completions", { ...body, stream: true, stream_options: { include_usage: true } }, signal);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  let first = null;
  let pieces = 0;
  let finish = null;
  let usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiFailure(0, chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const piece = (choice.delta && choice.delta.content) || "";
          const logprobs = (choice.logprobs && choice.logprobs.content) || null;
          if (piece) {
            if (first === null) first = performance.now();
            pieces += 1;
          }
          if (piece || logprobs) onPiece(piece, logprobs);
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    }
  }
  const ended = performance.now();
  const tokens = usage ? usage.completion_tokens : pieces;
  const decoding_s = first === null ? 0 : (ended - first) / 1000;
  return {
    ttft_ms: first === null ? null : first - started,
    tokens_per_s: decoding_s > 0 && tokens > 1 ? (tokens - 1) / decoding_s : null,
    finish_reason: finish,
    usage,
  };
}

function describe(result) {
  const parts = [];
  if (result.ttft_ms !== null) parts.push(`TTFT ${result.ttft_ms.toFixed(0)} ms`);
  if (result.tokens_per_s !== null) parts.push(`${result.tokens_per_s.toFixed(1)} tokens/s`);
  if (result.usage) parts.push(`${result.usage.completion_tokens} tokens`);
  parts.push(`finish: ${result.finish_reason || "stopped"}`);
  return parts.join(" · ");
}

// ---------------------------------------------------------------- chat

function chatOptions() {
  const options = {
    model: $("chat-model").value,
    temperature: numberOf($("chat-temperature")),
    top_p: numberOf($("chat-top-p")),
    max_tokens: numberOf($("chat-max-tokens")),
    seed: numberOf($("chat-seed")),
  };
  if ($("chat-logprobs").checked) Object.assign(options, { logprobs: true, top_logprobs: 5 });
  const stop = $("chat-stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) options.stop = stop;
  const schema = $("chat-schema").value.trim();
  if (schema) {  // structured output: response_format json_schema (the gateway answers a schema it cannot follow with a 400)
    let parsed;
    try {
      parsed = JSON.parse(schema);
    } catch (err) {
      throw new Error(`JSON schema: not valid JSON (${err.message})`);
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("JSON schema: must be a JSON object");
    options.response_format = { type: "json_schema", json_schema: { name: "playground", schema: parsed } };
  }
  for (const name of Object.keys(options)) if (options[name] === undefined) delete options[name];
  return options;
}

function chatMessages() {
  const system = $("chat-system").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...state.history];
}

// A token's hover text: its log-probability (and probability), then the alternatives the model weighed, most likely first.
function tokenTitle(entries) {
  return entries.map((entry) => {
    const alternatives = (entry.top_logprobs || []).map((alt) => `  ${JSON.stringify(alt.token)} ${alt.logprob.toFixed(4)}`);
    const head = `${JSON.stringify(entry.token)} logprob ${entry.logprob.toFixed(4)} (p ${Math.exp(entry.logprob).toFixed(3)})`;
    return [head, ...(alternatives.length ? ["top alternatives:", ...alternatives] : [])].join("\n");
  }).join("\n\n");
}

// Shows an answer as it streams, as one span per piece of text with its tokens' log-probabilities on hover: the spans'
// text is the answer itself (a piece is the text its tokens decoded to; tokens without text of their own, e.g. the end of
// sequence, join the next piece's span, or the last one's at the end).
class TokenView {
  constructor(body) {
    this.body = body;
    this.pending = [];
    this.last = null;
  }

  add(piece, logprobs) {
    const entries = [...this.pending, ...(logprobs || [])];
    if (!piece) {
      this.pending = entries;
      return;
    }
    this.pending = [];
    this.last = { span: el("span", { className: "token", text: piece }), entries };
    this.last.span.dataset.logprobs = JSON.stringify(entries.map((entry) => entry.logprob));
    this.last.span.title = tokenTitle(entries);
    this.body.append(this.last.span);
  }

  finish() {
    if (!this.pending.length || !this.last) return;
    this.last.entries.push(...this.pending);
    this.last.span.dataset.logprobs = JSON.stringify(this.last.entries.map((entry) => entry.logprob));
    this.last.span.title = tokenTitle(this.last.entries);
    this.pending = [];
  }
}

function addMessage(role, text) {
  const body = el("span", { className: "text", text });
  const node = el("div", { className: `message ${role}` }, el("span", { className: "who", text: role }), body);
  $("chat-log").append(node);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return { node, body };
}

$("chat-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || state.running.length) return;
  showError(null);
  $("chat-input").value = "";
  state.history.push({ role: "user", content: text });
  const asked = addMessage("user", text);
  const answer = addMessage("assistant", "");
  const stats = el("span", { className: "stats" });
  answer.node.append(stats);
  const controller = new AbortController();
  state.running = [controller];
  $("chat-send").disabled = true;
  $("chat-stop-button").disabled = false;
  let received = "";
  try {
    const options = chatOptions();
    const tokens = options.logprobs ? new TokenView(answer.body) : null;
    const result = await streamChat({ ...options, messages: chatMessages() }, (piece, logprobs) => {
      received += piece;
      if (tokens) tokens.add(piece, logprobs);
      else answer.body.textContent = received;
    }, controller.signal);
    if (tokens) tokens.finish();
    stats.textContent = describe(result);
    state.history.push({ role: "assistant", content: received });
  } catch (err) {
    if (err.name === "AbortError") {
      stats.textContent = "stopped";
      if (received) state.history.push({ role: "assistant", content: received });
      else state.history.pop();
    } else {  // not sent: off the screen as out of the history, the text back in the box to try again
      state.history.pop();
      answer.node.remove();
      asked.node.remove();
      if (!$("chat-input").value) $("chat-input").value = text;
      showError(err);
    }
  } finally {
    state.running = [];
    $("chat-send").disabled = false;
    $("chat-stop-button").disabled = true;
  }
});

$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("chat-form").requestSubmit();
  }
});

function stopRunning() {
  for (const controller of state.running) controller.abort();
}

$("chat-stop-button").addEventListener("click", stopRunning);
$("chat-clear").addEventListener("click", () => {
  state.history = [];
  $("chat-log").replaceChildren();
  $("chat-command").hidden = true;
});

function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

$("chat-copy").addEventListener("click", async () => {
  let options;
  try {
    options = chatOptions();
  } catch (err) {
    showError(err);
    return;
  }
  const body = { ...options, messages: chatMessages(), stream: true };
  const key = state.key ? ' -H "Authorization: Bearer $HF2TRITON_API_KEY"' : "";
  const curl = `curl -N ${location.origin}/v1/chat/completions -H "Content-Type: application/json"${key} -d ${shellQuote(JSON.stringify(body))}`;
  const flags = [["--max-tokens", body.max_tokens], ["--temperature", body.temperature], ["--top-p", body.top_p], ["--seed", body.seed],
    ...(body.stop || []).map((stop) => ["--stop", stop]), ["--system", $("chat-system").value.trim() || undefined]]
    .filter(([, value]) => value !== undefined).map(([flag, value]) => ` ${flag} ${shellQuote(String(value))}`).join("");
  const cli = `python -m hf2triton chat ${body.model}${flags}   # then type the conversation`;
  const text = `${curl}\n\n${cli}\n`;
  $("chat-command").textContent = text;
  $("chat-command").hidden = false;
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) { /* no clipboard (not a secure context): the text is shown to copy by hand */ }
});

// ---------------------------------------------------------------- compare

(function secondSide() {  // the same settings as side a, sampled by default: one model, two settings
  const side = document.querySelector("#compare .column");
  const copy = side.cloneNode(true);
  copy.dataset.side = "b";
  copy.querySelector(".side-temperature").value = "0.8";
  copy.querySelector(".side-seed").value = "1";
  side.after(copy);
})();

$("compare-send").addEventListener("click", async () => {
  const prompt = $("compare-prompt").value.trim();
  if (!prompt || state.running.length) return;
  showError(null);
  const columns = [...document.querySelectorAll("#compare .column")];
  state.running = columns.map(() => new AbortController());
  $("compare-send").disabled = true;
  $("compare-stop").disabled = false;
  await Promise.all(columns.map(async (column, index) => {
    const answer = column.querySelector(".answer");
    const stats = column.querySelector(".stats");
    answer.textContent = "";
    stats.textContent = "…";
    const options = {
      model: column.querySelector(".side-model").value,
      temperature: numberOf(column.querySelector(".side-temperature")),
      seed: numberOf(column.querySelector(".side-seed")),
      max_tokens: numberOf(column.querySelector(".side-max-tokens")),
      messages: [{ role: "user", content: prompt }],
    };
    for (const name of Object.keys(options)) if (options[name] === undefined) delete options[name];
    let received = "";
    try {
      const result = await streamChat(options, (piece) => {
        received += piece;
        answer.textContent = received;
      }, state.running[index].signal);
      stats.textContent = `${options.model}: ${describe(result)}`;
    } catch (err) {
      stats.textContent = err.name === "AbortError" ? "stopped" : `error: ${err.message}`;
    }
  }));
  state.running = [];
  $("compare-send").disabled = false;
  $("compare-stop").disabled = true;
});

$("compare-stop").addEventListener("click", stopRunning);

// ---------------------------------------------------------------- embeddings

function cosine(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i += 1) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}

$("embeddings-send").addEventListener("click", async () => {
  const texts = $("embeddings-input").value.split("\n").map((t) => t.trim()).filter(Boolean);
  if (!texts.length) return;
  showError(null);
  try {
    const model = $("embeddings-model").value;
    const answer = await (await api("/v1/embeddings", { model, input: texts })).json();
    const vectors = answer.data.sort((x, y) => x.index - y.index).map((d) => d.embedding);
    const short = (text) => (text.length > 40 ? `${text.slice(0, 37)}…` : text);
    const head = el("tr", {}, el("th", { text: "" }), ...texts.map((t) => el("th", { title: t, text: short(t) })));
    const rows = texts.map((text, i) => el("tr", {}, el("th", { title: text, text: short(text) }), ...texts.map((_, j) => {
      const value = cosine(vectors[i], vectors[j]);
      const cell = el("td", { text: value.toFixed(3), "data-value": String(value) });
      cell.style.backgroundColor = `hsl(${Math.round(220 - 220 * Math.max(0, value))}, 70%, ${Math.round(92 - 30 * Math.max(0, value))}%)`;
      return cell;
    })));
    $("similarity").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    $("embeddings-note").textContent = `${model}: ${vectors.length} texts, ${vectors[0].length} dimensions, ${answer.usage.prompt_tokens} tokens; `
      + "cosine similarity, coloured from blue (0 or less: unrelated) to red (1: the same meaning)";
  } catch (err) {
    showError(err);
  }
});

// ---------------------------------------------------------------- status

async function refreshStatus() {
  try {
    const status = await (await api("/v1/status")).json();
    $("status-health").textContent = `Triton ${status.triton_ready ? "ready" : "NOT ready"} · gateway up`;
    const columns = ["id", "task", "backend", "device", "instances", "max_batch_size", "max_sequences", "streaming"];
    const head = el("tr", {}, ...columns.map((c) => el("th", { text: c })));
    const rows = status.models.map((m) => el("tr", {}, ...columns.map((c) => el("td", { text: String(m[c] ?? "") }))));
    $("status-models").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const validation = status.validation;
    $("status-validation").textContent = validation
      ? `Last validation: ${validation.ok ? "PASS" : "FAIL"} (${validation.time || "time unknown"})`
      : "Last validation: no report";
    $("status-validation").className = validation && validation.ok ? "ok" : "error";
  } catch (err) {
    showError(err);
  }
}

$("status-refresh").addEventListener("click", refreshStatus);

start();
