// Started by the page after Stop while scripts ran on WebGPU: answers once
// the browser's GPU can be reached again. A stopped run's submitted GPU
// work cannot be cancelled, and until it is done any thread that touches
// WebGPU blocks; this one blocks instead of the worker running scripts.
(async () => {
  try {
    await navigator.gpu.requestAdapter();
  } finally {
    postMessage("free");
  }
})();
