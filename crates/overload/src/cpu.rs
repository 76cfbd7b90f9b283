//! CPU accounting of this process's own budget: find the cgroup, read usage, know the allowed cores.
//!
//! Hand-written because no crate reads the *process's own* cgroup the way a shedder needs:
//! go-zero reads the root cgroup (the whole host), and divides a cgroup delta by a host-wide
//! `/proc/stat` delta, which under-reports a pinned container (research §1.2). Here, as in
//! Envoy's CPU monitor, usage is `Δusage / (Δwall · allowed cores)` with no `/proc/stat`.
//!
//! Which source is used ([`CpuReader::detect`]):
//! 1. cgroup v2, when `/proc/self/cgroup` has a `0::PATH` entry, a `cgroup2` mount is found in
//!    `/proc/self/mountinfo`, and PATH is not the root (or the namespace root has a `cpu.max`,
//!    as inside a container with its own cgroup namespace): `cpu.stat` (`usage_usec`,
//!    `throttled_usec`), `cpu.max`, `cpuset.cpus.effective`;
//! 2. cgroup v1, same rule for the `cpuacct` hierarchy: `cpuacct.usage` (ns),
//!    `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `cpuset.cpus`;
//! 3. otherwise (the root cgroup: a VM or bare host) the busy time of the cores this process
//!    may run on (its affinity mask), from `/proc/stat`; `/proc/self/stat` (`utime + stime`)
//!    if that cannot be read.
//!
//! The root cgroup's own usage is skipped on purpose: it is the whole machine, load
//! generator on other cores included, which is what made go-zero shed on someone else's
//! CPU. The busy time of *our* cores is the right signal there instead of our own usage:
//! without a quota, what limits us is what others leave on the cores we may run on (a
//! process sharing its core with a CPU-bound upstream or a noisy neighbour never reaches
//! 100 % of its own, yet cannot get more).
//!
//! Every reader takes a root path, so tests build fake trees (`/proc/self/...`,
//! `/sys/fs/cgroup/...`) in a temp dir for each layout.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;

/// One reading of cumulative CPU usage, taken by [`CpuReader::read`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuTotals {
    /// CPU time used so far by the cgroup (or the process).
    pub usage: Duration,
    /// Time the cgroup was throttled by its CFS quota so far (cgroup v2 only).
    pub throttled: Option<Duration>,
    /// Cores this budget may use: min(cpuset, quota/period, affinity).
    pub cores: f64,
}

/// Which accounting the reader found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSourceKind {
    /// cgroup v2 directory of this process.
    CgroupV2 {
        /// The cgroup directory (under the root given to `detect`).
        dir: PathBuf,
    },
    /// cgroup v1 directories of this process.
    CgroupV1 {
        /// The `cpuacct` directory.
        cpuacct: PathBuf,
        /// The `cpu` directory (CFS quota), if mounted.
        cpu: Option<PathBuf>,
        /// The `cpuset` directory, if mounted.
        cpuset: Option<PathBuf>,
    },
    /// Busy time of the allowed CPUs in `/proc/stat` (user, nice, system, irq, softirq and
    /// steal: time the CPU was not available to us).
    HostCores {
        /// The `/proc/stat` file.
        stat: PathBuf,
        /// Allowed CPU ids.
        cpus: Vec<usize>,
    },
    /// `/proc/self/stat` of this process.
    Proc {
        /// The stat file.
        stat: PathBuf,
    },
    /// Nothing is read: the CPU counts as idle (`cpu_trigger = false`), so the CPU trigger
    /// never fires; the allowed cores are the affinity mask's.
    Off,
}

/// Reads the process's CPU budget usage; one per sampler.
#[derive(Debug)]
pub struct CpuReader {
    kind: CpuSourceKind,
    /// Cores allowed by the scheduler affinity mask (or injected by tests).
    affinity: f64,
    buf: String,
}

/// `/proc/self/stat` times are in USER_HZ, which Linux fixes at 100 on every architecture's ABI.
const USER_HZ: u64 = 100;

