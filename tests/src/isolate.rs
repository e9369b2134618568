//! Runs a test case in a child process, so a case that would abort the
//! process (a failed allocation, a stack overflow) fails its test instead
//! of killing the whole test binary.

use std::process::Command;

/// Names the case a child process runs.
const CASE_VARIABLE: &str = "KILN_ISOLATED_CASE";

/// Runs `case` in a child process of this test binary and asserts that it
/// exits successfully. `test_name` must be the test's full name (as
/// `cargo test -- --exact` takes it): the child re-runs exactly that test,
/// which calls `in_child_process` again and, seeing it is the child, runs
/// `case` itself.
///
/// # Panics
/// In the parent, when the child fails, aborts or cannot be started (with
/// its output); in the child, whatever `case` panics with.
pub fn in_child_process(test_name: &str, case: impl FnOnce()) {
    if std::env::var(CASE_VARIABLE).as_deref() == Ok(test_name) {
        case();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let output = Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE_VARIABLE, test_name)
        .output()
        .expect("the test binary can start itself");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "`{test_name}` failed in its child process ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
    );
    print!("{stdout}");
    assert!(
        stdout.contains("1 passed"),
        "the child process ran no test named `{test_name}`:\n{stdout}"
    );
}
