// The console's live parts that htmx does not do by itself: a run's log followed over
// Server-Sent Events (text appended as text, never as HTML), its search, and its charts.
(function () {
  "use strict";
  const page = document.getElementById("run-page");
  if (!page) return;
  const run = page.dataset.run;
  const log = document.getElementById("log");
  const status = document.getElementById("log-status");
  const search = document.getElementById("log-search");
  const download = document.getElementById("log-download");
  const older = document.getElementById("log-older");
  let source = null;
  let lines = [];
  let layerNow = null;
  let start = null; // the byte offset the lines shown begin at (null: not known yet)
  let attemptNow = null; // the attempt whose log is shown

  function show() {
    const term = search.value.trim().toLowerCase();
    const shown = term ? lines.filter((l) => l.toLowerCase().includes(term)) : lines;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 30;
    log.textContent = shown.join("\n");
    if (atEnd || !term) log.scrollTop = log.scrollHeight;
  }

  function follow(layer) {
    if (source) source.close();
    lines = [];
    start = null;
    attemptNow = null;
    layerNow = layer;
    older.hidden = true;
    log.textContent = "";
    download.href = `/ui/runs/${run}/logs/${layer}/download`;
    status.textContent = "connecting…";
    source = new EventSource(`/ui/runs/${run}/logs/${layer}/stream`);
    source.addEventListener("log", (e) => {
      const text = e.data.endsWith("\n") ? e.data.slice(0, -1) : e.data;

      lines.push(...text.split("\n"));
      if (lines.length > 20000) lines = lines.slice(-20000);
      status.textContent = "following";
      show();
    });
    source.addEventListener("start", (e) => {
      const [attempt, offset] = e.data.split(":").map(Number);
      if (start === null || attempt !== attemptNow) {
        if (attemptNow !== null && attempt !== attemptNow) { lines = []; }
        attemptNow = attempt;
        start = offset;
        older.hidden = start <= 0;
      }
    });
    source.addEventListener("end", () => {
      status.textContent = "the attempt has ended: this is all of it";
      source.close();
    });
    source.addEventListener("problem", (e) => {
      status.textContent = JSON.parse(e.data).message;
    });
    source.onerror = () => { status.textContent = "reconnecting…"; };
  }

  document.querySelectorAll("button.layer").forEach((b) => {
    b.addEventListener("click", () => {
      document.querySelectorAll("button.layer").forEach((x) => x.classList.remove("on"));
      b.classList.add("on");
      follow(b.dataset.layer);
    });
  });
  search.addEventListener("input", show);
  older.addEventListener("click", async () => {
    if (start === null || start <= 0) return;
    const r = await fetch(`/ui/runs/${run}/logs/${layerNow}/older?offset=${start}&attempt=${attemptNow}`, { credentials: "same-origin" });
    if (!r.ok) return;
    const found = await r.json();
    const text = found.text.endsWith("\n") ? found.text.slice(0, -1) : found.text;
    if (text) lines = text.split("\n").concat(lines);
    start = found.offset;
    older.hidden = start <= 0;
    const term = search.value.trim().toLowerCase();
    const shown = term ? lines.filter((l) => l.toLowerCase().includes(term)) : lines;
    log.textContent = shown.join("\n");
    log.scrollTop = 0;
  });
  follow(log.dataset.firstLayer);

  // charts: uPlot over /ui/runs/RUN/charts.json, redrawn while the run goes (every refresh_s
  // it says: 5 s for a short run, up to 30 s for a day's, as often as a point moves on); a drag
  // across a GPU chart of at most ZOOM_S seconds asks charts.json?from=&to= for that span
  // second by second, and all four GPU charts show it until "Back to the whole run"
  const plots = {};
  const whole = document.getElementById("charts-whole");
  const ZOOM_S = whole ? Number(whole.dataset.zoomS) : 0;
  let zoomed = false;
  let last = null;
  function gpuCharts(found) {
    const gpus = Object.keys(found.gpus);
    ["util", "mem_gib", "power_w", "temp_c"].forEach((field, k) => {
      if (gpus.length === 0) { draw(`chart-${field}`, null, [], true); return; }
      const xs = found.gpus[gpus[0]].data[0];
      const data = [xs].concat(gpus.map((g) => {
        const d = found.gpus[g].data;
        return d[0].length === xs.length ? d[k + 1] : xs.map(() => null);
      }));
      draw(`chart-${field}`, data, gpus.map((g) => `GPU ${g}`), true);
    });
  }
  async function zoomTo(from, to) {
    try {
      const r = await fetch(`/ui/runs/${run}/charts.json?from=${from}&to=${to}`, { credentials: "same-origin" });
      if (!r.ok) return;
      const found = await r.json();
      zoomed = true;
      whole.hidden = false;
      gpuCharts(found);
    } catch (e) { return; }
  }
  if (whole) {
    whole.addEventListener("click", () => {
      zoomed = false;
      whole.hidden = true;
      if (last) gpuCharts(last);
    });
  }
  function onSelect(u) {
    if (u.select.width < 2) return;
    const from = u.posToVal(u.select.left, "x");
    const to = u.posToVal(u.select.left + u.select.width, "x");
    if (to - from <= ZOOM_S) zoomTo(from.toFixed(3), to.toFixed(3));
  }
  const palette = ["#0b6bcb", "#c6282b", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#1b7c83", "#6e7781"];
  function draw(id, data, labels, xTime) {
    const box = document.getElementById(id);
    if (!box) return;
    if (!data || !data[0] || data[0].length === 0) { box.textContent = "no samples yet"; return; }
    const series = [{}].concat(labels.map((l, i) => ({ label: l, stroke: palette[i % palette.length], width: 1.5 })));
    const width = Math.max(280, box.clientWidth || 320);
    box.dataset.points = String(data[0].length);
    if (plots[id] && plots[id].series.length === series.length) { plots[id].setData(data); return; }
    if (plots[id]) plots[id].destroy();
    box.textContent = "";
    const hooks = xTime ? { setSelect: [onSelect] } : {};
    plots[id] = new uPlot({ width, height: 180, series, hooks, scales: { x: { time: xTime } }, legend: { show: labels.length > 1 } }, data, box);
  }
  async function charts() {
    let found;
    try {
      const r = await fetch(`/ui/runs/${run}/charts.json`, { credentials: "same-origin" });
      if (!r.ok) return;
      found = await r.json();
    } catch (e) { return; }
    draw("chart-loss", found.loss, ["loss"], false);
    const progress = document.getElementById("progress");
    if (found.progress && progress) {
      const p = found.progress;
      progress.textContent = "";
      if (p.max_steps && p.step !== null) {
        const bar = document.createElement("progress");
        bar.max = p.max_steps;
        bar.value = p.step;
        progress.append(bar, " ");
      }
      const words = [];
      if (p.step !== null) words.push(`step ${p.step}` + (p.max_steps ? `/${p.max_steps}` : ""));
      if (p.loss !== null) words.push(`loss ${p.loss}`);
      if (p.score !== null && p.score !== undefined) words.push(`mean score ${p.score}`);
      progress.append(words.join(", "));
    }
    const note = document.getElementById("charts-note");
    note.textContent = found.unavailable ? `No GPU samples: ${found.unavailable}` : "";
    last = found;
    if (!zoomed) gpuCharts(found);
    if (found.state && ["succeeded", "failed", "terminated"].includes(found.state)) return;
    setTimeout(charts, (found.refresh_s || 5) * 1000);  // a long run's every 30 s
  }
  charts();
})();

// sparklines: a node's mean GPU utilization over the last hour (data-series: [times, values])
(function () {
  "use strict";
  document.querySelectorAll(".spark").forEach((box) => {
    const data = JSON.parse(box.dataset.series || "[[],[]]");
    box.dataset.points = String(data[0].length);
    if (data[0].length < 2) { box.textContent = "no history yet"; return; }
    const wide = box.classList.contains("wide");
    new uPlot({
      width: wide ? 600 : 160, height: wide ? 120 : 36,
      legend: { show: false }, cursor: { show: wide },
      axes: wide ? [{}, {}] : [{ show: false }, { show: false }],
      scales: { y: { range: [0, 100] } },
      series: [{}, { stroke: "#0b6bcb", width: 1.5, fill: "rgba(11,107,203,0.12)" }],
    }, data, box);
  });
})();

// fair share: GPU-hours per user in each step of the period
(function () {
  "use strict";
  const box = document.getElementById("chart-share");
  if (!box) return;
  const data = JSON.parse(box.dataset.series || "[[]]");
  const users = JSON.parse(box.dataset.labels || "[]");
  box.dataset.points = String(data[0].length);
  if (users.length === 0) { box.textContent = "no GPU-hours in this period"; return; }
  const palette = ["#0b6bcb", "#c6282b", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#1b7c83", "#6e7781"];
  const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8, 40] }) : undefined;
  new uPlot({
    width: Math.max(320, Math.min(900, box.clientWidth || 700)), height: 220,
    series: [{}].concat(users.map((u, i) => ({ label: u, stroke: palette[i % 8], fill: palette[i % 8] + "55", paths: bars }))),
  }, data, box);
})();
