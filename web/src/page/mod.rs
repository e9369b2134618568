//! The wasm32 page: [`worker`] runs scripts in a Web Worker, [`ui`] is the
//! Leptos app on the main thread. Both live in one module; `index.html`
//! calls `start_ui`, `worker.js` calls `start_worker`.

mod diff;
mod editor;
mod graph;
mod kernels;
mod ui;
mod views;
mod worker;