impl CpuReader {
    /// Finds this process's CPU accounting under `root` (`/` in production).
    /// `affinity_cores` is how many cores the process may run on (`sched_getaffinity`).
    pub fn detect(root: &Path, affinity_cores: usize) -> Self {
        let cpus: Vec<usize> = (0..affinity_cores.max(1)).collect();
        Self::detect_cpus(root, &cpus)
    }

    /// Like [`detect`](Self::detect), with the allowed CPU ids.
    pub fn detect_cpus(root: &Path, cpus: &[usize]) -> Self {
        let affinity = cpus.len().max(1) as f64;
        let kind = detect_kind(root).unwrap_or_else(|| {
            let stat = root.join("proc/stat");
            let mut buf = String::new();
            let usable = read_into(&stat, &mut buf).is_ok()
                && parse_host_cores(&buf, cpus).is_some_and(|(_, n)| n == cpus.len());
            if usable && !cpus.is_empty() {
                CpuSourceKind::HostCores {
                    stat,
                    cpus: cpus.to_vec(),
                }
            } else {
                CpuSourceKind::Proc {
                    stat: root.join("proc/self/stat"),
                }
            }
        });
        Self {
            kind,
            affinity,
            buf: String::with_capacity(1024),
        }
    }

    /// The production reader: root `/`, allowed CPUs from `sched_getaffinity`.
    pub fn system() -> Self {
        Self::detect_cpus(Path::new("/"), &affinity_cpus())
    }

    /// A reader that reads nothing ([`CpuSourceKind::Off`]): for a gateway whose CPU
    /// trigger is off, on the affinity mask's cores.
    pub fn off() -> Self {
        Self::with_kind(CpuSourceKind::Off, affinity_cpus().len())
    }

    /// A reader of an explicit source (tests, or an operator override).
    pub fn with_kind(kind: CpuSourceKind, affinity_cores: usize) -> Self {
        Self {
            kind,
            affinity: affinity_cores.max(1) as f64,
            buf: String::with_capacity(1024),
        }
    }

    /// What this reader reads.
    pub fn kind(&self) -> &CpuSourceKind {
        &self.kind
    }

    /// Reads cumulative usage and the allowed cores now. Errors are returned, never zeros.
    pub fn read(&mut self) -> Result<CpuTotals, Error> {
        match &self.kind {
            CpuSourceKind::CgroupV2 { dir } => {
                let stat = dir.join("cpu.stat");
                read_into(&stat, &mut self.buf)?;
                let usage = stat_field(&self.buf, "usage_usec").ok_or(Error::Parse {
                    path: stat.clone(),
                    what: "a usage_usec line",
                })?;
                let throttled = stat_field(&self.buf, "throttled_usec");
                let mut cores = self.affinity;
                if let Some(q) = read_optional(&dir.join("cpu.max"), &mut self.buf)?
                    && let Some(limit) = parse_cpu_max(&q)
                {
                    cores = cores.min(limit);
                }
                if let Some(s) = read_optional(&dir.join("cpuset.cpus.effective"), &mut self.buf)?
                    && let Some(n) = count_cpuset(&s)
                {
                    cores = cores.min(n as f64);
                }
                Ok(CpuTotals {
                    usage: Duration::from_micros(usage),
                    throttled: throttled.map(Duration::from_micros),
                    cores,
                })
            }
            CpuSourceKind::CgroupV1 {
                cpuacct,
                cpu,
                cpuset,
            } => {
                let path = cpuacct.join("cpuacct.usage");
                read_into(&path, &mut self.buf)?;
                let ns: u64 = self.buf.trim().parse().map_err(|_| Error::Parse {
                    path: path.clone(),
                    what: "an integer of nanoseconds",
                })?;
                let mut cores = self.affinity;
                if let Some(cpu) = cpu {
                    let quota = read_optional(&cpu.join("cpu.cfs_quota_us"), &mut self.buf)?;
                    let period = read_optional(&cpu.join("cpu.cfs_period_us"), &mut self.buf)?;
                    if let (Some(q), Some(p)) = (quota, period)
                        && let (Ok(q), Ok(p)) = (q.trim().parse::<i64>(), p.trim().parse::<i64>())
                        && q > 0
                        && p > 0
                    {
                        cores = cores.min(q as f64 / p as f64);
                    }
                }
                if let Some(cpuset) = cpuset
                    && let Some(s) = read_optional(&cpuset.join("cpuset.cpus"), &mut self.buf)?
                    && let Some(n) = count_cpuset(&s)
                {
                    cores = cores.min(n as f64);
                }
                Ok(CpuTotals {
                    usage: Duration::from_nanos(ns),
                    throttled: None,
                    cores,
                })
            }
            CpuSourceKind::HostCores { stat, cpus } => {
                read_into(stat, &mut self.buf)?;
                let (ticks, found) = parse_host_cores(&self.buf, cpus).ok_or(Error::Parse {
                    path: stat.clone(),
                    what: "cpuN lines with at least 8 fields",
                })?;
                if found != cpus.len() {
                    return Err(Error::Parse {
                        path: stat.clone(),
                        what: "a line for every allowed CPU",
                    });
                }
                Ok(CpuTotals {
                    usage: Duration::from_millis(ticks * (1000 / USER_HZ)),
                    throttled: None,
                    cores: found as f64,
                })
            }
            CpuSourceKind::Proc { stat } => {
                read_into(stat, &mut self.buf)?;
                let ticks = parse_proc_stat(&self.buf).ok_or(Error::Parse {
                    path: stat.clone(),
                    what: "utime and stime after the command name",
                })?;
                Ok(CpuTotals {
                    usage: Duration::from_millis(ticks * (1000 / USER_HZ)),
                    throttled: None,
                    cores: self.affinity,
                })
            }
            // No usage ever added: every delta, so the smoothed CPU, is 0.
            CpuSourceKind::Off => Ok(CpuTotals {
                usage: Duration::ZERO,
                throttled: None,
                cores: self.affinity,
            }),
        }
    }
}

