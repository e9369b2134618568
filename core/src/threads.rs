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
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
