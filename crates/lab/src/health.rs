//! The `/healthz` prober that runs beside an overload scenario's load: a probe on a new
//! connection every [`HEALTH_EVERY`], answered when a `200` comes within [`HEALTH_TIMEOUT`].

use std::time::Duration;

/// `GET /healthz` probes sent to the target while the load ran: each on a new connection,
/// every [`HEALTH_EVERY`], answered when a `200` came within [`HEALTH_TIMEOUT`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Health {
    /// Probes sent.
    pub sent: u64,
    /// Probes answered `200` in time.
    pub ok: u64,
    /// Slowest answered probe, microseconds.
    pub max_us: u64,
}

impl Health {
    pub(crate) fn add(&mut self, other: Health) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.max_us = self.max_us.max(other.max_us);
    }
}

/// How often the health prober asks (a Kubernetes readiness probe asks every few seconds;
/// this is denser, so a stall shows).
pub const HEALTH_EVERY: Duration = Duration::from_millis(100);
/// A probe not answered within this counts as failed (kubelet's default timeout is 1 s).
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Probes `GET /healthz` on `addr` every [`HEALTH_EVERY`] until `stop` is set.
pub(crate) fn probe_health(
    addr: std::net::SocketAddr,
    stop: &std::sync::atomic::AtomicBool,
) -> Health {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let mut health = Health::default();
    while !stop.load(Ordering::Relaxed) {
        let started = std::time::Instant::now();
        health.sent += 1;
        let answered = std::net::TcpStream::connect_timeout(&addr, HEALTH_TIMEOUT)
            .and_then(|mut s| {
                s.set_read_timeout(Some(HEALTH_TIMEOUT))?;
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
                let mut head = [0u8; 12];
                s.read_exact(&mut head)?;
                Ok(head.starts_with(b"HTTP/1.1 200"))
            })
            .unwrap_or(false);
        let took = started.elapsed();
        if answered && took <= HEALTH_TIMEOUT {
            health.ok += 1;
            health.max_us = health.max_us.max(took.as_micros() as u64);
        }
        std::thread::sleep(HEALTH_EVERY.saturating_sub(took));
    }
    health
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::probe_health;

    /// A listener on 127.0.0.1:0 that answers each connection with `status` (or never).
    fn server(status: Option<&'static str>) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf);
                match status {
                    Some(s) => {
                        let _ = write!(conn, "HTTP/1.1 {s}\r\ncontent-length: 0\r\n\r\n");
                    }
                    None => held.push(conn), // accepted, never answered
                }
            }
        });
        addr
    }

    fn probe_for(addr: std::net::SocketAddr, run: Duration) -> super::Health {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let prober = s.spawn(|| probe_health(addr, &stop));
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            prober.join().unwrap()
        })
    }

    #[test]
    fn health_probes_count_answered_200s_only() {
        let ok = probe_for(server(Some("200 OK")), Duration::from_millis(350));
        assert!(ok.sent >= 3, "{ok:?}");
        assert_eq!(ok.ok, ok.sent);
        let refused = probe_for(
            server(Some("503 Service Unavailable")),
            Duration::from_millis(250),
        );
        assert!(refused.sent >= 2 && refused.ok == 0, "{refused:?}");
    }

    #[test]
    fn a_health_probe_that_gets_no_answer_fails_after_the_timeout() {
        let silent = probe_for(server(None), Duration::from_millis(50));
        assert_eq!((silent.sent, silent.ok), (1, 0));
    }
}