/// CPU ids in this process's affinity mask (`0..available_parallelism` if unknown).
pub fn affinity_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => {
            let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&i| set.is_set(i))
                .collect();
            if cpus.is_empty() { vec![0] } else { cpus }
        }
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// Cores in this process's affinity mask (at least 1).
pub fn affinity_cores() -> usize {
    rustix::thread::sched_getaffinity(None)
        .map(|set| set.count() as usize)
        .unwrap_or_else(|_| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

fn detect_kind(root: &Path) -> Option<CpuSourceKind> {
    let mut buf = String::new();
    read_into(&root.join("proc/self/cgroup"), &mut buf).ok()?;
    let cgroups = buf.clone();
    read_into(&root.join("proc/self/mountinfo"), &mut buf).ok()?;
    let mounts = parse_mountinfo(&buf);

    // cgroup v2
    if let Some(path) = cgroup_path(&cgroups, None)
        && let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2")
    {
        let dir = cgroup_dir(root, m, path);
        let own = path != "/" || dir.join("cpu.max").exists();
        if own && dir.join("cpu.stat").exists() {
            return Some(CpuSourceKind::CgroupV2 { dir });
        }
    }
    // cgroup v1
    let v1 = |controller: &str| -> Option<(PathBuf, bool)> {
        let path = cgroup_path(&cgroups, Some(controller))?;
        let m = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == controller))?;
        Some((cgroup_dir(root, m, path), path != "/"))
    };
    let (cpuacct, own) = v1("cpuacct")?;
    let cpu = v1("cpu").map(|(d, _)| d);
    let cpuset = v1("cpuset").map(|(d, _)| d);
    let quota_set = cpu.as_ref().is_some_and(|d| {
        std::fs::read_to_string(d.join("cpu.cfs_quota_us"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .is_some_and(|q| q > 0)
    });
    if (own || quota_set) && cpuacct.join("cpuacct.usage").exists() {
        return Some(CpuSourceKind::CgroupV1 {
            cpuacct,
            cpu,
            cpuset,
        });
    }
    None
}

struct Mount {
    root: String,
    point: String,
    fstype: String,
    options: String,
}

fn parse_mountinfo(s: &str) -> Vec<Mount> {
    s.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mut pre = pre.split_whitespace();
            let root = pre.nth(3)?.to_owned();
            let point = pre.next()?.to_owned();
            let mut post = post.split_whitespace();
            let fstype = post.next()?.to_owned();
            let _source = post.next();
            let options = post.next().unwrap_or("").to_owned();
            Some(Mount {
                root,
                point,
                fstype,
                options,
            })
        })
        .collect()
}

