//! Where the load generator's threads run: the cores the calling thread is pinned to, its
//! nice value, and the idle policy of the scraper.

use crate::LoadError;

/// Pins the calling thread (and threads it starts later) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), LoadError> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| LoadError::Io(e.into()))
}

/// Sets the calling thread's nice value (on Linux, `setpriority(PRIO_PROCESS, 0)` is per
/// thread); negative values need root.
pub fn nice_current_thread(nice: i32) -> Result<(), LoadError> {
    rustix::process::setpriority_process(None, nice).map_err(|e| LoadError::Io(e.into()))
}

/// Puts the calling thread under `SCHED_IDLE`: it runs only when its core has nothing else to
/// run, and a waking thread of any other policy takes the core from it at once. For the
/// scraper, the stand-in for a Prometheus on another machine: on the generator's cores it
/// must never delay a send or the upstream. At any nice value, a thread the scheduler has
/// picked keeps the core for the rest of its slice (1.4 ms here, or until the next 4 ms tick)
/// before a waking one may run (EEVDF's run-to-parity); that is what delayed the serving
/// thread behind the metrics exporter in issue 26, and reading a 12 MB exposition on the
/// generator's core is the same case. Returns whether the policy is in place, read back.
pub fn idle_current_thread() -> bool {
    use thread_priority::{NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy};
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    // Setting the policy also sets nice 0, which fails in a process at a negative nice
    // without the right to it; the policy read back is what counts.
    let _ = thread_priority::set_thread_priority_and_policy(
        thread_priority::thread_native_id(),
        ThreadPriority::Min,
        idle,
    );
    thread_priority::thread_schedule_policy().is_ok_and(|policy| policy == idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_put_under_sched_idle_reads_it_back() {
        let before = thread_priority::thread_schedule_policy().expect("policy");
        let idle = std::thread::spawn(idle_current_thread)
            .join()
            .expect("the thread ran");
        assert!(idle, "SCHED_IDLE needs no privilege on Linux");
        // Only that thread: the caller keeps its own policy.
        assert_eq!(
            thread_priority::thread_schedule_policy().expect("policy"),
            before
        );
    }
}
