// The Web Worker that owns Kiln: the same module as the page, started at
// its worker entry point.
import init, { start_worker } from "./kiln_web.js";
await init();
start_worker();