/// The cgroup path of `controller` (None: the v2 `0::` entry) in `/proc/self/cgroup`.
fn cgroup_path<'a>(s: &'a str, controller: Option<&str>) -> Option<&'a str> {
    s.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        match controller {
            None => (id == "0" && controllers.is_empty()).then_some(path),
            Some(c) => controllers.split(',').any(|x| x == c).then_some(path),
        }
    })
}

/// The directory of cgroup `path` given the mount `m`, under the fake-able `root`.
fn cgroup_dir(root: &Path, m: &Mount, path: &str) -> PathBuf {
    let rel = if m.root == "/" {
        path
    } else {
        // A bind-mounted sub-tree (a container): the path is relative to the mount's root;
        // if it is not under it (cgroup namespace), the mount point itself is our cgroup.
        path.strip_prefix(m.root.as_str()).unwrap_or("/")
    };
    let mut dir = root.join(m.point.trim_start_matches('/'));
    let rel = rel.trim_start_matches('/');
    if !rel.is_empty() {
        dir.push(rel);
    }
    dir
}

fn read_into(path: &Path, buf: &mut String) -> Result<(), Error> {
    buf.clear();
    File::open(path)
        .and_then(|mut f| f.read_to_string(buf))
        .map(|_| ())
        .map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })
}

/// Reads a file that may legitimately be absent (no quota file, no cpuset controller).
fn read_optional(path: &Path, buf: &mut String) -> Result<Option<String>, Error> {
    match read_into(path, buf) {
        Ok(()) => Ok(Some(buf.clone())),
        Err(Error::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn stat_field(s: &str, key: &str) -> Option<u64> {
    s.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `cpu.max`: "max 100000" (no quota) or "150000 100000" (1.5 cores).
pub(crate) fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next().unwrap_or("100000").parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let quota: f64 = quota.parse().ok()?;
    (quota > 0.0).then_some(quota / period)
}

/// Counts CPUs in a list like "0-3,8,10-11" (None if empty or malformed).
pub(crate) fn count_cpuset(s: &str) -> Option<usize> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut n = 0;
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.trim().parse().ok()?;
                let b: usize = b.trim().parse().ok()?;
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    Some(n)
}

/// Busy ticks (user + nice + system + irq + softirq + steal) summed over the `cpuN` lines of
/// `/proc/stat` whose N is in `cpus`, and how many such lines were found.
fn parse_host_cores(s: &str, cpus: &[usize]) -> Option<(u64, usize)> {
    let mut busy = 0u64;
    let mut found = 0usize;
    for line in s.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let Some(Ok(id)) = fields.next().map(str::parse::<usize>) else {
            continue; // the aggregate "cpu" line
        };
        if !cpus.contains(&id) {
            continue;
        }
        let v: Vec<u64> = fields.take(8).map(|f| f.parse().unwrap_or(0)).collect();
        if v.len() < 8 {
            return None;
        }
        // user nice system idle iowait irq softirq steal
        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        found += 1;
    }
    Some((busy, found))
}

/// utime + stime (fields 14 and 15) of `/proc/self/stat`, in USER_HZ ticks. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted after the last ')'.
fn parse_proc_stat(s: &str) -> Option<u64> {
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // `rest` starts at field 3 (state): utime is field 14, i.e. index 11 here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuset_lists_count_ranges_and_singles() {
        assert_eq!(count_cpuset("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpuset("0"), Some(1));
        assert_eq!(count_cpuset(""), None);
        assert_eq!(count_cpuset("3-1"), None);
    }

    #[test]
    fn cpu_max_reads_quota_over_period() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
    }

    #[test]
    fn proc_stat_survives_a_command_name_with_parens() {
        let s = "42 (a (b) c) R 1 1 1 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(parse_proc_stat(s), Some(300));
    }
}
