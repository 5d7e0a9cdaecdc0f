//! CPU time and peak memory of the processes a bench measures, read from `/proc` (Linux;
//! elsewhere none is measured): this one and, on the same machine, every `nats-server` and FlowMesh service
//! process, or the processes of a dev stack.

use std::collections::BTreeMap;
use std::path::Path;

/// The programs whose processes are measured besides this one.
const PROGRAMS: [&str; 5] = ["nats-server", "flowmesh-validator", "flowmesh-router", "flowmesh-worker", "flowmesh"];

/// A process to measure: a name for the report (`nats-server 4120`) and its pid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Process {
    pub name: String,
    pub pid: u32,
}

/// This process, named `self_name`.
pub fn this(self_name: &str) -> Process {
    Process { name: self_name.to_owned(), pid: std::process::id() }
}

/// This process, named `self_name`, and every other process of `PROGRAMS` on this machine.
pub fn local_processes(self_name: &str) -> Vec<Process> {
    let me = std::process::id();
    let mut found = vec![this(self_name)];
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        if let Some(program) = program(&entry.path()).filter(|p| PROGRAMS.contains(&p.as_str())) {
            found.push(Process { name: format!("{program} {pid}"), pid });
        }
    }
    found.sort();
    found
}

/// The file name of a process's first argument.
fn program(proc_dir: &Path) -> Option<String> {
    let cmdline = std::fs::read(proc_dir.join("cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next()?;
    let name = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?.to_str()?;
    Some(name.to_owned())
}

/// User plus system CPU time the process has used, in milliseconds.
pub fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat, clock_ticks_per_sec())
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// `utime + stime` of a `/proc/<pid>/stat` line in milliseconds. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(stat: &str, ticks_per_sec: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 * 1000.0 / ticks_per_sec)
}

/// The most resident memory the process has held so far (`VmHWM`), in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    parse_peak_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_peak_rss(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

/// Each process's peak memory so far, by name.
pub fn peak_rss(processes: &[Process]) -> BTreeMap<String, f64> {
    processes.iter().filter_map(|p| Some((p.name.clone(), peak_rss_mib(p.pid)?))).collect()
}

/// CPU readings of several processes at one moment.
#[derive(Debug, Clone, Default)]
pub struct Sample(BTreeMap<Process, f64>);

impl Sample {
    pub fn take(processes: &[Process]) -> Sample {
        Sample(processes.iter().filter_map(|p| Some((p.clone(), cpu_ms(p.pid)?))).collect())
    }

    /// CPU ms each process used since `earlier`, by name; processes gone in between are left out.
    pub fn since(&self, earlier: &Sample) -> BTreeMap<String, f64> {
        self.0.iter().filter_map(|(p, now)| Some((p.name.clone(), now - earlier.0.get(p)?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_read_user_and_system_time() {
        let line = "4120 (nats-server) S 1 4120 4120 0 -1 4194560 2107 0 0 0 250 75 0 0 20 0 9 0 1234 0 0";
        assert_eq!(parse_stat(line, 100.0), Some(3250.0));
        // A name with spaces and a parenthesis does not shift the fields.
        let odd = "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 1 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(odd, 100.0), Some(40.0));
        assert_eq!(parse_stat("7 (short) R 1", 100.0), None);
    }

    #[test]
    fn status_files_read_peak_memory() {
        let status = "Name:\tnats-server\nVmPeak:\t 1300000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40000 kB\n";
        assert_eq!(parse_peak_rss(status), Some(50.0));
        assert_eq!(parse_peak_rss("Name:\tx\n"), None);
        assert!(peak_rss_mib(std::process::id()).is_some_and(|mib| mib > 0.0));
    }

    #[test]
    fn this_process_is_measured() {
        let here = local_processes("bench");
        assert!(here.iter().any(|p| p.name == "bench" && p.pid == std::process::id()), "{here:?}");
        let before = Sample::take(&here);
        let used = Sample::take(&here).since(&before);
        assert!(used.get("bench").is_some_and(|ms| *ms >= 0.0), "{used:?}");
    }
}
