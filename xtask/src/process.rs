//! Running child processes and locating the workspace.

use std::env;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The workspace root: the parent of xtask's manifest directory.
pub fn workspace_root() -> PathBuf {
    // `cargo run` sets CARGO_MANIFEST_DIR at run time too; the compile-time value is
    // the fallback when the binary is started directly.
    let manifest_dir = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// The directory cargo builds into: `$CARGO_TARGET_DIR` if set, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        // Cargo reads a relative CARGO_TARGET_DIR from the current directory.
        Some(dir) if !dir.is_empty() => env::current_dir()
            .map(|cwd| cwd.join(&dir))
            .unwrap_or_else(|_| PathBuf::from(dir)),
        _ => workspace_root().join("target"),
    }
}

/// The cargo that started us (rustup's proxy resolves it), or `cargo` from PATH.
pub fn cargo() -> Command {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command
}

/// Renders a command line for messages, e.g. `cargo clippy --workspace`.
pub fn display(command: &Command) -> String {
    let program = Path::new(command.get_program())
        .file_name()
        .unwrap_or(command.get_program())
        .to_string_lossy()
        .into_owned();
    command
        .get_args()
        .map(OsStr::to_string_lossy)
        .fold(program, |line, arg| line + " " + &arg)
}

/// Runs `command` with its stdout and stderr on our stderr (stdin closed:
/// CI has none) and fails with the command line and exit status unless it
/// succeeds. xtask's own stdout carries results alone: `cargo xtask bench`
/// prints its JSON document there, which an installer's progress (apt-get
/// prints to stdout) would corrupt.
pub fn run(command: &mut Command) -> Result<(), String> {
    let line = display(command);
    eprintln!("  $ {line}");
    let status = command
        .stdin(Stdio::null())
        .stdout(io::stderr())
        .status()
        .map_err(|err| format!("could not start `{line}`: {err}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed ({status})"))
    }
}

/// Like [`run`] (stdout to our stderr too), but kills the command if it
/// has not finished within `limit` (a download that stalls without a
/// network must not hang CI).
pub fn run_with_timeout(command: &mut Command, limit: Duration) -> Result<(), String> {
    let line = display(command);
    eprintln!("  $ {line}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(io::stderr())
        .spawn()
        .map_err(|err| format!("could not start `{line}`: {err}"))?;
    let started = Instant::now();
    loop {
        let polled = child
            .try_wait()
            .map_err(|err| format!("could not wait for `{line}`: {err}"))?;
        match polled {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(format!("`{line}` failed ({status})")),
            None if started.elapsed() > limit => {
                // Best effort: the child may have exited in the meantime.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{line}` did not finish within {}s",
                    limit.as_secs()
                ));
            }
            None => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs `command` quietly and returns its stdout, or `None` if it failed.
pub fn stdout_of(command: &mut Command) -> Option<String> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}
