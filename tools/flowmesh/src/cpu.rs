//! CPU time, context switches and peak memory of the processes a bench measures, read from
//! `/proc` (Linux; elsewhere none is measured): this one and, on the same machine, every
//! `nats-server` and FlowMesh service process, or the processes of a dev stack; and how the whole
//! machine's cores spent the run (busy, idle, or taken by the hypervisor), to tell a slow run from
//! a slow machine.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

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

/// How many times the process's threads have left their core so far, waiting (for a read, a
/// lock, a timer: voluntary) or preempted, summed over its threads now alive
/// (`/proc/<pid>/task/*/status`). Each wait ends in a wake-up, so at a steady rate this counts
/// what every message pays alone. There a thread that ends takes its count with it; this
/// process's own count comes from `getrusage`, which keeps those of its threads that ended (a
/// test binary's threads come and go during a run).
pub fn switches(pid: u32) -> Option<u64> {
    if pid == std::process::id() {
        // SAFETY: `usage` is a valid out-parameter for getrusage, zeroed before the call.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return None;
        }
        return Some((usage.ru_nvcsw + usage.ru_nivcsw) as u64);
    }
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for thread in threads.flatten() {
        // A thread may end between the listing and the read: it is left out.
        if let Some(n) = std::fs::read_to_string(thread.path().join("status")).ok().as_deref().and_then(parse_switches)
        {
            total += n;
        }
    }
    Some(total)
}

/// `voluntary_ctxt_switches` plus `nonvoluntary_ctxt_switches` of a `status` file.
fn parse_switches(status: &str) -> Option<u64> {
    let count = |key: &str| -> Option<u64> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.strip_prefix(':')?.trim().parse().ok()
    };
    Some(count("voluntary_ctxt_switches")? + count("nonvoluntary_ctxt_switches")?)
}

/// CPU time and context switches of several processes at one moment.
#[derive(Debug, Clone, Default)]
pub struct Sample(BTreeMap<Process, (f64, Option<u64>)>);

impl Sample {
    pub fn take(processes: &[Process]) -> Sample {
        Sample(processes.iter().filter_map(|p| Some((p.clone(), (cpu_ms(p.pid)?, switches(p.pid))))).collect())
    }

    /// CPU ms each process used since `earlier`, by name; processes gone in between are left out.
    pub fn since(&self, earlier: &Sample) -> BTreeMap<String, f64> {
        self.0.iter().filter_map(|(p, (now, _))| Some((p.name.clone(), now - earlier.0.get(p)?.0))).collect()
    }

    /// Context switches of each process since `earlier`, by name; left out where either reading
    /// has none, and 0 where threads that ended took more than the rest added.
    pub fn switches_since(&self, earlier: &Sample) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter_map(|(p, (_, now))| Some((p.name.clone(), now.as_ref()?.saturating_sub(earlier.0.get(p)?.1?))))
            .collect()
    }
}

/// The machine's idle and stolen CPU time since boot, all cores together, in clock ticks
/// (`/proc/stat`), and when it was read.
#[derive(Debug, Clone, Copy)]
pub struct MachineTicks {
    at: Instant,
    stat: ProcStat,
}

impl MachineTicks {
    /// The reading now; `None` where `/proc/stat` cannot be read (not Linux).
    pub fn take() -> Option<MachineTicks> {
        let stat = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(MachineTicks { at: Instant::now(), stat })
    }

    /// How the cores spent the time from `earlier` (a `take` that may have found nothing) to now.
    pub fn share_since(earlier: Option<MachineTicks>) -> Option<MachineShare> {
        MachineTicks::take()?.since(&earlier?)
    }

    /// How the cores spent the time since `earlier`; `None` when no time passed in between.
    pub fn since(&self, earlier: &MachineTicks) -> Option<MachineShare> {
        let wall = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        share(&earlier.stat, &self.stat, wall * clock_ticks_per_sec())
    }
}

/// The summary line of `/proc/stat` as this module needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    cores: usize,
    idle: u64,
    stolen: u64,
}

/// How the machine's cores spent a run, as shares of all their time (together 1): idle (or
/// waiting for the disk); stolen: a virtual machine's core ready to run while its hypervisor ran
/// something else; busy: the rest, running something (any process, the kernel, interrupts). A
/// run whose cores were stolen from was slowed by its neighbours, not by what it ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MachineShare {
    pub cores: usize,
    pub busy: f64,
    pub idle: f64,
    pub stolen: f64,
}

/// The shares over `ticks_per_core` of wall time. Busy is what idle and stolen leave, not the
/// kernel's own busy counts: those are sampled at its timer tick, and a core that wakes for less
/// than a tick between idle spells (a pipeline at a light load) goes uncounted there. Measured
/// at 500 tasks a second, all the counts added up to 84% of the wall time, while what idle and
/// stolen left (41%) was what the processes' own CPU time said (42%).
fn share(before: &ProcStat, after: &ProcStat, ticks_per_core: f64) -> Option<MachineShare> {
    let all = ticks_per_core * after.cores as f64;
    if all <= 0.0 {
        return None;
    }
    let idle = (after.idle.saturating_sub(before.idle) as f64 / all).min(1.0);
    let stolen = (after.stolen.saturating_sub(before.stolen) as f64 / all).min(1.0 - idle);
    Some(MachineShare { cores: after.cores, busy: 1.0 - idle - stolen, idle, stolen })
}

