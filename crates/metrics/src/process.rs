//! Process metrics (CPU seconds, memory, file descriptors, start time), read from `/proc` by
//! a scrape hook on the exporter thread, never on a serving thread.

use std::path::Path;

use crate::{FloatCounter, FloatGauge, Gauge, MetricsError, Registry};

/// Registers the standard `process_*` families on `registry` and a scrape hook that
/// refreshes them from `/proc/self`. On a system without `/proc` the values stay 0.
pub fn register_process_metrics(registry: &Registry) -> Result<(), MetricsError> {
    let cpu: FloatCounter = registry
        .float_counter(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            &[],
        )?
        .get_or_create(&[])?;
    let rss: Gauge = registry
        .gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            &[],
        )?
        .get_or_create(&[])?;
    let vsize: Gauge = registry
        .gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            &[],
        )?
        .get_or_create(&[])?;
    let fds: Gauge = registry
        .gauge("process_open_fds", "Number of open file descriptors.", &[])?
        .get_or_create(&[])?;
    let max_fds: Gauge = registry
        .gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            &[],
        )?
        .get_or_create(&[])?;
    let start: FloatGauge = registry
        .float_gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            &[],
        )?
        .get_or_create(&[])?;

    let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
    let page = rustix::param::page_size() as i64;
    if let Some(stat) = read_stat(Path::new("/proc/self/stat"))
        && let Some(boot) = boot_time(Path::new("/proc/stat"))
    {
        start.set(boot + stat.start_ticks as f64 / ticks);
    }
    registry.on_scrape(move || {
        if let Some(stat) = read_stat(Path::new("/proc/self/stat")) {
            cpu.set((stat.utime + stat.stime) as f64 / ticks);
            vsize.set(i64::try_from(stat.vsize).unwrap_or(i64::MAX));
            rss.set(stat.rss_pages.saturating_mul(page));
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries: do not count it.
            let open = dir.count().saturating_sub(1);
            fds.set(i64::try_from(open).unwrap_or(i64::MAX));
        }
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let Some(current) = limit.current {
            max_fds.set(i64::try_from(current).unwrap_or(i64::MAX));
        }
    });
    Ok(())
}

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) utime: u64,
    pub(crate) stime: u64,
    pub(crate) start_ticks: u64,
    pub(crate) vsize: u64,
    pub(crate) rss_pages: i64,
}

fn read_stat(path: &Path) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(path).ok()?)
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may contain spaces and parentheses,
/// so fields are counted from the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        utime: field(14)?.parse().ok()?,
        stime: field(15)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
        vsize: field(23)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
    })
}

fn boot_time(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 4 0 12345 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                start_ticks: 12345,
                vsize: 987_654_321,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_has_stat() {
        let stat = read_stat(Path::new("/proc/self/stat")).expect("Linux has /proc/self/stat");
        assert!(stat.rss_pages > 0);
        assert!(boot_time(Path::new("/proc/stat")).expect("btime") > 1_000_000_000.0);
    }
}
