// The Web Worker that owns Kiln: the page's own module, started at its
// worker entry point. The page sends the module it compiled as the first
// message (one compile serves both), with the relaxed-SIMD kernel module
// where the browser runs it (else null); the handler is installed before
// anything is awaited, so that message cannot be missed.
import init, { start_worker, use_relaxed_kernel } from "./kiln_web.js";

self.onmessage = async ({ data: { module, kernel } }) => {
  self.onmessage = null;
  const wasm = await init({ module_or_path: module });
  if (kernel) {
    // The kernel works in this module's memory: Kiln hands it the packed
    // blocks' addresses (`kiln-relaxed-kernel`).
    const { exports } = await WebAssembly.instantiate(kernel, { env: { memory: wasm.memory } });
    globalThis.kilnRelaxedBlockProduct = exports.block_product;
    globalThis.kilnRelaxedAffineCodesDot = exports.affine_codes_dot;
    use_relaxed_kernel();
  }
  start_worker();
};
