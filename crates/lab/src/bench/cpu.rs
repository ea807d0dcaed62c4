//! CPU time per message, by role, read from `/proc` while a phase runs.
//!
//! A message's cost on this box is split between the consumers, the recovery worker, the two
//! mocks, the lab itself (embedded Kafka and the producer) and, when they run here, the database
//! server and an external Kafka's broker. Each child's CPU time (user + system, `/proc/<pid>/stat`) is read at every sample,
//! so a consumer that leaves mid-phase still counts up to its last sample; the database server
//! is found by its process name when the MariaDB URL names this machine (its time includes
//! every client of the server), and a broker by the listening socket of a bootstrap address
//! on this machine. The box's busy time (`/proc/stat`) covers everything else too:
//! the kernel's interrupt work and any other process. What a phase reports is each total over
//! the measured part divided by the messages finished in it: what a message costs, by role,
//! and so what a rate would need.

use std::collections::HashMap;

use serde::Serialize;

/// Who spends the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Consumers,
    Recovery,
    Mocks,
    Lab,
    Database,
    Broker,
}

impl Role {
    /// The role of a child of the lab, by the name the supervisor gave it.
    pub fn of_child(name: &str) -> Option<Role> {
        if name.starts_with("consumer-") {
            Some(Role::Consumers)
        } else if name.starts_with("recovery-") {
            Some(Role::Recovery)
        } else if name.starts_with("mock-") {
            Some(Role::Mocks)
        } else {
            None
        }
    }
}

/// CPU milliseconds per finished message, by role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuPerMsg {
    pub consumers_ms: f64,
    /// `None` when the system has no recovery worker.
    pub recovery_ms: Option<f64>,
    pub mocks_ms: f64,
    /// The lab process: the embedded Kafka cluster, the producer and the phase's own polling.
    pub lab_ms: f64,
    /// The database server's process, when it runs on this machine.
    pub database_ms: Option<f64>,
    /// An external Kafka's broker processes, when they listen on this machine (the embedded
    /// Kafka's brokers are in `lab_ms`).
    pub broker_ms: Option<f64>,
    /// The whole box's busy time (every core, every process, the kernel).
    pub box_ms: f64,
    /// Share of the box's time that was busy over the measured part, percent.
    pub box_busy_pct: f64,
}

/// One process's CPU time, in clock ticks, from the text of `/proc/<pid>/stat`: `utime` and
/// `stime`, the 14th and 15th fields. The second field (the command name, in parentheses) may
/// hold spaces and parentheses itself, so fields are counted after its last `)`.
pub fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so utime (14) and stime (15) are the 12th and 13th here.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The box's (busy, total) clock ticks over every core, from the text of `/proc/stat`: busy
/// is user, nice, system, irq and softirq; total adds idle and I/O wait. Steal (time a
/// virtual machine's hypervisor gave to others) is in neither; guest time is already inside
/// user time and is not added again.
pub fn box_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line.split_whitespace().skip(1).take(7).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    let &[user, nice, system, idle, iowait, irq, softirq] = values.as_slice() else { return None };
    let busy = user + nice + system + irq + softirq;
    Some((busy, busy + idle + iowait))
}

/// Clock ticks per second of the `/proc` times (`getconf CLK_TCK`; 100 on Linux if that fails).
fn ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .unwrap_or(100.0)
}

/// Whether a MySQL URL names this machine (so its server's process can be read here).
pub fn names_this_machine(url: &str) -> bool {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host_port = after_scheme.split(['/', '?']).next().unwrap_or("");
    let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, h)| h);
    let host = if let Some(bracketed) = host_port.strip_prefix('[') {
        bracketed.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "")
}

/// The pids of the MariaDB or MySQL server processes on this machine.
fn database_pids() -> Vec<u32> {
    pids_where(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| matches!(comm.trim(), "mariadbd" | "mysqld"))
    })
}

/// The pids of this machine's processes (`/proc`) for which `keep` holds.
fn pids_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| keep(*pid))
        .collect()
}

/// The inodes of the TCP sockets listening on `port`, from the text of `/proc/net/tcp` or
/// `/proc/net/tcp6`: the local address's port (hex, after the colon) and state `0A` (LISTEN);
/// the inode is the tenth field.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *fields.get(3)? == "0A").then(|| fields.get(9)?.parse().ok())?
        })
        .collect()
}

