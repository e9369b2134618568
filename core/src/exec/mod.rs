//! Executables (ordered steps over values), per-call shape resolution, the
//! [`Backend`] trait and its first implementation, the CPU executor; the
//! default device that eager evaluation runs on.
//!
//! One concern per file: [`executable`] (the graph, its slot plan and
//! shape resolution), [`backend`] (the trait every executor implements),
//! [`cpu`] (the CPU executor), [`kernels`] (what a backend runs, as data)
//! and [`device`] (backends behind an
//! object-safe interface, and the per-thread default).

pub mod backend;
mod control;
pub mod cpu;
pub mod device;
pub mod executable;
pub mod kernels;

pub use backend::{Backend, DownloadFuture};
pub use cpu::CpuBackend;
pub use executable::{Executable, SymbolSource};
pub use kernels::{KernelList, KernelStep, StepBinding, StepKind};
// The thread setting lives in the base layer (the fused CPU loops read it
// too); `kiln::exec::cpu_threads` stays its public path.
pub use crate::threads::{cpu_threads, parse_thread_count, THREADS_VAR};
