//! Ports for servers that are stopped and started again on the same port (a killed etcd,
//! an upstream that goes away and comes back): outside the kernel's ephemeral range, and
//! reserved among the test processes, so that nothing takes the port while it is free.
//!
//! A port from `bind(127.0.0.1:0)` is in the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default). Once released, the
//! kernel may give it to any outgoing connection as its local port (the parallel tests
//! open thousands; a connect to the free port itself can even connect to itself), or to
//! another test's `bind(:0)`: a server restarted on it then fails with "address already
//! in use". Ports under that range are never chosen by the kernel, only by an explicit
//! bind; [`free_port`] picks one at random, takes a lock file for it that the other test
//! processes respect (held until this process exits), and checks that it can be bound.

use std::fs::File;
use std::net::TcpListener;
use std::path::Path;
use std::sync::Mutex;

/// The lowest port handed out: above the well-known and most registered service ports.
const LOWEST: u16 = 10_000;

/// Lock files of the ports this process took, kept open (and so locked) until it exits: a
/// test may stop and restart its server on the port at any time while it runs.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A port on 127.0.0.1 that is free now, outside the kernel's ephemeral range and not
/// handed out to any other test process, for a server that binds it itself (etcd) or
/// binds it again after stopping. Only an unrelated program binding that very port
/// explicitly could take it.
pub fn free_port() -> u16 {
    let (low, high) = candidates();
    let dir = std::env::temp_dir().join("tailguard-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock dir");
    let mut seed = std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        std::process::id(),
    ) | 1; // xorshift never leaves 0
    for _ in 0..1000 {
        // xorshift64: only needs to spread the picks of parallel processes.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = low + (seed % u64::from(high - low + 1)) as u16;
        let Some(lock) = lock(&dir.join(port.to_string())) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lock);
            return port;
        }
    }
    panic!("no free port in {low}-{high} after 1000 tries");
}

/// The lock file of a port, locked, or `None` when another process (or another pick of
/// this one: the lock belongs to the open file) holds it.
fn lock(path: &Path) -> Option<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    file.try_lock().is_ok().then_some(file)
}

/// The ports to pick from: from [`LOWEST`] up to the ephemeral range, or above it when
/// the range starts too low to leave room under it.
fn candidates() -> (u16, u16) {
    let (first, last) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((bounds.next()??, bounds.next()??))
        })
        // Linux's default, when /proc is not readable.
        .unwrap_or((32_768, 60_999));
    if first > LOWEST + 1_000 {
        (LOWEST, first - 1)
    } else if last < u16::MAX - 1_000 {
        (last + 1, u16::MAX)
    } else {
        panic!("the ephemeral port range {first}-{last} leaves no room for fixed test ports")
    }
}
