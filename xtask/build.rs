//! Records the commit the xtask binary is built from, for bench reports made where no git
//! checkout exists (a staged binary on another machine).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=CARTAGE_BUILD_COMMIT={commit}");
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/index"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
