//! A DNS responder on 127.0.0.1:0 (UDP) whose answers a test sets and changes: A and AAAA
//! records with a TTL, NXDOMAIN for names it does not know, SERVFAIL or silence on demand.
//!
//! It runs on its own OS thread with a blocking socket, not on the test's runtime: the
//! gateway looks names up while a test's current-thread runtime may be blocked building a
//! snapshot, and an answer must not wait for that runtime.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the responder answers one name.
#[derive(Debug, Clone)]
enum Answer {
    Records { addrs: Vec<IpAddr>, ttl: u32 },
    ServFail,
    Silent,
}

#[derive(Debug, Default)]
struct State {
    answers: HashMap<String, Answer>,
    queries: HashMap<String, usize>,
}

/// A running responder; it stops when dropped.
#[derive(Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Binds 127.0.0.1:0 and answers until dropped.
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the DNS responder");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("set a read timeout");
        let addr = socket.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = Arc::clone(&state);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || serve(&socket, &state, &stop))
        };
        DnsServer {
            addr,
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// The UDP address to use as a name server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("the DNS state lock")
    }

    /// Answers `name` with `addrs` (A and AAAA as they are) and this TTL in seconds.
    pub fn set(&self, name: &str, addrs: &[IpAddr], ttl: u32) {
        self.state().answers.insert(
            key(name),
            Answer::Records {
                addrs: addrs.to_vec(),
                ttl,
            },
        );
    }

    /// Answers `name` with SERVFAIL.
    pub fn fail(&self, name: &str) {
        self.state().answers.insert(key(name), Answer::ServFail);
    }

    /// Does not answer `name` at all (the client times out).
    pub fn silence(&self, name: &str) {
        self.state().answers.insert(key(name), Answer::Silent);
    }

    /// Queries received for `name` (any type).
    pub fn queries(&self, name: &str) -> usize {
        self.state().queries.get(&key(name)).copied().unwrap_or(0)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;

fn serve(socket: &UdpSocket, state: &Mutex<State>, stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Some((name, qtype, question_end)) = parse_query(&buf[..n]) else {
            continue;
        };
        let answer = {
            let mut s = state.lock().expect("the DNS state lock");
            *s.queries.entry(name.clone()).or_default() += 1;
            s.answers.get(&name).cloned()
        };
        let reply = match answer {
            Some(Answer::Silent) => continue,
            Some(Answer::ServFail) => response(&buf[..question_end], 2, &[], 0),
            Some(Answer::Records { addrs, ttl }) => {
                let matching: Vec<IpAddr> = addrs
                    .into_iter()
                    .filter(|a| match qtype {
                        TYPE_A => a.is_ipv4(),
                        TYPE_AAAA => a.is_ipv6(),
                        _ => false,
                    })
                    .collect();
                response(&buf[..question_end], 0, &matching, ttl)
            }
            None => response(&buf[..question_end], 3, &[], 0),
        };
        let _ = socket.send_to(&reply, from);
    }
}

/// The question's name (lowercase, no trailing dot), type, and where the question ends.
fn parse_query(msg: &[u8]) -> Option<(String, u16, usize)> {
    if msg.len() < 12 || u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(msg.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    let end = at + 4;
    (msg.len() >= end).then(|| (labels.join("."), qtype, end))
}

/// A response to `query` (header and question) with `rcode` and these records.
fn response(query: &[u8], rcode: u8, addrs: &[IpAddr], ttl: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(query.len() + addrs.len() * 28);
    out.extend_from_slice(&query[..2]);
    // QR, opcode 0, AA, RD copied; RA; rcode.
    out.push(0x84 | (query[2] & 0x01));
    out.push(0x80 | rcode);
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&u16::try_from(addrs.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&query[12..]);
    for addr in addrs {
        // The question's name, by a pointer to offset 12.
        out.extend_from_slice(&[0xc0, 12]);
        let (kind, data) = match addr {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&data);
    }
    out
}
