// hf2triton playground: the Audio view (automatic-speech-recognition models) on POST /v1/audio/transcriptions and
// /v1/audio/translations. A file the server reads (WAV, FLAC, OGG, MP3) is sent as it is; a microphone recording
// (MediaRecorder: WebM or OGG Opus, which the server's soundfile cannot read) and any other file the browser can
// decode are converted here to a 16-bit PCM WAV (wavOf). The transcript is model text: shown with textContent only.
"use strict";

const SENT_AS_IS = /\.(wav|flac|ogg|oga|mp3)$/i;  // what soundfile reads on the server (serving/audio.py FORMATS)
const RECORDING_RATE = 16000;  // a recording is resampled to speech models' rate while it is decoded: a small upload
let pickedAudio = null;  // the File to send: the user's own, or a recording converted to WAV
let recording = null;  // the MediaRecorder while the microphone records

// An AudioBuffer as a WAV file: 16-bit PCM, its channels mixed to one (the server averages them the same way).
function wavOf(buffer) {
  const frames = buffer.length;
  const rate = buffer.sampleRate;
  const view = new DataView(new ArrayBuffer(44 + frames * 2));
  const ascii = (at, text) => { for (let i = 0; i < text.length; i += 1) view.setUint8(at + i, text.charCodeAt(i)); };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + frames * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true);  // the fmt chunk's size
  view.setUint16(20, 1, true);  // PCM
  view.setUint16(22, 1, true);  // one channel
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true);  // bytes per second
  view.setUint16(32, 2, true);  // bytes per frame
  view.setUint16(34, 16, true);  // bits per sample
  ascii(36, "data");
  view.setUint32(40, frames * 2, true);
  const channels = Array.from({ length: buffer.numberOfChannels }, (_, c) => buffer.getChannelData(c));
  for (let i = 0; i < frames; i += 1) {
    let sum = 0;
    for (const channel of channels) sum += channel[i];
    const sample = Math.max(-1, Math.min(1, sum / channels.length));
    view.setInt16(44 + i * 2, Math.round(sample * 32767), true);
  }
  return new Blob([view], { type: "audio/wav" });
}

// Any audio the browser decodes (a recording's WebM / OGG Opus, M4A, ...) as a WAV at RECORDING_RATE.
async function asWav(blob, name) {
  const context = new OfflineAudioContext(1, 1, RECORDING_RATE);  // decodeAudioData resamples to the context's rate
  let buffer;
  try {
    buffer = await context.decodeAudioData(await blob.arrayBuffer());
  } catch (err) {
    throw new Error(`${name}: this browser cannot decode it (${err.message}); send WAV, FLAC, OGG or MP3`);
  }
  return new File([wavOf(buffer)], name.replace(/\.[^.]*$/, "") + ".wav", { type: "audio/wav" });
}

async function pickAudio(file, note) {
  if (!file) return;
  showError(null);
  pickedAudio = SENT_AS_IS.test(file.name) ? file : await asWav(file, file.name || "audio");
  const preview = $("audio-preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(pickedAudio);  // the user's own audio, to listen to (media-src blob:)
  preview.hidden = false;
  $("audio-note").textContent = `${pickedAudio.name}, ${pickedAudio.size} bytes${note || (pickedAudio === file ? "" : " (converted to WAV here)")}`;
}

$("audio-file").addEventListener("change", (event) => pickAudio(event.target.files[0]).catch(showError));
const audioDrop = $("audio-drop");
audioDrop.addEventListener("dragover", (event) => { event.preventDefault(); audioDrop.classList.add("over"); });
audioDrop.addEventListener("dragleave", () => audioDrop.classList.remove("over"));
audioDrop.addEventListener("drop", (event) => {
  event.preventDefault();
  audioDrop.classList.remove("over");
  pickAudio(event.dataTransfer.files[0]).catch(showError);
});

// ---------------------------------------------------------------- the microphone

async function startRecording() {
  if (!window.isSecureContext || !navigator.mediaDevices || !window.MediaRecorder) {
    const loopback = `${location.protocol}//127.0.0.1${location.port ? `:${location.port}` : ""}${location.pathname}`;
    throw new Error(`recording needs a secure context: open the playground as ${loopback} or on localhost (from another `
      + "machine through an SSH tunnel, ssh -L) or over HTTPS; or upload a file");
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    throw new Error(`no microphone (${err.name}: ${err.message}): allow this page to use it in the browser's site settings`);
  }
  const recorder = new MediaRecorder(stream);
  const pieces = [];
  recorder.addEventListener("dataavailable", (event) => pieces.push(event.data));
  recorder.addEventListener("stop", () => {
    for (const track of stream.getTracks()) track.stop();
    const length = ((performance.now() - started) / 1000).toFixed(1);
    if (!pieces.some((piece) => piece.size)) {
      showError(new Error("nothing was recorded: record for a moment before stopping"));
      $("audio-note").textContent = "";
      return;
    }
    pickAudio(new File(pieces, "recording", { type: recorder.mimeType }), `, ${length} s recorded, converted to WAV here`).catch(showError);
  });
  const started = performance.now();
  recorder.start();
  recording = recorder;
  $("audio-record").textContent = "Stop recording";
  $("audio-record").classList.add("recording");
  $("audio-note").textContent = "recording…";
}

$("audio-record").addEventListener("click", () => {
  if (recording) {
    recording.stop();
    recording = null;
    $("audio-record").textContent = "Record";
    $("audio-record").classList.remove("recording");
    return;
  }
  showError(null);
  $("audio-record").disabled = true;  // until the microphone answers (the first time: the browser asks the user)
  startRecording().catch(showError).finally(() => { $("audio-record").disabled = false; });
});

// ---------------------------------------------------------------- transcribe

function seconds(value) {
  return `${value.toFixed(2)} s`;
}

$("audio-send").addEventListener("click", () => showing($("audio-send"), async () => {
  if (!pickedAudio) throw new Error("pick, drop or record an audio first");
  const form = new FormData();
  form.append("model", $("audio-model").value);
  const language = $("audio-language").value.trim();
  if (language) form.append("language", language);
  const timestamps = $("audio-timestamps").checked;
  form.append("response_format", timestamps ? "verbose_json" : "json");  // timestamps change Whisper's decoding: asked only when wanted
  form.append("file", pickedAudio, pickedAudio.name);
  const path = $("audio-task").value === "translate" ? "/v1/audio/translations" : "/v1/audio/transcriptions";
  const started = performance.now();
  const answer = await (await api(path, form)).json();
  const took = performance.now() - started;
  $("audio-text").textContent = answer.text;
  $("audio-segments").replaceChildren(...(answer.segments || []).map((s) => el("li", { "data-start": String(s.start), "data-end": String(s.end) },
    el("span", { className: "time", text: `${seconds(s.start)} → ${seconds(s.end)}` }), el("span", { className: "segment", text: s.text }))));
  const duration = answer.duration ?? $("audio-preview").duration;  // the server's (verbose_json), or the file's own
  const parts = [pickedAudio.name];
  if (Number.isFinite(duration)) parts.push(`${seconds(duration)} of audio`);
  parts.push(`${$("audio-task").value === "translate" ? "translated" : "transcribed"} in ${took.toFixed(0)} ms`);
  if (timestamps) parts.push(`${(answer.segments || []).length} segments`);
  $("audio-stats").textContent = parts.join(" · ");
}));
