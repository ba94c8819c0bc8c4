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
  let source = null;
  let lines = [];

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
  follow(log.dataset.firstLayer);

  // charts: uPlot over /ui/runs/RUN/charts.json, redrawn every 5 s while the run goes
  const plots = {};
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
    plots[id] = new uPlot({ width, height: 180, series, scales: { x: { time: xTime } }, legend: { show: labels.length > 1 } }, data, box);
  }
  async function charts() {
    let found;
    try {
      const r = await fetch(`/ui/runs/${run}/charts.json`, { credentials: "same-origin" });
      if (!r.ok) return;
      found = await r.json();
    } catch (e) { return; }
    draw("chart-loss", found.loss, ["loss"], false);
    const gpus = Object.keys(found.gpus);
    const note = document.getElementById("charts-note");
    note.textContent = found.unavailable ? `No GPU samples: ${found.unavailable}` : "";
    ["util", "mem_gib", "power_w", "temp_c"].forEach((field, k) => {
      if (gpus.length === 0) { draw(`chart-${field}`, null, [], true); return; }
      const xs = found.gpus[gpus[0]].data[0];
      const data = [xs].concat(gpus.map((g) => {
        const d = found.gpus[g].data;
        return d[0].length === xs.length ? d[k + 1] : xs.map(() => null);
      }));
      draw(`chart-${field}`, data, gpus.map((g) => `GPU ${g}`), true);
    });
    if (found.state && ["succeeded", "failed", "terminated"].includes(found.state)) return;
    setTimeout(charts, 5000);
  }
  charts();
})();
