//! Concurrent calls of one compiled function from several threads: each
//! call's result and errors belong to it alone. A call with an index out of
//! range is an `Err`; a call beside it with good indices is correct, even
//! when both share the compiled program (on wgpu: its arena and status
//! words, cleared inside each call's own command encoder).

use kiln::{compile, Array, Backend, CpuBackend};
use std::sync::Arc;

/// Threads calling at once, and calls per thread.
const THREADS: usize = 4;
const CALLS: usize = 1_000;

/// Every thread calls `take` `CALLS` times, every third call with an index
/// out of range; `Err` describes the first call that went wrong.
fn stress<B: Backend + Clone>(backend: B) -> Result<usize, String> {
    let f = Arc::new(compile(|(x, i): (Array, Array)| x.take(&i, 0) * 2.0).with_backend(backend));
    let x =
        Array::from_vec((0..16).map(|v| v as f32).collect(), &[16]).map_err(|e| e.to_string())?;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (f, x) = (f.clone(), x.clone());
            std::thread::spawn(move || -> Result<usize, String> {
                let mut checked = 0;
                for call in 0..CALLS {
                    let bad = (call + t) % 3 == 0;
                    let first = ((call * 7 + t) % 16) as i32;
                    let indices = if bad {
                        vec![first, 40]
                    } else {
                        vec![first, 15 - first]
                    };
                    let i = Array::from_vec(indices, &[2]).map_err(|e| e.to_string())?;
                    let read = f.call(&(x.clone(), i)).and_then(|y| y.to_vec::<f32>());
                    match (bad, read) {
                        (true, Err(e)) if e.to_string().contains("out of range") => {}
                        (true, other) => {
                            return Err(format!(
                                "thread {t} call {call}: a bad index gave {other:?}"
                            ))
                        }
                        (false, Ok(values)) => {
                            let want = vec![2.0 * first as f32, 2.0 * (15 - first) as f32];
                            if values != want {
                                return Err(format!(
                                    "thread {t} call {call}: {values:?}, want {want:?}"
                                ));
                            }
                        }
                        (false, Err(e)) => {
                            return Err(format!("thread {t} call {call}: good indices gave {e}"))
                        }
                    }
                    checked += 1;
                }
                Ok(checked)
            })
        })
        .collect();
    let mut checked = 0;
    for thread in threads {
        checked += thread
            .join()
            .map_err(|_| "a thread panicked".to_string())??;
    }
    Ok(checked)
}

#[test]
fn concurrent_good_and_bad_calls_on_the_cpu_each_get_their_own_result() {
    assert_eq!(stress(CpuBackend), Ok(THREADS * CALLS));
}

#[test]
fn concurrent_good_and_bad_calls_on_wgpu_each_get_their_own_result() {
    let Some(gpu) = kiln_tests::gpu::backend() else {
        return;
    };
    assert_eq!(stress(gpu), Ok(THREADS * CALLS));
}
