//! How many threads the CPU loops split work across: a process-wide
//! setting read once, in the base layer so that op families (the fused CPU
//! loops) and the CPU executor read it without importing the executor.

use crate::error::{Error, Result};

/// The environment variable that sets how many threads the CPU executor
/// splits work across.
pub const THREADS_VAR: &str = "KILN_THREADS";

/// How many threads the CPU executor splits work across: [`THREADS_VAR`]
/// (`KILN_THREADS`) when it holds a positive integer, otherwise every core
/// the process may use. Read once per process, at the first split; a value
/// that is not a positive integer is reported on stderr and ignored.
/// wasm32 always runs on one thread.
///
/// ```
/// assert!(kiln::exec::cpu_threads() >= 1);
/// ```
pub fn cpu_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
        match std::env::var(THREADS_VAR) {
            Err(_) => cores(),
            Ok(value) => parse_thread_count(&value).unwrap_or_else(|err| {
                let cores = cores();
                eprintln!("kiln: {err}; using all {cores} cores");
                cores
            }),
        }
    })
}

/// A thread count as [`THREADS_VAR`] spells it: a positive integer
/// (surrounding spaces allowed).
pub fn parse_thread_count(value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::InvalidArgument {
            op: THREADS_VAR.into(),
            detail: format!("expects a positive number of threads, got `{value}`"),
            at: None,
        }),
    }
}

/// Runs `task(i)` for every `i` in `0..count`, on the calling thread and
/// on up to [`cpu_threads`]` − 1` helper threads that live for the whole
/// process, and returns when every task has run.
///
/// Tasks are claimed one at a time from a shared counter, so the calling
/// thread never waits for a helper that has not started: when the other
/// cores are busy (or the helpers are serving another caller) it runs the
/// tasks itself, and waits at most for the tasks a helper already claimed.
/// A split into a fixed share per thread would instead wait for the slowest
/// thread's whole share, which made two threads slower than one on a
/// loaded machine. Which thread runs a task never changes what it
/// computes, so results do not depend on the scheduling. A panic in a task
/// is raised again on the calling thread once every claimed task is done.
/// wasm32 runs every task on the calling thread.
pub(crate) fn for_each_task(count: usize, task: impl Fn(usize) + Sync) {
    #[cfg(not(target_arch = "wasm32"))]
    if count > 1 && cpu_threads() > 1 {
        return pool::run(count, &task);
    }
    (0..count).for_each(task);
}

#[cfg(not(target_arch = "wasm32"))]
mod pool {
    use crate::threads::cpu_threads;
    use std::any::Any;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

