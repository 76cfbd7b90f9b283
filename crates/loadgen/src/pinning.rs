//! Where the load generator's threads run: the cores the calling thread is pinned to and its
//! nice value.

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