/// The `cpu` line of `/proc/stat` (user, nice, system, idle, iowait, irq, softirq, steal, …) and
/// the number of `cpuN` lines. Kernels before 2.6.11 have no steal: none is counted.
fn parse_proc_stat(stat: &str) -> Option<ProcStat> {
    let mut lines = stat.lines();
    let all = lines.next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = all.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    if ticks.len() < 4 {
        return None;
    }
    let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
    let cores =
        lines.filter(|l| l.strip_prefix("cpu").is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))).count();
    Some(ProcStat { cores, idle: tick(3) + tick(4), stolen: tick(7) })
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
        let after = Sample::take(&here);
        let used = after.since(&before);
        assert!(used.get("bench").is_some_and(|ms| *ms >= 0.0), "{used:?}");
        assert!(after.switches_since(&before).contains_key("bench"), "{after:?}");
    }

    #[test]
    fn a_thread_that_waits_leaves_its_core() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let path = format!("/proc/self/task/{tid}/status");
        let count = || parse_switches(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let before = count();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(count() > before, "this thread slept and was not switched out");
    }

    #[test]
    fn switches_since_subtracts_each_process_s_count() {
        let (a, b, c) = (
            Process { name: "a".to_owned(), pid: 1 },
            Process { name: "b".to_owned(), pid: 2 },
            Process { name: "c".to_owned(), pid: 3 },
        );
        let earlier = Sample(BTreeMap::from([
            (a.clone(), (0.0, Some(100))),
            (b.clone(), (0.0, Some(50))),
            (c.clone(), (0.0, None)),
        ]));
        let d = Process { name: "d".to_owned(), pid: 4 };
        let later = Sample(BTreeMap::from([
            (a, (1.0, Some(130))),
            (b, (1.0, Some(20))),
            (c, (1.0, Some(9))),
            (d, (1.0, Some(5))),
        ]));
        // b's threads that ended took more than the others added: none, not a wrap-around;
        // c had no count before and d was not there: left out.
        assert_eq!(later.switches_since(&earlier), BTreeMap::from([("a".to_owned(), 30), ("b".to_owned(), 0)]));
    }

    #[test]
    fn status_files_read_context_switches() {
        let status = "Name:\tnats-server\nvoluntary_ctxt_switches:\t1200\nnonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(parse_switches(status), Some(1234));
        assert_eq!(parse_switches("voluntary_ctxt_switches:\t5\n"), None, "half the pair");
        assert_eq!(parse_switches("voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t1\n"), None);
        assert!(switches(std::process::id()).is_some_and(|n| n > 0));
        // Another process's, from its threads' status files.
        assert!(switches(std::os::unix::process::parent_id()).is_some_and(|n| n > 0));
        assert_eq!(switches(u32::MAX), None, "no such process");
    }

    #[test]
    fn the_machine_line_reads_idle_and_stolen_ticks() {
        let stat = "cpu  100 5 40 800 20 3 2 30 7 0\ncpu0 50 2 20 400 10 1 1 15 3 0\ncpu1 50 3 20 400 10 2 1 15 4 0\nintr 1 2\nctxt 99\n";
        assert_eq!(parse_proc_stat(stat), Some(ProcStat { cores: 2, idle: 820, stolen: 30 }));
        // A kernel without the steal column counts none stolen.
        let old = parse_proc_stat("cpu  10 0 5 85 0 0 0\ncpu0 10 0 5 85 0 0 0\n");
        assert_eq!(old, Some(ProcStat { cores: 1, idle: 85, stolen: 0 }));
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4\n"), None, "no summary line");
        assert_eq!(parse_proc_stat("cpu  1 2 x 4\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2\n"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    #[test]
    fn a_run_s_share_of_the_machine_is_idle_and_stolen_over_the_wall_time() {
        let before = ProcStat { cores: 2, idle: 5_000, stolen: 100 };
        // Two cores for 1 s at 100 ticks a second: 200 ticks, 40 of them idle and 10 stolen.
        let after = ProcStat { cores: 2, idle: 5_040, stolen: 110 };
        let s = share(&before, &after, 100.0).unwrap();
        assert_eq!(s.cores, 2);
        assert!((s.idle - 0.20).abs() < 1e-12, "{s:?}");
        assert!((s.stolen - 0.05).abs() < 1e-12, "{s:?}");
        assert!((s.busy - 0.75).abs() < 1e-12, "{s:?}");
        // Counts a little past the wall time (read at slightly different moments) stay shares.
        let s = share(&before, &ProcStat { cores: 2, idle: 5_190, stolen: 120 }, 100.0).unwrap();
        assert_eq!((s.busy, s.idle + s.stolen), (0.0, 1.0), "{s:?}");
        assert!(s.stolen >= 0.0, "{s:?}");
        assert_eq!(share(&before, &after, 0.0), None, "no time passed");
        if let Some(now) = MachineTicks::take() {
            assert!(now.stat.cores >= 1, "{now:?}");
            assert!(MachineTicks::share_since(Some(now)).is_none_or(|s| s.busy + s.idle + s.stolen > 0.99), "{now:?}");
        }
        assert_eq!(MachineTicks::share_since(None), None);
    }
}
