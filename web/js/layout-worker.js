// The layout worker's entry, bundled by `cargo xtask web` as `layout.js`:
// answers { id, input } with { id, layout } or { id, error }.
import { layoutGraph } from "./layout.js";

self.onmessage = ({ data }) => {
  try {
    self.postMessage({ id: data.id, layout: layoutGraph(data.input) });
  } catch (error) {
    self.postMessage({ id: data.id, error: String(error && error.stack ? error.message : error) });
  }
};
