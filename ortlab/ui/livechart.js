// ortlab's live chart (ortlab/ui/livechart.py): plotly.js drawing curves whose points arrive as appends.
//
// The model's state holds the figure without data (figure_layout: plotly's layout; traces: each one's style and
// name; not `layout`, which is ipywidgets' own Layout model on every DOM widget); the points come as
// custom messages {type: "points", snapshot, ops: [[trace, keep, xs, ys], ...]}: keep the trace's first `keep`
// points, append xs/ys. keep 0 replaces the curve (a restyle); otherwise the new points go through
// Plotly.extendTraces. A view asks for a snapshot when it opens, and again whenever what arrives does not fit what
// it holds (a message sent before it existed).
//
// plotly.js itself (4.8 MB) is not in this module: the first view on a page asks the kernel for the copy in the
// installed plotly package, once per page, so the widget's state stays small and no CDN is needed.
//
// After each message the view reports how long drawing and painting took ({type: "rendered", ms}); the kernel
// spaces its refreshes so that drawing stays a small share of a core.

// Resolves once the browser has painted what was drawn (two animation frames), or after 250 ms in a tab that
// paints nothing (hidden tabs get no animation frames).
const painted = () =>
  new Promise((done) => {
    const timer = setTimeout(done, 250);
    requestAnimationFrame(() =>
      requestAnimationFrame(() => {
        clearTimeout(timer);
        done();
      }),
    );
  });

function loadPlotly(model) {
  if (!globalThis.__ortlabPlotly) {
    globalThis.__ortlabPlotly = new Promise((resolve, reject) => {
      const onMessage = (msg, buffers) => {
        if (!msg || msg.type !== "plotly") return;
        model.off("msg:custom", onMessage);
        try {
          const source = new TextDecoder().decode(buffers[0]);
          const module = { exports: {} };
          // plotly.min.js is a UMD bundle: given `module`, it hands its namespace back there.
          new Function("module", "exports", "define", source)(module, module.exports, undefined);
          resolve(module.exports);
        } catch (error) {
          globalThis.__ortlabPlotly = undefined;
          reject(error);
        }
      };
      model.on("msg:custom", onMessage);
      model.send({ type: "plotly" });
    });
  }
  return globalThis.__ortlabPlotly;
}

// A curve longer than this is drawn as a line only: plotly draws each marker as its own SVG element, and redrawing
// 4 x 1,000 of them was most of a refresh's drawing time; at that density the dots no longer show single points.
const MARKERS_UP_TO = 300;

function lineOnly(trace, length) {
  if (length > MARKERS_UP_TO && trace.mode === "lines+markers") trace.mode = "lines";
}

function figure(model, gd) {
  const data = (model.get("traces") || []).map((style, i) => {
    const old = (gd.data || [])[i];
    const trace = { ...style, x: old ? old.x : [], y: old ? old.y : [] };
    lineOnly(trace, trace.x.length);
    return trace;
  });
  return [data, { ...(model.get("figure_layout") || {}), autosize: true }];
}

async function render({ model, el }) {
  const Plotly = await loadPlotly(model);
  const gd = document.createElement("div");
  gd.className = "ortlab-live-chart";
  el.appendChild(gd);
  const config = { displaylogo: false, responsive: true };
  await Plotly.newPlot(gd, ...figure(model, gd), config);
  let synced = false;
  let asked = false;
  let queue = Promise.resolve();
  const ask = () => {
    synced = false;
    if (!asked) {
      asked = true;
      model.send({ type: "snapshot" });
    }
  };
  const draw = async (msg) => {
    if (msg.snapshot) {
      synced = true;
      asked = false;
    } else if (!synced) {
      return; // the snapshot asked for holds these points
    }
    const started = performance.now();
    const replace = { x: [], y: [], traces: [] };
    const extend = { x: [], y: [], traces: [] };
    for (const [index, keep, xs, ys] of msg.ops) {
      const trace = (gd.data || [])[index];
      if (!trace || keep > trace.x.length) return ask();
      const into = keep === 0 ? replace : extend;
      if (keep > 0) {
        trace.x.length = keep; // drop the provisional tail (the unfinished bucket's points)
        trace.y.length = keep;
      }
      lineOnly(trace, keep + xs.length); // before the redraw that extendTraces/restyle do
      into.x.push(xs);
      into.y.push(ys);
      into.traces.push(index);
    }
    if (replace.traces.length) await Plotly.restyle(gd, { x: replace.x, y: replace.y }, replace.traces);
    if (extend.traces.length) await Plotly.extendTraces(gd, { x: extend.x, y: extend.y }, extend.traces);
    await painted(); // the browser's layout and paint of the redraw count too (they were 3x plotly's own time)
    const ms = performance.now() - started;
    (globalThis.__ortlabRenderMs = globalThis.__ortlabRenderMs || []).push(ms); // read by the browser benchmark
    model.send({ type: "rendered", ms });
  };
  const onMessage = (msg) => {
    if (msg && msg.type === "points") queue = queue.then(() => draw(msg)).catch(() => ask());
  };
  const onFigure = () => {
    queue = queue.then(() => Plotly.react(gd, ...figure(model, gd), config));
  };
  model.on("msg:custom", onMessage);
  model.on("change:traces", onFigure);
  model.on("change:figure_layout", onFigure);
  ask();
  return () => {
    model.off("msg:custom", onMessage);
    model.off("change:traces", onFigure);
    model.off("change:figure_layout", onFigure);
    Plotly.purge(gd);
  };
}

export default { render };
