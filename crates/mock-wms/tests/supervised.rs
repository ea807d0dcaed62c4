//! A service started by a supervisor with `MIDFLIGHT_PARENT_PID` stops once the supervisor is
//! gone, however it went; the process is the real `mock-wms` binary.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `pid` is still a running process (an exited one not yet reaped counts as gone).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: `pid (comm) S ...`.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn wait_until_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while running(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn service_stops_when_its_supervisor_is_gone() {
    let dir = std::env::temp_dir().join(format!("midflight-supervised-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let db = dir.join("wms.db");
    // A shell stands in for the lab: it starts the service with its own pid, prints the
    // service's pid, and exits when its stdin closes (as a killed lab would, without a word).
    let script = r#"MIDFLIGHT_PARENT_PID=$$ "$0" --set server.listen=127.0.0.1:0 --set "database.url=sqlite://$1?mode=rwc" >/dev/null 2>&1 &
echo $!
read _"#;
    let mut supervisor = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_mock-wms"))
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the supervisor shell");
    let mut line = String::new();
    BufReader::new(supervisor.stdout.take().expect("stdout")).read_line(&mut line).expect("service pid");
    let service: u32 = line.trim().parse().unwrap_or_else(|_| panic!("not a pid: {line:?}"));
    // Still supervised: it keeps running (it has had time to start its watch, and the database).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !db.exists() {
        assert!(running(service), "the service stopped while its supervisor was alive");
        assert!(Instant::now() < deadline, "the service never opened its database");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(running(service), "the service stopped while its supervisor was alive");

    let mut stdin = supervisor.stdin.take().expect("stdin");
    stdin.write_all(b"\n").expect("tell the supervisor to exit");
    drop(stdin);
    assert!(supervisor.wait().expect("supervisor exit").success());
    let gone = wait_until_gone(service, Duration::from_secs(60));
    if !gone {
        Command::new("kill").arg("-KILL").arg(service.to_string()).status().ok();
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(gone, "the service outlived its supervisor by a minute");
}

/// Runs mock-wms with `args` and `env` and asserts bad usage: exit 2, nothing printed on
/// stdout (nothing else was done). Returns stderr.
fn bad_usage(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-wms"))
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("run mock-wms");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing else was done");
    stderr
}

#[test]
fn a_parent_pid_that_is_no_pid_is_refused() {
    let stderr = bad_usage(&["--print-config"], &[("MIDFLIGHT_PARENT_PID", "lab")]);
    assert!(stderr.contains("MIDFLIGHT_PARENT_PID must be the process id"), "{stderr}");
}

#[test]
fn a_log_filter_the_logger_cannot_read_is_bad_usage() {
    let stderr = bad_usage(&["--set", "telemetry.log_filter=info,x=notalevel", "--print-config"], &[]);
    assert!(stderr.contains("telemetry.log_filter"), "{stderr}");
}
