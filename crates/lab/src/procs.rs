//! Child processes the lab starts (upstream, gateway, nginx): each in its own process group,
//! stopped when its guard drops, and all of them stopped on SIGINT/SIGTERM/SIGHUP.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, kill_process_group, waitid};

use crate::LabError;

/// Process groups of every live child, for the signal handler.
static LIVE: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process that is stopped (its whole process group) when this guard drops.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
}

impl ChildGuard {
    /// Spawns `cmd` as the leader of a new process group and registers it for cleanup.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Self, LabError> {
        use std::os::unix::process::CommandExt as _;
        // Its own group: a terminal's Ctrl-C reaches only the lab, whose handler then stops
        // each child deliberately, and a kill of the group takes grandchildren (nginx workers).
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|e| LabError::Child {
            name: name.to_string(),
            why: format!("cannot start {:?}: {e}", cmd.get_program()),
        })?;
        live().push(child.id() as i32);
        Ok(Self {
            name: name.to_string(),
            child,
        })
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Which child this is.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlying process (for its pipes).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// `Some(status)` when the child has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            // Reaped: its PID may be reused at once, so `stop_all` must not signal it.
            let pid = self.child.id() as i32;
            live().retain(|p| *p != pid);
        }
        status
    }

    /// Stops the child's group: SIGTERM, then SIGKILL after `grace`; waits for the leader.
    ///
    /// The leader is reaped only after the last signal to its group: until then it stays a
    /// zombie that holds its PID, so the group id cannot have been reused by an unrelated
    /// process (PIDs wrap within seconds on a busy machine).
    pub fn stop(&mut self, grace: Duration) {
        let pid = self.child.id() as i32;
        if self.leader() == Leader::Reaped {
            // Its PID, and so the group id, may belong to someone else by now: signal nothing.
            live().retain(|p| *p != pid);
            return;
        }
        if !self.leader_exited() {
            signal_group(pid, Signal::TERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && !self.leader_exited() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Grandchildren may outlive a leader that exited on TERM; KILL the group regardless.
        signal_group(pid, Signal::KILL);
        let _ = self.child.wait();
        live().retain(|p| *p != pid);
    }

    /// Whether the leader has exited, without reaping it (`waitid` with `WNOWAIT`). A leader
    /// reaped earlier (through [`ChildGuard::exited`]) counts as exited.
    fn leader_exited(&mut self) -> bool {
        self.leader() != Leader::Running
    }

    /// The leader's state, read without reaping it.
    fn leader(&self) -> Leader {
        let Some(pid) = Pid::from_raw(self.child.id() as i32) else {
            return Leader::Reaped;
        };
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        match waitid(WaitId::Pid(pid), options) {
            Ok(Some(_)) => Leader::Zombie,
            Ok(None) => Leader::Running,
            // ECHILD: already reaped (through `exited()`).
            Err(_) => Leader::Reaped,
        }
    }
}

/// Where a child's leader process is, as far as signalling its group is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leader {
    /// Running: its PID is its group id and is ours.
    Running,
    /// Exited but not reaped: the zombie still holds the PID, the group id is still ours.
    Zombie,
    /// Reaped: the PID may already belong to an unrelated process.
    Reaped,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

fn signal_group(pid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process_group(pid, sig);
    }
}

/// Stops every live child: SIGTERM to each group, then SIGKILL after `grace`.
pub fn stop_all(grace: Duration) {
    let pids: Vec<i32> = live().clone();
    for &pid in &pids {
        signal_group(pid, Signal::TERM);
    }
    std::thread::sleep(grace);
    for &pid in &pids {
        signal_group(pid, Signal::KILL);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: stop every child, then exit with 130. Idempotent.
pub fn install_signal_handler() -> Result<(), LabError> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                result = Err(LabError::Io(e));
                return;
            }
        };
        // Register the handlers on this thread before returning, so a signal that comes right
        // after never takes the default action and leaves children behind.
        let signals = rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
                signal(SignalKind::hangup())?,
            ))
        });
        let (mut int, mut term, mut hup) = match signals {
            Ok(s) => s,
            Err(e) => {
                result = Err(LabError::Io(e));
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("lab-signals".into())
            .spawn(move || {
                rt.block_on(async {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                        _ = hup.recv() => {}
                    }
                });
                eprintln!("lab: interrupted, stopping every child process it started");
                stop_all(Duration::from_millis(500));
                std::process::exit(130);
            });
        if let Err(e) = spawned {
            result = Err(LabError::Io(e));
        }
    });
    result
}

/// Reads the child's stdout until a line starting with `prefix` and returns the rest of it.
pub fn wait_for_line(
    child: &mut ChildGuard,
    prefix: &str,
    timeout: Duration,
) -> Result<String, LabError> {
    let name = child.name().to_string();
    let stdout = child
        .child_mut()
        .stdout
        .take()
        .ok_or_else(|| LabError::Child {
            name: name.clone(),
            why: "stdout is not piped".into(),
        })?;
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix_owned = prefix.to_string();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            if let Some(rest) = line.strip_prefix(&prefix_owned) {
                let _ = tx.send(rest.trim().to_string());
                break;
            }
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    rx.recv_timeout(timeout).map_err(|_| LabError::Child {
        name,
        why: format!("no `{prefix}` line on stdout within {timeout:?}"),
    })
}

/// A command wrapped in `nice -n NICE` and `taskset -c CPUS` when asked for and available.
pub fn pinned_command(
    program: &std::path::Path,
    cpus: &[usize],
    nice: Option<i32>,
) -> (Command, Option<String>) {
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(n) = nice
        && which("nice").is_some()
    {
        argv.extend(["nice".into(), "-n".into(), n.to_string().into()]);
    }
    let mut pinned = None;
    if !cpus.is_empty() && which("taskset").is_some() {
        let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
        let list = list.join(",");
        argv.extend(["taskset".into(), "-c".into(), list.clone().into()]);
        pinned = Some(list);
    }
    argv.push(program.as_os_str().to_owned());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    (cmd, pinned)
}

/// Sets the nice value of the calling process's autogroup (its session) and returns the old
/// one. With `kernel.sched_autogroup_enabled`, CFS first shares the CPU between sessions, so a
/// per-thread nice only orders threads inside this session: on a machine shared with other
/// sessions' builds, the session's own weight is what keeps them from deciding the tail.
pub fn set_autogroup_nice(nice: i32) -> Option<i32> {
    let path = "/proc/self/autogroup";
    let old = std::fs::read_to_string(path).ok()?;
    let old: i32 = old.rsplit("nice").next()?.trim().parse().ok()?;
    std::fs::write(path, nice.to_string()).ok()?;
    Some(old)
}

/// The path of `name` on `$PATH`.
pub fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Stdio for a child whose output goes to `file`.
pub fn to_file(file: &std::path::Path) -> Result<Stdio, LabError> {
    Ok(Stdio::from(std::fs::File::create(file)?))
}

/// A process's CPU time so far (utime + stime from `/proc/PID/stat`, all its threads), as
/// `lab/compare-builds.sh` reads it; `None` when it cannot be read.
pub fn process_cpu(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second();
    Some(std::time::Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / per_second.max(1),
    ))
}
