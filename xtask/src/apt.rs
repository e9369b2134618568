//! Debian packages a step needs, installed only where missing.

use crate::process;
use std::process::Command;

/// Installs whichever of `packages` is not installed (one `apt-get update`
/// first, `--no-install-recommends`); does nothing when all are.
pub fn ensure_installed(packages: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|package| !installed(package))
        .collect();
    if missing.is_empty() {
        eprintln!("  already installed: {}", packages.join(" "));
        return Ok(());
    }
    eprintln!("  installing {}", missing.join(" "));
    process::run(apt_get().arg("update"))?;
    process::run(
        apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )
}

fn installed(package: &str) -> bool {
    process::stdout_of(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

/// `apt-get`, through `sudo -n` unless we are root.
fn apt_get() -> Command {
    let is_root =
        process::stdout_of(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0");
    let mut command = if is_root {
        Command::new("apt-get")
    } else {
        let mut sudo = Command::new("sudo");
        sudo.args(["-n", "apt-get"]);
        sudo
    };
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}
