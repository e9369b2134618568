// The Web Worker that owns Kiln: the page's own module, started at its
// worker entry point. The page sends the module it compiled as the first
// message (one compile serves both); the handler is installed before
// anything is awaited, so that message cannot be missed.
import init, { start_worker } from "./kiln_web.js";

self.onmessage = async ({ data: module }) => {
  self.onmessage = null;
  await init({ module_or_path: module });
  start_worker();
};
