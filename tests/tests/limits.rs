//! `kiln::Limits`: the configurable bytes one array and one call may take,
//! and allocations the system refuses. The limits are process-wide, so the
//! tests of this binary hold one lock while they change them.

use kiln::{compile, Array, DType, Error, Limits};
use kiln_tests::isolate::in_child_process;
use std::sync::{Mutex, MutexGuard};

static LIMITS: Mutex<()> = Mutex::new(());

/// Holds the lock and restores the previous limits when dropped.
struct WithLimits {
    previous: Limits,
    _lock: MutexGuard<'static, ()>,
}

fn with_limits(limits: Limits) -> WithLimits {
    let lock = LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    WithLimits {
        previous: Limits::set(limits),
        _lock: lock,
    }
}

impl Drop for WithLimits {
    fn drop(&mut self) {
        Limits::set(self.previous);
    }
}

#[test]
fn the_defaults_are_generous_natively() {
    let _guard = with_limits(Limits::DEFAULT);
    assert_eq!(Limits::current(), Limits::default());
    assert_eq!(Limits::current().max_array_bytes, 16 << 30);
    assert_eq!(Limits::current().max_call_bytes, 64 << 30);
}

#[test]
fn an_array_above_the_array_limit_is_an_error_at_shape_rule_time() {
    let _guard = with_limits(Limits {
        max_array_bytes: 4096,
        ..Limits::DEFAULT
    });
    assert_eq!(Array::zeros(&[1024], DType::F32).dims(), Some(vec![1024]));
    let err = Array::zeros(&[1025], DType::F32).check().unwrap_err();
    assert_eq!(
        err,
        Error::LimitExceeded {
            op: "zeros".into(),
            what: "f32[1025]".into(),
            bytes: 4100,
            limit: 4096,
            scope: "array",
            field: "max_array_bytes",
        }
    );
    // A shape rule's result is checked when the op is built, before any eval.
    let grown = Array::ones(&[64, 1], DType::F32).broadcast_to([64, 64]);
    let err = grown.check().unwrap_err();
    assert_eq!(
        err.to_string(),
        "`broadcast_to`: f32[64,64] needs 16384 bytes, above the limit of 4096 bytes per array; \
         raise `Limits::max_array_bytes` with `kiln::Limits::set`"
    );
}

#[test]
fn a_call_above_the_call_limit_is_an_error_and_caches_nothing() {
    let _guard = with_limits(Limits {
        max_array_bytes: 1 << 20,
        max_call_bytes: 16 << 10,
    });
    // Two 8 KiB intermediates live at once: 16 KiB of slots plus the output.
    let f = compile(|x: Array| {
        let a = x.exp();
        let b = x.sin();
        (a.sum_all(), b.sum_all(), (&a * &b).sum_all())
    })
    .fusion(false);
    let err = f.call(&Array::ones(&[2048], DType::F32)).unwrap_err();
    assert!(
        matches!(&err, Error::LimitExceeded { op, scope: "call", limit, .. } if op == "call" && *limit == 16 << 10),
        "{err}"
    );
    assert!(err.to_string().contains("max_call_bytes"), "{err}");
    assert_eq!(f.cache().entries, 0);
    let small = f.call(&Array::ones(&[16], DType::F32)).unwrap();
    assert!((small.0.item::<f32>().unwrap() - 16.0 * 1f32.exp()).abs() < 1e-3);
}

#[test]
fn an_allocation_the_system_refuses_is_an_error_not_an_abort() {
    in_child_process(
        "an_allocation_the_system_refuses_is_an_error_not_an_abort",
        || {
            let _guard = with_limits(Limits {
                max_array_bytes: usize::MAX,
                max_call_bytes: usize::MAX,
            });
            // 2^50 bytes: more than any 48-bit address space can map.
            let err = Array::zeros(&[1 << 48], DType::F32).check().unwrap_err();
            assert_eq!(
                err,
                Error::Allocation {
                    op: "zeros".into(),
                    bytes: 1 << 50
                }
            );
            let row = Array::ones(&[1 << 24], DType::F32);
            let err = row.broadcast_to([1 << 24, 1 << 24]).eval().unwrap_err();
            assert!(
                matches!(&err, Error::Allocation { op, .. } if op == "broadcast_to"),
                "{err}"
            );
            assert_eq!(row.sum_all().item::<f32>().unwrap(), (1 << 24) as f32);
        },
    );
}
