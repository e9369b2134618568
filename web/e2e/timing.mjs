// Playground timings for `cargo xtask bench`: page load to the first
// example fully shown, an edit of the read-later example to every view
// updated, an edit of the MLP example to its Kernels view updated, and a
// 2,000-node graph from Ctrl+Enter to drawn. Usage: node
// timing.mjs URL; prints one JSON object.
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url] = process.argv.slice(2);
const context = await chromium.launchPersistentContext(
  mkdtempSync(join(tmpdir(), "kiln-timing-")),
  {
    executablePath: process.env.KILN_CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      // The figures are the CPU backend's (the target is set for it).
      "--disable-blink-features=WebGPU",
    ],
  },
);
const page = context.pages()[0] ?? (await context.newPage());
await page.goto(url);
// The first example is fully shown once its last view (memory) is drawn.
await page.locator(".view.memory").first().waitFor({ timeout: 60000 });
const firstRender = await page.evaluate(() => performance.now());

await page.click('.example[data-id="read-later"]');
await page.locator(".output .label", { hasText: "out" }).waitFor({ timeout: 30000 });
await page.locator("#status", { hasText: "ready" }).waitFor({ timeout: 30000 });
const runs = [];
for (let i = 0; i < 10; i++) {
  runs.push(await page.evaluate(async (i) => {
    const editor = window.kilnEditor;
    const shown = () => document.querySelector(".output pre")?.textContent
      + document.querySelector(".view.memory")?.textContent;
    // The graph is laid out in a worker after the rest is shown (each run
    // draws fresh views): the run counts until every drawing is there too.
    const drawn = () => [...document.querySelectorAll(".graph svg")].every((svg) => svg.hasAttribute("data-drawn"));
    const before = shown();
    const text = editor.text().replace(/array\(\[[^\]]*\]\)/, `array([${i + 1}.5, -1.0, 2.0, 0.0])`);
    editor.view.dispatch({ changes: { from: 0, to: editor.view.state.doc.length, insert: text } });
    const start = performance.now();
    document.querySelector("#editor .cm-content").dispatchEvent(
      new KeyboardEvent("keydown", { key: "Enter", ctrlKey: true, bubbles: true, cancelable: true }));
    while (shown() === before || !drawn()) await new Promise((r) => requestAnimationFrame(r));
    return performance.now() - start;
  }, i));
}
runs.sort((a, b) => a - b);

// The MLP example edited (its hidden activation swapped) until the Kernels
// view lists the new activation's kernel.
await page.click('.example[data-id="mlp"]');
await page.locator(".output .label", { hasText: "row sums" }).waitFor({ timeout: 30000 });
await page.locator(".kernels .kernel").first().waitFor({ timeout: 30000 });
const kernelRuns = [];
for (let i = 0; i < 10; i++) {
  kernelRuns.push(await page.evaluate(async (i) => {
    const editor = window.kilnEditor;
    const [from, to] = i % 2 === 0 ? ["relu", "tanh"] : ["tanh", "relu"];
    const listed = () => [...document.querySelectorAll(".kernels .kernel-op")].map((k) => k.textContent).join(" ");
    const text = editor.text().replace(`.${from}()`, `.${to}()`);
    editor.view.dispatch({ changes: { from: 0, to: editor.view.state.doc.length, insert: text } });
    const start = performance.now();
    document.querySelector("#editor .cm-content").dispatchEvent(
      new KeyboardEvent("keydown", { key: "Enter", ctrlKey: true, bubbles: true, cancelable: true }));
    while (!(listed().includes(to) && !listed().includes(from))) await new Promise((r) => requestAnimationFrame(r));
    return performance.now() - start;
  }, i));
}
kernelRuns.sort((a, b) => a - b);

// A chain of 2,000 ops, unfused: its graph has 2,001 boxes.
const chain = "let f = compile(|x| {\n  let y = x;\n  for i in 0..1000 { y = (y * 1.5).sin(); }\n  y\n}).fusion(false);\nf.run(ones([4]))";
const graphMs = await page.evaluate(async (text) => {
  const editor = window.kilnEditor;
  editor.view.dispatch({ changes: { from: 0, to: editor.view.state.doc.length, insert: text } });
  const start = performance.now();
  document.querySelector("#editor .cm-content").dispatchEvent(
    new KeyboardEvent("keydown", { key: "Enter", ctrlKey: true, bubbles: true, cancelable: true }));
  const drawn = () => /^\d{4,} boxes laid out/.test(document.querySelector("#graph-layout")?.textContent ?? "");
  while (!drawn()) await new Promise((r) => setTimeout(r, 20));
  return performance.now() - start;
}, chain);

await context.close();
console.log(JSON.stringify({
  web_first_render_ms: Math.round(firstRender * 10) / 10,
  web_rerun_ms: Math.round(runs[Math.floor(runs.length / 2)] * 10) / 10,
  web_graph_2000_ms: Math.round(graphMs),
  web_kernels_view_ms: Math.round(kernelRuns[Math.floor(kernelRuns.length / 2)] * 10) / 10,
}));