/// The pids of the processes listening on the ports of `bootstrap` (`host:port,...`) whose
/// host is this machine: a broker another process runs here.
fn broker_pids(bootstrap: &str) -> Vec<u32> {
    let ports: Vec<u16> = bootstrap
        .split(',')
        .filter(|address| names_this_machine(address.trim()))
        .filter_map(|address| address.trim().rsplit_once(':')?.1.parse().ok())
        .collect();
    let tables: String = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let sockets: Vec<String> = ports
        .iter()
        .flat_map(|port| listening_inodes(&tables, *port))
        .map(|inode| format!("socket:[{inode}]"))
        .collect();
    if sockets.is_empty() {
        return Vec::new();
    }
    pids_where(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(Result::ok).any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|link| sockets.iter().any(|s| link.as_os_str() == s.as_str()))
            })
        })
    })
}

/// Readings taken through a phase. A process is read at every sample while it runs, and the
/// phase reads a consumer right after it starts and right before it is asked to leave, so
/// little of a process that comes or goes is missed; a process that has exited is not read
/// again (its pid may be reused).
#[derive(Debug)]
pub struct CpuMeter {
    ticks_per_s: f64,
    /// Per (role, pid): the first and the latest reading.
    processes: HashMap<(Role, u32), (u64, u64)>,
    database: Vec<u32>,
    broker: Vec<u32>,
    box_first: Option<(u64, u64)>,
    box_last: Option<(u64, u64)>,
}

impl CpuMeter {
    /// A meter that also reads the database server when `mysql_url` names this machine, and
    /// the broker of an external Kafka (`kafka_bootstrap`) that listens here.
    pub fn new(mysql_url: Option<&str>, kafka_bootstrap: Option<&str>) -> CpuMeter {
        let database = if mysql_url.is_some_and(names_this_machine) { database_pids() } else { Vec::new() };
        let broker = kafka_bootstrap.map(broker_pids).unwrap_or_default();
        CpuMeter {
            ticks_per_s: ticks_per_s(),
            processes: HashMap::new(),
            database,
            broker,
            box_first: None,
            box_last: None,
        }
    }

