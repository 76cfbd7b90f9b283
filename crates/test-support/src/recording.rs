//! An HTTP/1.1 upstream that records every byte each connection brings, and answers each
//! complete request `200 ok`: a test can prove what reached an upstream, down to a request
//! that never completed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One complete request as it arrived: the head byte for byte, the body decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Request line and field lines, through the empty line.
    pub head: Vec<u8>,
    /// The body, de-chunked if it was chunked.
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The request line (`POST /x HTTP/1.1`).
    pub fn line(&self) -> String {
        let text = String::from_utf8_lossy(&self.head);
        text.lines().next().unwrap_or("").to_owned()
    }

    /// Every value of the fields named `name` (case-insensitive), trimmed.
    pub fn header_values(&self, name: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.head)
            .split("\r\n")
            .skip(1)
            .filter_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .collect()
    }
}

/// What one upstream connection received.
#[derive(Debug, Clone, Default)]
pub struct ConnectionLog {
    /// Every byte, in order.
    pub bytes: Vec<u8>,
    /// The complete requests among them (each answered `200`).
    pub requests: Vec<RecordedRequest>,
    /// The gateway closed the connection.
    pub closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    connections: Mutex<Vec<ConnectionLog>>,
    changed: Notify,
}

/// A recording upstream on 127.0.0.1:0; stops accepting when dropped.
#[derive(Debug)]
pub struct RecordingUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingUpstream {
    /// Binds 127.0.0.1:0 and records until dropped.
    pub async fn start() -> RecordingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = {
                    let mut conns = lock(&accepting.connections);
                    conns.push(ConnectionLog::default());
                    conns.len() - 1
                };
                tokio::spawn(record(stream, index, Arc::clone(&accepting)));
            }
        });
        RecordingUpstream { addr, shared, task }
    }

    /// What each connection received so far, in accept order.
    pub fn connections(&self) -> Vec<ConnectionLog> {
        lock(&self.shared.connections).clone()
    }

    /// Waits until `done` holds of the connection logs (checked after each read).
    pub async fn wait_until(&self, done: impl Fn(&[ConnectionLog]) -> bool) {
        loop {
            // Registered before the check, so a change between the two is not missed.
            let changed = self.shared.changed.notified();
            if done(&lock(&self.shared.connections)) {
                return;
            }
            changed.await;
        }
    }

    /// Waits until every connection accepted so far was closed by its peer (say, after the
    /// gateway shut down): then the logs are final.
    pub async fn all_closed(&self) {
        self.wait_until(|conns| conns.iter().all(|c| c.closed))
            .await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn record(mut stream: tokio::net::TcpStream, index: usize, shared: Arc<Shared>) {
    let mut parsed_up_to = 0;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let mut answers = 0;
        {
            let mut conns = lock(&shared.connections);
            let log = &mut conns[index];
            if n == 0 {
                log.closed = true;
            }
            log.bytes.extend_from_slice(&chunk[..n]);
            while let Some((used, request)) = parse_request(&log.bytes[parsed_up_to..]) {
                parsed_up_to += used;
                log.requests.push(request);
                answers += 1;
            }
        }
        shared.changed.notify_waiters();
        if n == 0 {
            return;
        }
        for _ in 0..answers {
            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(ok).await.is_err() {
                break;
            }
        }
    }
}

/// The first complete request in `bytes` and how many bytes it took: the body framed by
/// `transfer-encoding: chunked`, else `content-length`, else none. `None` while incomplete
/// (or unparseable: then it never completes, which is what a test of it wants to see).
pub fn parse_request(bytes: &[u8]) -> Option<(usize, RecordedRequest)> {
    let head_end = find(bytes, b"\r\n\r\n")? + 4;
    let request = RecordedRequest {
        head: bytes[..head_end].to_vec(),
        body: Vec::new(),
    };
    let chunked = request
        .header_values("transfer-encoding")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("chunked"));
    if chunked {
        let (used, body) = dechunk(&bytes[head_end..])?;
        return Some((head_end + used, RecordedRequest { body, ..request }));
    }
    let length = match request.header_values("content-length").first() {
        Some(v) => v.parse::<usize>().ok()?,
        None => 0,
    };
    let body = bytes.get(head_end..head_end + length)?.to_vec();
    Some((head_end + length, RecordedRequest { body, ..request }))
}

/// A complete chunked body at the start of `bytes`: bytes used, data.
fn dechunk(bytes: &[u8]) -> Option<(usize, Vec<u8>)> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let line_end = at + find(&bytes[at..], b"\r\n")?;
        let line = std::str::from_utf8(&bytes[at..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailer section, up to its empty line.
            loop {
                let end = at + find(&bytes[at..], b"\r\n")?;
                let empty = end == at;
                at = end + 2;
                if empty {
                    return Some((at, body));
                }
            }
        }
        body.extend_from_slice(bytes.get(at..at + size)?);
        at += size;
        if bytes.get(at..at + 2)? != b"\r\n" {
            return None;
        }
        at += 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_length_chunked_and_not_before_they_are_complete() {
        let by_length = b"POST /a HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET";
        let (used, r) = parse_request(by_length).expect("complete");
        assert_eq!(
            (used, r.body.as_slice()),
            (by_length.len() - 3, &b"abc"[..])
        );
        assert_eq!(r.line(), "POST /a HTTP/1.1");
        assert_eq!(r.header_values("Content-Length"), ["3"]);
        assert!(parse_request(&by_length[..by_length.len() - 4]).is_none());

        let chunked = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1;x\r\nc\r\n0\r\nt: 1\r\n\r\n";
        let (used, r) = parse_request(chunked).expect("complete");
        assert_eq!((used, r.body.as_slice()), (chunked.len(), &b"abc"[..]));
        assert!(parse_request(&chunked[..chunked.len() - 2]).is_none());
    }
}
