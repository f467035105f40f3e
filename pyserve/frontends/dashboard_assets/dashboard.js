// pyserve's status page: polls /dashboard/data and draws it. No framework, no build step, no network beyond this
// server. Everything a model or a log line names is inserted as text (textContent), never as HTML.
"use strict";
(() => {
  const POLL_MS = 2000;
  const WINDOW_S = 300;
  const COLORS = ["#4a7bd0", "#e07b39", "#2e9e6a", "#a35fc9", "#c9455f", "#7a8a23", "#3aa0b8", "#8c6d46"];
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }

  function svgEl(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const finite = (v) => v !== null && v !== undefined && Number.isFinite(v);
  const fmt = {
    count: (v) => (finite(v) ? Number(v).toLocaleString("en-US") : "-"),
    rate: (v) => (finite(v) ? (v >= 100 ? v.toFixed(0) : v.toFixed(1)) : "-"),
    ms: (v) => (finite(v) ? (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) : "-"),
    axis: (v) => (v >= 1000 ? `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k` : v >= 10 ? v.toFixed(0) : String(+v.toFixed(2))),
    time: (t) => new Date(t * 1000).toLocaleTimeString("en-GB"),
    duration(seconds) {
      const s = Math.max(0, Math.floor(seconds));
      const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
      return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : `${m}m ${s % 60}s`;
    },
  };
  const last = (points) => (points && points.length ? points[points.length - 1][1] : null);

  // The history's samples as per-model series: requests/s and mean latency between samples, quantiles, queue.
  function seriesOf(history) {
    const at = Object.fromEntries(history.fields.map((field, i) => [field, i]));
    const samples = history.samples;
    const series = {};
    samples.forEach((sample, i) => {
      for (const [key, v] of Object.entries(sample.models)) {
        const s = (series[key] ||= { rps: [], mean: [], p50: [], p99: [], queued: [] });
        s.queued.push([sample.t, v[at.queued]]);
        if (finite(v[at.p50_us])) s.p50.push([sample.t, v[at.p50_us] / 1000]);
        if (finite(v[at.p99_us])) s.p99.push([sample.t, v[at.p99_us] / 1000]);
        // A model that appeared since the previous sample counted from zero in this interval.
        const before = i > 0 ? samples[i - 1].models[key] || v.map(() => 0) : undefined;
        const dt = i > 0 ? sample.t - samples[i - 1].t : 0;
        if (!before || dt <= 0) continue;
        const answered = v[at.success] + v[at.fail] - (before[at.success] + before[at.fail]);
        s.rps.push([sample.t, Math.max(0, answered) / dt]);
        const succeeded = v[at.success] - before[at.success];
        if (succeeded > 0) s.mean.push([sample.t, (v[at.success_ns] - before[at.success_ns]) / succeeded / 1e6]);
      }
    });
    return series;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * power >= v) return m * power;
    return 10 * power;
  }

  function lineChart(svg, lines, now) {
    const W = 480, H = 180, L = 40, R = 8, T = 8, B = 22;
    const start = now - WINDOW_S;
    const visible = lines.map((line) => ({ ...line, points: line.points.filter(([t]) => t >= start) }));
    const max = niceMax(Math.max(0, ...visible.flatMap((line) => line.points.map(([, v]) => v))));
    const x = (t) => L + ((W - L - R) * (t - start)) / WINDOW_S;
    const y = (v) => T + (H - T - B) * (1 - v / max);
    const nodes = [];
    for (const v of [0, max / 2, max]) {
      nodes.push(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      nodes.push(svgEl("text", { class: "tick", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, fmt.axis(v)));
    }
    for (const [t, text, anchor] of [[start, "-5 min", "start"], [now - WINDOW_S / 2, "-2.5 min", "middle"], [now, "now", "end"]]) {
      nodes.push(svgEl("text", { class: "tick", x: x(t), y: H - 6, "text-anchor": anchor }, text));
    }
    for (const line of visible) {
      if (!line.points.length) continue;
      const points = line.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      const polyline = svgEl("polyline", { class: "series", stroke: line.color, points });
      if (line.dashed) polyline.setAttribute("stroke-dasharray", "4 3");
      polyline.append(svgEl("title", {}, line.name));
      nodes.push(polyline);
      const [t, v] = line.points[line.points.length - 1];  // the latest value, visible even as a lone point
      nodes.push(svgEl("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: line.color }));
    }
    svg.replaceChildren(...nodes);
  }

  function barChart(model, color) {
    const W = 480, H = 140, L = 40, R = 8, T = 8, B = 22;
    const bars = model.batches;
    const max = niceMax(Math.max(0, ...bars.map(([, n]) => n)));
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
    const width = (W - L - R) / Math.max(bars.length, 1);
    const y = (v) => T + (H - T - B) * (1 - v / max);
    svg.append(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
    svg.append(svgEl("text", { class: "tick", x: L - 4, y: y(max) + 3, "text-anchor": "end" }, fmt.axis(max)));
    const every = Math.ceil(bars.length / 16);
    bars.forEach(([size, executions], i) => {
      const rect = svgEl("rect", {
        class: "bar", x: L + i * width + width * 0.1, y: y(executions), width: width * 0.8,
        height: Math.max(0, y(0) - y(executions)), fill: color,
        "data-batch-size": size, "data-executions": executions,
      });
      rect.append(svgEl("title", {}, `${executions} executions of ${size} row(s)`));
      svg.append(rect);
      if (i % every === 0 || i === bars.length - 1) {
        svg.append(svgEl("text", { class: "tick", x: L + (i + 0.5) * width, y: H - 6, "text-anchor": "middle" }, size));
      }
    });
    const caption = el("figcaption", {}, `${model.name} v${model.version}`);
    const figure = el("figure", { "data-model": `${model.name}/${model.version}` }, caption, svg);
    if (!bars.length) figure.append(el("p", { class: "muted" }, "no batch yet"));
    return figure;
  }

  function cell(field, text, value) {
    const td = el("td", { "data-field": field }, text);
    if (value !== undefined) td.setAttribute("data-value", value);
    return td;
  }

  function render(data) {
    const server = data.server;
    const quantiles = server.latency === "quantiles";
    const series = seriesOf(data.history);
    const now = server.now;
    const colors = {};
    data.models.forEach((m, i) => (colors[`${m.name}/${m.version}`] = COLORS[i % COLORS.length]));

    $("server-name").textContent = server.name;
    $("server-version").textContent = server.version;
    const state = $("server-state");
    state.textContent = server.ready ? "ready" : "not ready";
    state.className = `badge ${server.ready ? "ok" : "bad"}`;
    $("server-uptime").textContent = fmt.duration(now - server.started);
    $("server-pid").textContent = server.pid;
    $("updated").textContent = fmt.time(now);

    // Now: the last interval between samples, summed (or the worst model, for latency) over the models.
    const keys = data.models.map((m) => `${m.name}/${m.version}`);
    const rates = keys.map((k) => last(series[k]?.rps)).filter(finite);
    $("total-rps").textContent = rates.length ? fmt.rate(rates.reduce((a, b) => a + b, 0)) : "-";
    const worst = (field) => {
      const values = data.models.map((m) => (m.latency_us ? m.latency_us[field] / 1000 : null)).filter(finite);
      return values.length ? Math.max(...values) : null;
    };
    const means = keys.map((k) => last(series[k]?.mean)).filter(finite);
    $("latency-label-1").textContent = quantiles ? "p50 latency (ms)" : "mean latency (ms)";
    $("latency-label-2").textContent = "p99 latency (ms)";
    $("total-p50").textContent = fmt.ms(quantiles ? worst("p50") : means.length ? Math.max(...means) : null);
    $("total-p99").textContent = fmt.ms(quantiles ? worst("p99") : null);
    $("total-queued").textContent = fmt.count(data.models.reduce((a, m) => a + m.queued, 0));
    $("total-fail").textContent = fmt.count(data.models.reduce((a, m) => a + m.stats.fail, 0));

    const lines = (pick, dashed) => keys.map((k) => ({ name: k, color: colors[k], dashed, points: series[k]?.[pick] || [] }));
    lineChart($("chart-throughput"), lines("rps", false), now);
    lineChart($("chart-latency"), quantiles ? [...lines("p50", false), ...lines("p99", true)] : lines("mean", false), now);
    lineChart($("chart-queue"), lines("queued", false), now);
    $("latency-caption").textContent = quantiles ? "Latency (ms): p50 solid, p99 dashed, over the last minute" : "Mean latency (ms)";
    $("latency-note").textContent = quantiles
      ? "p50 and p99 come from the latency summaries (ServeConfig.metrics_summaries), over a sliding minute."
      : "Latency is the mean between samples; p50 and p99 need ServeConfig(metrics_summaries=True) " +
        "(PYSERVE_METRICS_SUMMARIES=1), which observes every request.";
    $("legend").replaceChildren(...keys.map((k) => el("span", {}, el("i", { style: `background:${colors[k]}` }), k)));

    $("models-latency-1").textContent = quantiles ? "p50 ms" : "mean ms";
    const models = data.models.map((m) => {
      const key = `${m.name}/${m.version}`;
      const s = m.stats;
      const live = m.instances.filter((i) => i.state === "idle" || i.state === "busy").length;
      const meanBatch = s.execution_count ? s.inference_count / s.execution_count : null;
      const latency = quantiles && m.latency_us ? [m.latency_us.p50 / 1000, m.latency_us.p99 / 1000] : [last(series[key]?.mean), null];
      const stateText = m.ready ? "ready" : "unavailable";
      const row = el(
        "tr", { "data-model": key },
        cell("name", m.name), cell("version", m.version), cell("state", stateText),
        cell("max_batch_size", m.max_batch_size || "-", m.max_batch_size),
        cell("instances", `${live}/${m.configured_instances}`, live),
        cell("queued", fmt.count(m.queued), m.queued),
        cell("rps", fmt.rate(last(series[key]?.rps))),
        cell("success", fmt.count(s.success), s.success),
        cell("fail", fmt.count(s.fail), s.fail),
        cell("inference_count", fmt.count(s.inference_count), s.inference_count),
        cell("execution_count", fmt.count(s.execution_count), s.execution_count),
        cell("mean_batch", finite(meanBatch) ? meanBatch.toFixed(2) : "-"),
        cell("p50", fmt.ms(latency[0])), cell("p99", fmt.ms(latency[1])),
      );
      row.children[2].className = `state-${stateText}`;
      return row;
    });
    $("models").tBodies[0].replaceChildren(...models);

    const instances = data.models.flatMap((m) => m.instances.map((i) => {
      const row = el(
        "tr", { "data-model": `${m.name}/${m.version}`, "data-instance": i.index },
        cell("model", `${m.name} v${m.version}`), cell("index", i.index), cell("kind", i.kind),
        cell("pid", i.pid || "-", i.pid), cell("device", i.device || "-"), cell("host", i.host || "-"),
        // A Ray node id is 56 hex digits: its start tells nodes apart, the whole of it is in data-value.
        cell("node", i.node ? i.node.slice(0, 8) : "-", i.node),
        cell("restarts", i.restarts, i.restarts), cell("batches", fmt.count(i.batches), i.batches),
        cell("state", i.state),
      );
      row.lastChild.className = `state-${i.state}`;
      return row;
    }));
    $("instances").tBodies[0].replaceChildren(...instances);

    $("batches").replaceChildren(...data.models.filter((m) => m.max_batch_size > 0 || m.batches.length)
      .map((m) => barChart(m, colors[`${m.name}/${m.version}`])));

    const errors = data.errors.map((e) => el(
      "li", {},
      el("span", { class: "when" }, fmt.time(e.t)), el("span", { class: `level-${e.level}` }, e.level),
      el("span", { class: "source" }, e.source), el("span", { class: "message" }, e.message),
    ));
    $("errors").replaceChildren(...(errors.length ? errors : [el("li", { class: "empty" }, "none")]));
    document.body.setAttribute("data-updated", String(now));
  }

  async function poll() {
    try {
      // /dashboard/data, below wherever the page is (a proxy may serve it under a prefix).
      const response = await fetch(location.pathname.replace(/\/?$/, "/data"), { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      render(await response.json());
    } catch (error) {
      const state = $("server-state");
      state.textContent = `unreachable (${error.message})`;
      state.className = "badge bad";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