    /// Reads every process given (role and pid), the lab itself, the database server and the box.
    pub fn read(&mut self, children: impl IntoIterator<Item = (Role, u32)>) {
        let lab = (Role::Lab, std::process::id());
        let database = self.database.iter().map(|pid| (Role::Database, *pid));
        let broker = self.broker.iter().map(|pid| (Role::Broker, *pid));
        let all: Vec<(Role, u32)> = children.into_iter().chain([lab]).chain(database).chain(broker).collect();
        for (role, pid) in all {
            let Some(ticks) = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| process_ticks(&s))
            else {
                continue;
            };
            self.note(role, pid, ticks);
        }
        if let Some(reading) = std::fs::read_to_string("/proc/stat").ok().and_then(|s| box_ticks(&s)) {
            self.note_box(reading);
        }
    }

    fn note(&mut self, role: Role, pid: u32, ticks: u64) {
        self.processes.entry((role, pid)).and_modify(|(_, last)| *last = ticks).or_insert((ticks, ticks));
    }

    fn note_box(&mut self, reading: (u64, u64)) {
        self.box_first.get_or_insert(reading);
        self.box_last = Some(reading);
    }

    /// Milliseconds per message over what was read, or `None` without messages or readings.
    pub fn per_msg(&self, messages: usize) -> Option<CpuPerMsg> {
        let (first, last) = (self.box_first?, self.box_last?);
        if messages == 0 || last.1 <= first.1 {
            return None;
        }
        let ms_per_tick = 1_000.0 / self.ticks_per_s;
        let per_msg = |ticks: u64| ticks as f64 * ms_per_tick / messages as f64;
        let role = |wanted: Role| -> u64 {
            self.processes
                .iter()
                .filter(|((role, _), _)| *role == wanted)
                .map(|(_, (first, last))| last.saturating_sub(*first))
                .sum()
        };
        let seen = |wanted: Role| self.processes.keys().any(|(role, _)| *role == wanted);
        let busy = last.0.saturating_sub(first.0);
        Some(CpuPerMsg {
            consumers_ms: per_msg(role(Role::Consumers)),
            recovery_ms: seen(Role::Recovery).then(|| per_msg(role(Role::Recovery))),
            mocks_ms: per_msg(role(Role::Mocks)),
            lab_ms: per_msg(role(Role::Lab)),
            database_ms: (!self.database.is_empty()).then(|| per_msg(role(Role::Database))),
            broker_ms: (!self.broker.is_empty()).then(|| per_msg(role(Role::Broker))),
            box_ms: per_msg(busy),
            box_busy_pct: 100.0 * busy as f64 / (last.1 - first.1) as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ticks_counts_fields_after_the_name() {
        // A name with a space and a parenthesis must not shift the fields.
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 2301 0 0 0 1234 567 0 0 20 0 9 0 81 0 0";
        assert_eq!(process_ticks(stat), Some(1_234 + 567));
        assert_eq!(process_ticks("4242 (cut) S 1 2"), None);
        assert_eq!(process_ticks("no name at all"), None);
    }

    #[test]
    fn box_ticks_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        // user nice system idle iowait irq softirq steal: busy 100+5+50+3+2, total busy+800+40.
        assert_eq!(box_ticks(stat), Some((160, 1_000)));
        // Steal is neither busy nor idle.
        assert_eq!(box_ticks("cpu  100 5 50 800 40 3 2 60 0 0\n"), Some((160, 1_000)));
        assert_eq!(box_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn this_machine_is_the_loopback_or_a_socket() {
        assert!(names_this_machine("mysql://root@127.0.0.1:3306/test"));
        assert!(names_this_machine("mysql://user:pw@localhost/test?ssl-mode=disabled"));
        assert!(names_this_machine("mysql://root@[::1]:3306/test"));
        assert!(names_this_machine("mysql:///test"), "no host: the local socket");
        assert!(!names_this_machine("mysql://root@db.internal:3306/test"));
        assert!(!names_this_machine("mysql://root:p@ss@10.0.0.7/test"));
    }

    #[test]
    fn a_listening_socket_is_found_by_its_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:4A94 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 52731 1 0 100 0 0 10 0\n\
            1: 0100007F:4A94 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 60012 1 0 20 4 30 10 -1\n\
            2: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000   105        0 20944 1 0 100 0 0 10 0\n";
        assert_eq!(listening_inodes(table, 19092), [52731], "the listener, not an established connection");
        assert_eq!(listening_inodes(table, 3306), [20944]);
        assert!(listening_inodes(table, 9092).is_empty());
        assert!(listening_inodes("header only\n", 19092).is_empty());
    }

    #[test]
    fn per_msg_sums_each_process_from_its_first_to_its_last_reading() {
        let mut meter = CpuMeter {
            ticks_per_s: 100.0,
            processes: HashMap::new(),
            database: vec![7],
            broker: Vec::new(),
            box_first: None,
            box_last: None,
        };
        assert_eq!(meter.per_msg(10), None, "nothing read yet");
        meter.note_box((1_000, 10_000));
        meter.note(Role::Consumers, 1, 500);
        meter.note(Role::Consumers, 2, 100);
        meter.note(Role::Database, 7, 50);
        // Consumer 2 leaves after one more reading; a consumer 3 joins later.
        meter.note(Role::Consumers, 2, 130);
        meter.note(Role::Consumers, 3, 40);
        meter.note(Role::Consumers, 1, 560);
        meter.note(Role::Consumers, 3, 60);
        meter.note(Role::Database, 7, 150);
        meter.note_box((1_300, 10_400));
        // 10 ms a tick over 10 messages: consumers 60 + 30 + 20 ticks, database 100, box 300 of 400.
        let got = meter.per_msg(10).expect("readings");
        assert_eq!(got.consumers_ms, 110.0);
        assert_eq!(got.database_ms, Some(100.0));
        assert_eq!(got.recovery_ms, None, "no recovery worker was read");
        assert_eq!(got.broker_ms, None, "no external broker here");
        assert_eq!(got.box_ms, 300.0);
        assert_eq!(got.box_busy_pct, 75.0);
        assert_eq!(meter.per_msg(0), None, "no messages, no rate");
    }
}
