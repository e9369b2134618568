// Started by the page after Stop while scripts ran on WebGPU: answers once
// the browser's GPU can be reached again. A stopped run's submitted GPU
// work cannot be cancelled: the stopped worker's device is torn down a
// moment after the worker ends, and the teardown waits for that work.
// Meanwhile the first WebGPU call of any thread blocks (a thread's channel
// to the GPU is set up synchronously); later calls on a channel already set
// up do not wait. So one prompt answer proves nothing, since it may have
// come before the teardown began: fresh probes (nested workers, each with a
// new channel) are asked, one after another, until one had to wait, or until
// they have answered promptly for SETTLED_MS.
const WAITED_MS = 100;
const SETTLED_MS = 1500;
const EVERY_MS = 250;

if (self.name === "once") {
  const asked = performance.now();
  navigator.gpu
    .requestAdapter()
    .catch(() => null)
    .finally(() => postMessage(performance.now() - asked));
} else {
  // Milliseconds one fresh probe waited for its answer.
  const ask = () =>
    new Promise((resolve) => {
      const probe = new Worker(location.href, { name: "once" });
      const done = (waited) => {
        probe.terminate();
        resolve(waited);
      };
      probe.onmessage = (event) => done(event.data);
      probe.onerror = () => done(0);
    });
  (async () => {
    const started = performance.now();
    try {
      for (;;) {
        const waited = await ask();
        if (waited > WAITED_MS || performance.now() - started >= SETTLED_MS) break;
        await new Promise((resolve) => setTimeout(resolve, EVERY_MS));
      }
    } finally {
      postMessage("free");
    }
  })();
}
