//! Where the load generator's threads run: the cores the calling thread is pinned to and its
//! nice value.

use crate::LabError;

/// Pins the calling thread (and threads it starts later) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), LabError> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| LabError::Io(e.into()))
}

/// Sets the calling thread's nice value (on Linux, `setpriority(PRIO_PROCESS, 0)` is per
/// thread); negative values need root.
pub fn nice_current_thread(nice: i32) -> Result<(), LabError> {
    rustix::process::setpriority_process(None, nice).map_err(|e| LabError::Io(e.into()))
}