    /// One call of [`super::for_each_task`]: its tasks and what became of
    /// them. It lives on the caller's stack; helpers reach it only while
    /// it is posted in [`State::job`] or while they count in
    /// [`State::working`], and the caller waits for both to end before it
    /// returns.
    struct Job<'t> {
        task: &'t (dyn Fn(usize) + Sync),
        count: usize,
        next: AtomicUsize,
        panic: Mutex<Option<Box<dyn Any + Send>>>,
    }

    impl Job<'_> {
        /// Claims and runs tasks until none is left.
        fn work(&self) {
            loop {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                if i >= self.count {
                    return;
                }
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.task)(i))) {
                    // Stop handing out tasks; keep the first panic.
                    self.next.store(self.count, Ordering::Relaxed);
                    lock(&self.panic).get_or_insert(payload);
                }
            }
        }
    }

    /// A pointer to the posted job, sent to the helpers.
    #[derive(Clone, Copy)]
    struct Posted(*const Job<'static>);

    // SAFETY: a `Job` is `Sync` (atomics, a mutex, a `Sync` task), and the
    // protocol in `run` keeps it alive while any helper holds the pointer.
    unsafe impl Send for Posted {}

    #[derive(Default)]
    struct State {
        /// The job helpers may join, if any.
        job: Option<Posted>,
        /// Bumped at every post, so a helper joins each job at most once.
        generation: u64,
        /// Helpers inside the current job.
        working: usize,
    }

    struct Pool {
        state: Mutex<State>,
        /// Signalled when a job is posted.
        posted: Condvar,
        /// Signalled when the last helper leaves a job.
        left: Condvar,
    }

    /// Locks `mutex`, ignoring poisoning: every critical section here
    /// leaves its data consistent (tasks run outside the locks).
    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The process's pool, its helpers started at the first use.
    fn pool() -> &'static Pool {
        static POOL: OnceLock<&'static Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let pool: &'static Pool = Box::leak(Box::new(Pool {
                state: Mutex::new(State::default()),
                posted: Condvar::new(),
                left: Condvar::new(),
            }));
            for k in 1..cpu_threads() {
                let spawned = std::thread::Builder::new()
                    .name(format!("kiln-helper-{k}"))
                    .spawn(move || helper(pool));
                // Without a helper the callers run their tasks themselves.
                if spawned.is_err() {
                    break;
                }
            }
            pool
        })
    }

    fn helper(pool: &'static Pool) {
        let mut seen = 0;
        let mut state = lock(&pool.state);
        loop {
            let job = match state.job {
                Some(job) if state.generation != seen => job,
                _ => {
                    state = pool
                        .posted
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    continue;
                }
            };
            seen = state.generation;
            state.working += 1;
            drop(state);
            // SAFETY: the job was posted and this helper counts in
            // `working`, so its caller has not returned (see `run`).
            unsafe { &*job.0 }.work();
            state = lock(&pool.state);
            state.working -= 1;
            if state.working == 0 {
                pool.left.notify_all();
            }
        }
    }

    pub(super) fn run(count: usize, task: &(dyn Fn(usize) + Sync)) {
        let pool = pool();
        let job = Job {
            task,
            count,
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        let posted = {
            let mut state = lock(&pool.state);
            // One job at a time: a caller that finds the helpers taken
            // runs its tasks itself.
            let free = state.job.is_none() && state.working == 0;
            if free {
                let erased: *const Job<'_> = &job;
                state.job = Some(Posted(erased.cast()));
                state.generation += 1;
                pool.posted.notify_all();
            }
            free
        };
        job.work();
        if posted {
            let mut state = lock(&pool.state);
            // No helper joins after this; wait for those inside to leave.
            state.job = None;
            while state.working > 0 {
                state = pool
                    .left
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        let panic = lock(&job.panic).take();
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_task_runs_once() {
        let runs: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for_each_task(runs.len(), |i| {
            runs[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn concurrent_callers_each_run_all_their_tasks() {
        let sums: Vec<usize> = std::thread::scope(|scope| {
            let callers: Vec<_> = (0..4)
                .map(|c| {
                    scope.spawn(move || {
                        let sum = AtomicUsize::new(0);
                        for _ in 0..50 {
                            for_each_task(64, |i| {
                                sum.fetch_add(i * c, Ordering::Relaxed);
                            });
                        }
                        sum.into_inner()
                    })
                })
                .collect();
            callers.into_iter().map(|c| c.join().unwrap()).collect()
        });
        for (c, sum) in sums.into_iter().enumerate() {
            assert_eq!(sum, 50 * c * (63 * 64 / 2));
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller() {
        let ran = AtomicUsize::new(0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each_task(100, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 7 {
                    panic!("task {i} fails");
                }
            })
        }));
        let payload = result.unwrap_err();
        assert_eq!(
            payload.downcast_ref::<String>().map(String::as_str),
            Some("task 7 fails")
        );
        // The pool still serves the next caller.
        let count = AtomicUsize::new(0);
        for_each_task(10, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.into_inner(), 10);
        assert!(ran.into_inner() >= 8);
    }

    #[test]
    fn thread_counts_are_positive_integers() {
        assert_eq!(parse_thread_count("1"), Ok(1));
        assert_eq!(parse_thread_count(" 12 "), Ok(12));
        for bad in ["0", "-2", "two", "", "1.5"] {
            let err = parse_thread_count(bad).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("KILN_THREADS") && text.contains(&format!("`{bad}`")),
                "{text}"
            );
        }
    }
}
