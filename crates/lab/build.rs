//! Stamps the binary with the commit it was built at (`MIDFLIGHT_BUILD_COMMIT`), so a benchmark
//! report can tell when the binaries it ran are not the checkout's (`bench::output`).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=MIDFLIGHT_BUILD_COMMIT={commit}");
    // Run again when HEAD moves: HEAD itself (a checkout), the branch's ref (a commit) and the
    // packed refs. Only files that exist are named: cargo reruns for a missing one every time.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
