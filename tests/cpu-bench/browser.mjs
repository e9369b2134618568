// The CPU throughput programs in the browser, for `cargo xtask bench`:
// loads kiln_cpu_bench.wasm (the wasm32 build of tests/cpu-bench, with
// simd128) in headless Chromium and times cached calls of each program,
// then the f32 and 4-bit products again on the relaxed-SIMD kernel module
// (kiln_relaxed_kernel.wasm, as the playground loads it where the browser
// runs relaxed SIMD) as `cpu_wasm_relaxed_*`. Usage: node browser.mjs URL;
// prints one JSON object of figures.
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url] = process.argv.slice(2);
const context = await chromium.launchPersistentContext(
  mkdtempSync(join(tmpdir(), "kiln-cpu-bench-")),
  {
    executablePath: process.env.KILN_CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  },
);
const page = context.pages()[0] ?? (await context.newPage());
await page.goto(url);
const measure = async (relaxed) => {
  // The module imports the relaxed kernel's block product; the kernel
  // module is instantiated on the module's memory once that exists.
  const unloaded = () => {
    throw new Error("the relaxed kernel was called before it was loaded");
  };
  let kernel = { block_product: unloaded, affine_codes_dot: unloaded };
  const { instance } = await WebAssembly.instantiateStreaming(fetch("kiln_cpu_bench.wasm"), {
    kiln: {
      relaxed_block_product: (...args) => kernel.block_product(...args),
      relaxed_affine_codes_dot: (...args) => kernel.affine_codes_dot(...args),
    },
  });
  const e = instance.exports;
  if (relaxed) {
    const loaded = await WebAssembly.instantiateStreaming(fetch("kiln_relaxed_kernel.wasm"), {
      env: { memory: e.memory },
    });
    kernel = loaded.instance.exports;
    if (!e.kiln_bench_use_relaxed_kernel()) throw new Error("the relaxed kernel was not taken");
  }
  // Calls first: building the names may grow (and so detach) the memory.
  const [at, len] = [e.kiln_bench_names(), e.kiln_bench_names_len()];
  const names = new TextDecoder().decode(new Uint8Array(e.memory.buffer, at, len)).split(",");
  const elements = 256 * 256;
  // Milliseconds of one call: batches of calls long enough for the
  // browser's coarse clock, and the fastest of them. The browser has no
  // per-thread CPU clock, and on a shared machine other processes only
  // ever make a batch slower, so the fastest is the least disturbed.
  const perCall = (program, length) => {
    if (!e.kiln_bench_prepare(program, length)) throw new Error(`program ${program} failed`);
    // Enough calls that even an undisturbed batch takes 10 ms: the least
    // of three trials decides, since a disturbed one only looks longer.
    const batch = (calls) => {
      const start = performance.now();
      e.kiln_bench_run(calls);
      return performance.now() - start;
    };
    let calls = 1;
    while (calls < 1 << 16 && Math.min(batch(calls), batch(calls), batch(calls)) < 10) calls *= 2;
    let fastest = Infinity;
    for (let i = 0; i < 30; i++) {
      const start = performance.now();
      if (!e.kiln_bench_run(calls)) throw new Error(`program ${program} failed`);
      fastest = Math.min(fastest, (performance.now() - start) / calls);
    }
    return fastest;
  };
  const out = {};
  // On the relaxed kernel only what it runs: the f32 products and the
  // quantized ones.
  const prefix = relaxed ? "cpu_wasm_relaxed_" : "cpu_wasm_";
  if (!relaxed) {
    names.forEach((name, k) => {
      out[`cpu_wasm_unary_${name}_ns`] = (perCall(k, 0) * 1e6) / elements;
    });
    for (const n of [10, 100, 1000]) out[`cpu_wasm_chain_${n}`] = perCall(100, n);
    out.cpu_wasm_scalar_chain_100 = perCall(101, 100);
  }
  // Square f32 products, one thread (the browser module has one).
  for (const n of [256, 1024]) out[`${prefix}matmul_f32_${n}_gflops`] = (2 * n ** 3) / (perCall(102, n) * 1e6);
  // x @ wᵀ of a 4096×4096 weight, 4-bit and dense f32, in µs (the dense
  // m = 1 takes no kernel of the relaxed module; the 4-bit one its row
  // dot, m = 64 its block product on decoded panels).
  for (const m of [1, 64]) {
    out[`${prefix}qmm_4bit_4096x4096_m${m}_us`] = perCall(103, m) * 1e3;
    if (!relaxed || m > 1) out[`${prefix}dense_matmul_4096x4096_m${m}_us`] = perCall(104, m) * 1e3;
  }
  return out;
};
const figures = {
  ...(await page.evaluate(measure, false)),
  ...(await page.evaluate(measure, true)),
};
await context.close();
console.log(JSON.stringify(figures));
