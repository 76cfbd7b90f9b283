//! A raw-byte HTTP/1.1 conformance suite (RFC 9112/9110 and the published request-smuggling
//! research), every case judged from both sides: what the client got (statuses, close) and
//! what a recording upstream received, byte for byte, framed by its own strict parser.
//!
//! Each group file is a table of [`Case`]s run concurrently, one gateway and one recording
//! upstream per case (so nothing one case sends can land in another's record); a group's
//! test fails listing every failing case with what happened instead. The upstream's judge
//! reads the forwarded bytes by the strictest reading there is (one `Content-Length` of
//! digits, or `Transfer-Encoding: chunked` alone with canonical chunk lines, CRLF
//! everywhere): anything it cannot frame unambiguously fails the case as "ambiguous message
//! reached the upstream", and bytes left after the last framed message as "left over".

mod chunked;
mod client_address;
mod connect;
mod content_length;
mod early_response;
mod expect;
mod field_syntax;
mod hop_by_hop;
mod host;
mod limits;
mod line_endings;
mod pipelining;
mod slow_clients;
mod target;
mod transfer_encoding;
mod upgrade;
mod version;

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::support::{self, read_more, within};

/// Fields the gateway adds to every forwarded request: left out of the comparison, except
/// the client-address ones in the `client_address` group ([`Case::address_fields`]).
const ADDED: &[&str] = &[
    "x-forwarded-for",
    "x-forwarded-proto",
    "via",
    "x-request-id",
    "forwarded",
    "x-real-ip",
];

/// The added fields no case compares: `via` is constant and `x-request-id` random.
const ADDED_NOT_ADDRESS: &[&str] = &["via", "x-request-id"];

/// How long a client waits for a response it still expects before judging what it has.
const RESPONSE_WAIT: Duration = Duration::from_secs(8);
/// How long a client watches a connection it expects open (or either) after its last
/// expected response: a close or an extra response within this is seen.
const LINGER: Duration = Duration::from_millis(300);
/// How long a client waits for the close of a connection it expects closed.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// After the client is done, how long the upstream gets to receive anything still in
/// flight (a smuggled request is forwarded after the response that hid it).
const SETTLE: Duration = Duration::from_millis(100);

/// The host every case's requests name (the one route catches all).
pub(crate) const HOST: &str = "gw.test";

// ---------------------------------------------------------------------------------------
// Cases.

/// Whether the gateway must close the client's connection after its responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    Closed,
    Open,
    /// Either is right (an early response: close, or read and discard the body).
    Either,
}

/// What the recording upstream answers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    /// After each whole request: `200` with body `ok`.
    Ok,
    /// Right after the head, before reading any body: these bytes, then the upstream
    /// reads the body as usual (recorded whole).
    Early(&'static [u8]),
    /// Right after the head: these bytes, then close without reading the body (recorded
    /// as partial, body empty).
    EarlyClose(&'static [u8]),
    /// After the request: `101` to WebSocket, then echo every byte back.
    Upgrade,
}

/// One request as the recording upstream framed it (or, for an expectation, must).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Req {
    method: String,
    target: String,
    version: String,
    /// Every field, name lowercased, value as received (leading/trailing OWS removed).
    fields: Vec<(String, Vec<u8>)>,
    /// The decoded body (a partial message: the raw bytes that followed the head).
    body: Vec<u8>,
    trailers: Vec<(String, Vec<u8>)>,
    /// The whole message arrived (false: the connection ended or the upstream stopped
    /// reading inside the body).
    complete: bool,
    /// Fields that must be there once, with any value (an expectation's only).
    any: Vec<String>,
}

/// A request the upstream must receive: `method target HTTP/1.1`, no fields yet.
pub(crate) fn req(method: &str, target: &str) -> Req {
    Req {
        method: method.to_string(),
        target: target.to_string(),
        version: "HTTP/1.1".to_string(),
        fields: Vec::new(),
        body: Vec::new(),
        trailers: Vec::new(),
        complete: true,
        any: Vec::new(),
    }
}

/// `method target` with `host: gw.test`: what most cases' requests become upstream.
pub(crate) fn to(method: &str, target: &str) -> Req {
    req(method, target).field("host", HOST)
}

impl Req {
    pub(crate) fn field(mut self, name: &str, value: impl AsRef<[u8]>) -> Req {
        self.fields
            .push((name.to_string(), value.as_ref().to_vec()));
        self
    }

    /// A body with its `content-length`.
    pub(crate) fn sized(self, body: impl AsRef<[u8]>) -> Req {
        let body = body.as_ref();
        self.field("content-length", body.len().to_string())
            .body(body)
    }

    /// A body with `transfer-encoding: chunked`.
    pub(crate) fn chunked(self, body: impl AsRef<[u8]>) -> Req {
        self.field("transfer-encoding", "chunked").body(body)
    }

    pub(crate) fn body(mut self, body: impl AsRef<[u8]>) -> Req {
        self.body = body.as_ref().to_vec();
        self
    }

    pub(crate) fn trailer(mut self, name: &str, value: impl AsRef<[u8]>) -> Req {
        self.trailers
            .push((name.to_string(), value.as_ref().to_vec()));
        self
    }

    /// One `name` field with any value (one the gateway chooses, like an endpoint address).
    pub(crate) fn any(mut self, name: &str) -> Req {
        self.any.push(name.to_string());
        self.field(name, "*")
    }

    /// The message did not arrive whole (cut by the gateway, or not read by the upstream).
    pub(crate) fn partial(mut self) -> Req {
        self.complete = false;
        self
    }

    /// This request as compared: the left-out fields removed, fields in a stable order by
    /// name (RFC 9110 §5.3: only the order of same-named fields is significant).
    fn normalised(&self, leave_out: &[&str]) -> Req {
        let mut r = self.clone();
        r.any.clear();
        r.fields.retain(|(n, _)| !leave_out.contains(&n.as_str()));
        r.fields.sort_by(|a, b| a.0.cmp(&b.0));
        r.trailers.sort_by(|a, b| a.0.cmp(&b.0));
        r
    }
}

impl fmt::Debug for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.method, self.target, self.version)?;
        for (n, v) in &self.fields {
            write!(f, " | {n}: {}", show(v))?;
        }
        write!(f, " || body {}", show(&self.body))?;
        for (n, v) in &self.trailers {
            write!(f, " | trailer {n}: {}", show(v))?;
        }
        if !self.complete {
            f.write_str(" (partial)")?;
        }
        Ok(())
    }
}

/// Bytes as an escaped string, cut at 300 bytes.
fn show(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(300)];
    let mut s = format!("\"{}\"", cut.escape_ascii());
    if bytes.len() > cut.len() {
        s.push_str(&format!("...({} bytes)", bytes.len()));
    }
    s
}

/// One table row: a name, the RFC section or research it comes from, the bytes the client
/// writes, the gateway's config, and what each side must see.
pub(crate) struct Case {
    name: &'static str,
    reference: &'static str,
    /// Writes in order, each after a pause (ms).
    writes: Vec<(u64, Vec<u8>)>,
    config: String,
    answer: Answer,
    /// The response statuses in order (1xx included); any one alternative passes.
    statuses: Vec<Vec<u16>>,
    close: Close,
    /// The requests the upstream must frame, in order; `None`: zero bytes.
    upstream: Option<Vec<Req>>,
    /// Instead of `upstream`: nothing, or only this request's head with its body cut short
    /// (an error found inside a body the gateway was already streaming), nothing after.
    cut: Option<Req>,
    /// After a `101`, the bytes the client must get back through the tunnel.
    tunnel: Option<Vec<u8>>,
    /// Compare the client-address fields too (`client_address` group).
    address_fields: bool,
    /// Fields left out of this case's comparison (either way is right).
    ignoring: Vec<&'static str>,
}

/// A case with no writes yet, expecting one `200`, the connection kept open and nothing
/// upstream: each row says what it expects.
pub(crate) fn case(name: &'static str, reference: &'static str) -> Case {
    Case {
        name,
        reference,
        writes: Vec::new(),
        config: String::new(),
        answer: Answer::Ok,
        statuses: vec![vec![200]],
        close: Close::Open,
        upstream: None,
        cut: None,
        tunnel: None,
        address_fields: false,
        ignoring: Vec::new(),
    }
}

/// A request the gateway must refuse with `status` and a close, the upstream receiving
/// nothing.
pub(crate) fn reject(
    name: &'static str,
    reference: &'static str,
    status: u16,
    bytes: impl AsRef<[u8]>,
) -> Case {
    case(name, reference).send(bytes).status(&[status]).closed()
}

/// A request whose body the gateway must refuse with `400` and a close, the upstream
/// receiving nothing or the head of `head` with its body cut short.
pub(crate) fn reject_body(
    name: &'static str,
    reference: &'static str,
    bytes: impl AsRef<[u8]>,
    head: Req,
) -> Case {
    reject(name, reference, 400, bytes).nothing_or_cut(head)
}

/// A request the gateway must forward as `want`, answering `200` and keeping the
/// connection open.
pub(crate) fn pass(
    name: &'static str,
    reference: &'static str,
    bytes: impl AsRef<[u8]>,
    want: Req,
) -> Case {
    case(name, reference).send(bytes).upstream(vec![want])
}

impl Case {
    pub(crate) fn send(mut self, bytes: impl AsRef<[u8]>) -> Case {
        self.writes.push((0, bytes.as_ref().to_vec()));
        self
    }

    /// Writes `bytes` after a pause of `ms`.
    pub(crate) fn after(mut self, ms: u64, bytes: impl AsRef<[u8]>) -> Case {
        self.writes.push((ms, bytes.as_ref().to_vec()));
        self
    }

    pub(crate) fn config(mut self, toml: &str) -> Case {
        self.config = toml.to_string();
        self
    }

    pub(crate) fn has_config(&self) -> bool {
        !self.config.is_empty()
    }

    pub(crate) fn answer(mut self, answer: Answer) -> Case {
        self.answer = answer;
        self
    }

    pub(crate) fn status(mut self, statuses: &[u16]) -> Case {
        self.statuses = vec![statuses.to_vec()];
        self
    }

    /// Another acceptable status sequence.
    pub(crate) fn or_status(mut self, statuses: &[u16]) -> Case {
        self.statuses.push(statuses.to_vec());
        self
    }

    pub(crate) fn closed(mut self) -> Case {
        self.close = Close::Closed;
        self
    }

    pub(crate) fn either(mut self) -> Case {
        self.close = Close::Either;
        self
    }

    pub(crate) fn upstream(mut self, requests: Vec<Req>) -> Case {
        self.upstream = Some(requests);
        self
    }

    pub(crate) fn nothing_or_cut(mut self, head: Req) -> Case {
        self.cut = Some(head);
        self
    }

    pub(crate) fn tunnel(mut self, echo: impl AsRef<[u8]>) -> Case {
        self.tunnel = Some(echo.as_ref().to_vec());
        self
    }

    /// Leaves `field` out of this case's comparison.
    pub(crate) fn ignoring(mut self, field: &'static str) -> Case {
        self.ignoring.push(field);
        self
    }

    pub(crate) fn address_fields(mut self) -> Case {
        self.address_fields = true;
        self
    }
}

// ---------------------------------------------------------------------------------------
// Running a group.

/// Runs a group's cases concurrently and fails listing every case that failed.
pub(crate) async fn run(group: &str, cases: Vec<Case>) {
    let total = cases.len();
    let mut set = JoinSet::new();
    for case in cases {
        set.spawn(async move {
            let (name, reference) = (case.name, case.reference);
            let problems = match std::panic::AssertUnwindSafe(run_case(case))
                .catch_unwind()
                .await
            {
                Ok(problems) => problems,
                Err(panic) => vec![format!("panicked: {}", panic_text(&*panic))],
            };
            (name, reference, problems)
        });
    }
    let mut failed = Vec::new();
    while let Some(joined) = set.join_next().await {
        let (name, reference, problems) = joined.expect("a case task is never cancelled");
        if !problems.is_empty() {
            failed.push(format!(
                "{name} [{reference}]\n      {}",
                problems.join("\n      ")
            ));
        }
    }
    failed.sort();
    eprintln!(
        "conformance/{group}: {} of {total} cases pass",
        total - failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {total} {group} cases fail:\n  - {}",
        failed.len(),
        failed.join("\n  - ")
    );
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "a panic without a message".to_string()
    }
}

/// One case: its own recording upstream and gateway, the client's exchange, the judgement.
async fn run_case(case: Case) -> Vec<String> {
    let upstream = Recorder::start(case.answer).await;
    let (server, _) = support::start(gateway_config(upstream.addr, &case.config));
    let addr = server.local_addrs()[0];
    let got = within(exchange(addr, &case)).await;
    tokio::time::sleep(SETTLE).await;
    let log = upstream.snapshot();
    // Joining the serving threads blocks: off the runtime's workers.
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .expect("the gateway stops");
    judge_case(&case, &got, &log)
}

/// The gateway's config: one listener, the recorder as the only endpoint of a catch-all
/// route, and the case's TOML. Its top-level keys (the lines before its first table) go
/// first, where TOML reads them as top-level.
fn gateway_config(upstream: SocketAddr, toml: &str) -> tailguard_proxy::Config {
    let split = toml
        .lines()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(toml.lines().count());
    let top: Vec<&str> = toml.lines().take(split).collect();
    let tables: Vec<&str> = toml.lines().skip(split).collect();
    if top.iter().all(|l| l.trim().is_empty()) {
        return support::proxy_to(&[upstream], toml);
    }
    support::config(&format!(
        "{}\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"up\"\n\
         endpoints = [{{ address = \"{upstream}\" }}]\n\n[[routes]]\nid = \"all\"\n\
         upstream = \"up\"\n\n{}\n",
        top.join("\n"),
        tables.join("\n")
    ))
}

/// What the client saw.
#[derive(Debug, Default)]
struct Got {
    statuses: Vec<u16>,
    closed: bool,
    /// Bytes after the last whole response: a tunnel's, or not a response at all.
    rest: Vec<u8>,
}

/// Writes the case's bytes (in a task of their own, so a gateway that answers early or
/// never reads is seen) while reading responses, then watches for the close.
async fn exchange(addr: SocketAddr, case: &Case) -> Got {
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    let (mut rd, mut wr) = stream.into_split();
    let writes = case.writes.clone();
    let writer = tokio::spawn(async move {
        for (pause, bytes) in writes {
            if pause > 0 {
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        // Held, not dropped: dropping the write half would half-close the connection.
        wr
    });
    let want = case.statuses.iter().map(Vec::len).max().unwrap_or(0);
    let mut got = Got::default();
    let mut buf = Vec::new();
    let mut upgraded = false;
    loop {
        while !upgraded {
            match parse_response(&buf) {
                Some((status, len)) => {
                    got.statuses.push(status);
                    buf.drain(..len);
                    upgraded = status == 101;
                }
                None => break,
            }
        }
        let tunnel_done = case.tunnel.as_ref().is_none_or(|t| buf.len() >= t.len());
        let wait = if got.statuses.len() < want || !tunnel_done {
            RESPONSE_WAIT
        } else if case.close == Close::Closed {
            CLOSE_WAIT
        } else {
            LINGER
        };
        match tokio::time::timeout(wait, read_more(&mut rd, &mut buf)).await {
            Ok(true) => {}
            Ok(false) => {
                got.closed = true;
                break;
            }
            Err(_) => break,
        }
    }
    got.rest = buf;
    writer.abort();
    got
}

/// The status and length of the whole response at the front of `buf`, if it is there.
fn parse_response(buf: &[u8]) -> Option<(u16, usize)> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut slots);
    let head = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let status = resp.code?;
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Some((status, head));
    }
    let value = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    if value("transfer-encoding").is_some() {
        let (_, _, used) = frame_chunked(&buf[head..]).ok()??;
        return Some((status, head + used));
    }
    let length: usize = std::str::from_utf8(value("content-length")?)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (buf.len() >= head + length).then_some((status, head + length))
}

/// Compares what both sides saw with what the case demands.
fn judge_case(case: &Case, got: &Got, log: &Log) -> Vec<String> {
    let mut problems = Vec::new();
    if !case.statuses.contains(&got.statuses) {
        problems.push(format!(
            "client got statuses {:?}, want {}",
            got.statuses,
            case.statuses
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    match (case.close, got.closed) {
        (Close::Closed, false) => problems.push("the gateway kept the connection open".into()),
        (Close::Open, true) => problems.push("the gateway closed the connection".into()),
        _ => {}
    }
    match &case.tunnel {
        Some(echo) if got.rest != *echo => problems.push(format!(
            "through the tunnel the client got {}, want {}",
            show(&got.rest),
            show(echo)
        )),
        Some(_) => {}
        None if !got.rest.is_empty() => problems.push(format!(
            "the client got bytes that are not a whole response: {}",
            show(&got.rest)
        )),
        None => {}
    }
    for p in &log.problems {
        problems.push(format!("upstream: {p}"));
    }
    for pending in log.pending.iter().filter(|p| !p.is_empty()) {
        problems.push(format!(
            "upstream: bytes left over after the last framed message: {}",
            show(pending)
        ));
    }
    let mut leave_out = if case.address_fields {
        ADDED_NOT_ADDRESS.to_vec()
    } else {
        ADDED.to_vec()
    };
    leave_out.extend(&case.ignoring);
    let leave_out = leave_out.as_slice();
    match (&case.upstream, &case.cut) {
        (None, Some(head)) if log.received > 0 => {
            let head_only = |r: &Req| Req {
                body: Vec::new(),
                complete: false,
                ..r.normalised(leave_out)
            };
            let cut = matches!(log.requests.as_slice(),
                [r] if !r.complete && head_only(r) == head_only(head));
            if !cut {
                problems.push(format!(
                    "the upstream framed:\n        {}\n      want nothing, or the head of \
                     {head:?} with its body cut short",
                    list(&log.requests)
                ));
            }
        }
        (None, _) if log.received > 0 => problems.push(format!(
            "the upstream received {} bytes, want none: {}",
            log.received,
            show(&log.raw)
        )),
        (None, _) => {}
        (Some(want), _) => {
            let mut seen: Vec<Req> = log
                .requests
                .iter()
                .map(|r| r.normalised(leave_out))
                .collect();
            // A field whose value the gateway chooses: its value is not compared.
            for (s, w) in seen.iter_mut().zip(want) {
                for (name, value) in &mut s.fields {
                    if w.any.contains(name) {
                        *value = b"*".to_vec();
                    }
                }
            }
            let want: Vec<Req> = want.iter().map(|r| r.normalised(leave_out)).collect();
            if seen != want {
                problems.push(format!(
                    "the upstream framed:\n        {}\n      want:\n        {}",
                    list(&seen),
                    list(&want)
                ));
            }
        }
    }
    problems
}

fn list(reqs: &[Req]) -> String {
    if reqs.is_empty() {
        return "(no requests)".to_string();
    }
    reqs.iter()
        .map(|r| format!("{r:?}"))
        .collect::<Vec<_>>()
        .join("\n        ")
}

// ---------------------------------------------------------------------------------------
// The recording upstream.

/// Everything the recording upstream saw, over all its connections.
#[derive(Debug, Default)]
struct Log {
    requests: Vec<Req>,
    /// What its strict reading refused (each fails the case).
    problems: Vec<String>,
    /// Bytes received, all connections.
    received: usize,
    /// The first 64 KiB received, for messages.
    raw: Vec<u8>,
    /// Per connection, the bytes not yet part of a framed message.
    pending: Vec<Vec<u8>>,
}

/// A raw TCP upstream recording every byte, framing requests by [`frame_head`] and
/// [`frame_body`], and answering per its [`Answer`].
struct Recorder {
    addr: SocketAddr,
    log: Arc<Mutex<Log>>,
}

impl Recorder {
    async fn start(answer: Answer) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let log = Arc::new(Mutex::new(Log::default()));
        let shared = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = {
                    let mut log = shared.lock().expect("log");
                    log.pending.push(Vec::new());
                    log.pending.len() - 1
                };
                tokio::spawn(record(stream, answer, Arc::clone(&shared), index));
            }
        });
        Recorder { addr, log }
    }

    fn snapshot(&self) -> Log {
        std::mem::take(&mut *self.log.lock().expect("log"))
    }
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
const SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n";

/// Reads more into `buf`, counting and keeping what arrived; false at EOF.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, log: &Mutex<Log>, index: usize) -> bool {
    let before = buf.len();
    let more = read_more(stream, buf).await;
    let mut log = log.lock().expect("log");
    log.received += buf.len() - before;
    let room = (64 * 1024usize).saturating_sub(log.raw.len());
    let new = &buf[before..];
    log.raw.extend_from_slice(&new[..new.len().min(room)]);
    log.pending[index] = buf.clone();
    more
}

/// One upstream connection: frame, record, answer, until EOF or a problem.
async fn record(mut stream: TcpStream, answer: Answer, log: Arc<Mutex<Log>>, index: usize) {
    let mut buf = Vec::new();
    let problem = |p: String| log.lock().expect("log").problems.push(p);
    loop {
        let (mut req, framing, head_len) = loop {
            match frame_head(&buf) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(e) => return problem(e),
            }
            if !fill(&mut stream, &mut buf, &log, index).await {
                return;
            }
        };
        buf.drain(..head_len);
        match answer {
            Answer::EarlyClose(bytes) => {
                req.complete = false;
                {
                    let mut log = log.lock().expect("log");
                    log.requests.push(req);
                    log.pending[index].clear();
                }
                let _ = stream.write_all(bytes).await;
                return;
            }
            Answer::Early(bytes) if stream.write_all(bytes).await.is_err() => return,
            _ => {}
        }
        let (body, trailers, used) = loop {
            match frame_body(&buf, framing) {
                Ok(Some(body)) => break body,
                Ok(None) => {}
                Err(e) => return problem(e),
            }
            if !fill(&mut stream, &mut buf, &log, index).await {
                // Cut inside the body: recorded as partial with the raw bytes that came.
                req.body = std::mem::take(&mut buf);
                req.complete = false;
                let mut log = log.lock().expect("log");
                log.requests.push(req);
                log.pending[index].clear();
                return;
            }
        };
        req.body = body;
        req.trailers = trailers;
        buf.drain(..used);
        {
            let mut log = log.lock().expect("log");
            log.requests.push(req);
            log.pending[index] = buf.clone();
        }
        let reply = match answer {
            Answer::Ok => OK,
            Answer::Early(_) | Answer::EarlyClose(_) => &[][..],
            Answer::Upgrade => SWITCH,
        };
        if stream.write_all(reply).await.is_err() {
            return;
        }
        if let Answer::Upgrade = answer {
            // The tunnel: echo, and nothing here is a message.
            log.lock().expect("log").pending[index].clear();
            let mut tunnel = std::mem::take(&mut buf);
            loop {
                if !tunnel.is_empty() && stream.write_all(&tunnel).await.is_err() {
                    return;
                }
                tunnel.clear();
                if !read_more(&mut stream, &mut tunnel).await {
                    return;
                }
            }
        }
    }
}

/// How a framed head says its body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFraming {
    None,
    Length(usize),
    Chunked,
}

/// The strict judge, part 1: the request head at the front of `buf` (`None` until it is
/// whole), its body framing, and its length. CRLF only; one `Content-Length` of digits, or
/// `Transfer-Encoding: chunked` alone; no CTL in a value.
fn frame_head(buf: &[u8]) -> Result<Option<(Req, BodyFraming, usize)>, String> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let scan = end.map_or(buf, |e| &buf[..e + 4]);
    check_line_endings(scan, "head")?;
    let Some(end) = end else {
        return Ok(None);
    };
    let head = &buf[..end + 4];
    let mut slots = [httparse::EMPTY_HEADER; 256];
    let mut parsed = httparse::Request::new(&mut slots);
    match parsed.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        other => {
            return Err(format!(
                "ambiguous message reached the upstream: its head does not parse ({other:?}): {}",
                show(head)
            ));
        }
    }
    let mut req = req(
        parsed.method.unwrap_or_default(),
        parsed.path.unwrap_or_default(),
    );
    req.version = format!("HTTP/1.{}", parsed.version.unwrap_or_default());
    let mut lengths = Vec::new();
    let mut codings = Vec::new();
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if h.value
            .iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(format!(
                "a control character in field {name}: {}",
                show(h.value)
            ));
        }
        match name.as_str() {
            "content-length" => lengths.push(h.value.to_vec()),
            "transfer-encoding" => codings.push(h.value.to_vec()),
            _ => {}
        }
        req.fields.push((name, h.value.to_vec()));
    }
    let ambiguous = |why: &str| Err(format!("ambiguous message reached the upstream: {why}"));
    let framing = match (lengths.as_slice(), codings.as_slice()) {
        ([], []) => BodyFraming::None,
        ([_, ..], [_, ..]) => return ambiguous("both Content-Length and Transfer-Encoding"),
        ([n], []) => {
            if n.is_empty() || n.len() > 15 || !n.iter().all(u8::is_ascii_digit) {
                return ambiguous(&format!("Content-Length {}", show(n)));
            }
            let n = std::str::from_utf8(n)
                .expect("digits")
                .parse()
                .expect("15 digits fit");
            BodyFraming::Length(n)
        }
        ([], [te]) if te == b"chunked" => BodyFraming::Chunked,
        ([], [te]) => return ambiguous(&format!("Transfer-Encoding {}", show(te))),
        (l, t) => {
            return ambiguous(&format!(
                "{} Content-Length and {} Transfer-Encoding fields",
                l.len(),
                t.len()
            ));
        }
    };
    Ok(Some((req, framing, head.len())))
}

/// Every LF preceded by CR and every CR followed by LF (a CR at the very end may still
/// get its LF).
fn check_line_endings(bytes: &[u8], what: &str) -> Result<(), String> {
    for (i, &b) in bytes.iter().enumerate() {
        let bare_lf = b == b'\n' && (i == 0 || bytes[i - 1] != b'\r');
        let bare_cr = b == b'\r' && bytes.get(i + 1).is_some_and(|&n| n != b'\n');
        if bare_lf || bare_cr {
            return Err(format!(
                "ambiguous message reached the upstream: a bare {} in the {what}: {}",
                if bare_lf { "LF" } else { "CR" },
                show(bytes)
            ));
        }
    }
    Ok(())
}

/// A decoded body, its trailer fields, and the bytes it took.
type Body = (Vec<u8>, Vec<(String, Vec<u8>)>, usize);

/// The strict judge, part 2: the body at the front of `buf` (`None` until it is whole).
fn frame_body(buf: &[u8], framing: BodyFraming) -> Result<Option<Body>, String> {
    match framing {
        BodyFraming::None => Ok(Some((Vec::new(), Vec::new(), 0))),
        BodyFraming::Length(n) => Ok((buf.len() >= n).then(|| (buf[..n].to_vec(), Vec::new(), n))),
        BodyFraming::Chunked => frame_chunked(buf),
    }
}

/// A chunked body by the canonical form only: `<hex digits>CRLF`, data, CRLF; after the last
/// chunk, trailer field lines and CRLF. Extensions, whitespace, signs, prefixes and bare
/// line ends are refused; so is a framing field in the trailers.
fn frame_chunked(buf: &[u8]) -> Result<Option<Body>, String> {
    let ambiguous = |why: String| Err(format!("ambiguous message reached the upstream: {why}"));
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_len) = buf[at..].iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let line = &buf[at..at + line_len];
        let Some(digits) = line.strip_suffix(b"\r") else {
            return ambiguous(format!(
                "a chunk-size line ending in a bare LF: {}",
                show(line)
            ));
        };
        if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
            return ambiguous(format!("a non-canonical chunk-size line: {}", show(line)));
        }
        let size = usize::from_str_radix(std::str::from_utf8(digits).expect("hex"), 16)
            .expect("15 hex digits fit");
        at += line_len + 1;
        if size == 0 {
            break;
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size;
        if &buf[at..at + 2] != b"\r\n" {
            return ambiguous(format!(
                "chunk data not followed by CRLF: {}",
                show(&buf[at..])
            ));
        }
        at += 2;
    }
    let mut trailers = Vec::new();
    loop {
        let Some(line_len) = buf[at..].iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let line = &buf[at..at + line_len];
        at += line_len + 1;
        let Some(line) = line.strip_suffix(b"\r") else {
            return ambiguous(format!(
                "a trailer line ending in a bare LF: {}",
                show(line)
            ));
        };
        if line.is_empty() {
            return Ok(Some((body, trailers, at)));
        }
        let colon = line.iter().position(|&b| b == b':');
        let Some(colon) = colon.filter(|&c| c > 0 && line[..c].iter().all(|&b| is_tchar(b))) else {
            return ambiguous(format!("an invalid trailer line: {}", show(line)));
        };
        let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
        if name == "content-length" || name == "transfer-encoding" {
            return ambiguous(format!("{name} in a trailer section"));
        }
        let value = line[colon + 1..].trim_ascii();
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return ambiguous(format!("a control character in trailer {name}"));
        }
        trailers.push((name, value.to_vec()));
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Every request in `bytes` by the strict judge, and an error if any is ambiguous or bytes
/// are left after the last whole one: what the recorder applies to each connection.
fn judge(bytes: &[u8]) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some((mut req, framing, head)) = frame_head(&bytes[at..])? else {
            return Err(format!("left over: {}", show(&bytes[at..])));
        };
        let Some((body, trailers, used)) = frame_body(&bytes[at + head..], framing)? else {
            return Err(format!("left over: {}", show(&bytes[at..])));
        };
        req.body = body;
        req.trailers = trailers;
        out.push(req);
        at += head + used;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The harness's own tests.

/// The judge refuses every ambiguous or non-canonical message it is hand-fed, and frames
/// the canonical ones exactly.
#[test]
fn the_judge_refuses_ambiguous_messages() {
    let refused: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5, 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: +5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: Chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n0\r\ncontent-length: 5\r\n\r\n",
        b"GET / HTTP/1.1\nhost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\n folded\r\n\r\n",
        // Whole, then the start of a second message that never completes: left over.
        b"GET / HTTP/1.1\r\nhost: a\r\n\r\nGET /smuggled HTTP/1.1\r\n",
        // A body longer than its length: the rest is no request.
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\n\r\nhello",
    ];
    for bytes in refused {
        assert!(judge(bytes).is_err(), "the judge accepted {}", show(bytes));
    }
    let framed = judge(
        b"POST /a HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhello\
          POST /b HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n\
          3\r\nhel\r\n2\r\nlo\r\n0\r\nx-t: 1\r\n\r\n\
          GET /c HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .expect("canonical messages frame");
    assert_eq!(
        framed,
        vec![
            req("POST", "/a").field("host", "a").sized("hello"),
            req("POST", "/b")
                .field("host", "a")
                .chunked("hello")
                .trailer("x-t", "1"),
            req("GET", "/c").field("host", "a"),
        ]
    );
}

/// The live recorder fails a case for an ambiguous message and for left-over bytes, fed
/// straight to it (no gateway in between).
#[tokio::test]
async fn the_recorder_reports_ambiguous_and_left_over_bytes() {
    within(async {
        let upstream = Recorder::start(Answer::Ok).await;
        let mut c = TcpStream::connect(upstream.addr).await.expect("connect");
        c.write_all(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
            .await
            .expect("write");
        let mut d = TcpStream::connect(upstream.addr).await.expect("connect");
        d.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        while parse_response(&answer).is_none() {
            assert!(read_more(&mut d, &mut answer).await, "the recorder answers");
        }
        tokio::time::sleep(SETTLE).await;
        let log = upstream.snapshot();
        let problems = judge_case(
            &case("self-test", "harness").upstream(vec![req("GET", "/").field("host", "a")]),
            &Got {
                statuses: vec![200],
                ..Got::default()
            },
            &log,
        );
        assert!(
            problems.iter().any(|p| p.contains("ambiguous message reached the upstream")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("left over") && p.contains("smuggled")),
            "{problems:?}"
        );
    })
    .await;
}

/// The issue asks for at least 80 cases.
#[test]
fn the_suite_has_at_least_80_cases() {
    let groups = [
        ("chunked", chunked::cases().len()),
        ("client_address", client_address::cases().len()),
        ("connect", connect::cases().len()),
        ("content_length", content_length::cases().len()),
        ("early_response", early_response::cases().len()),
        ("expect", expect::cases().len()),
        ("field_syntax", field_syntax::cases().len()),
        ("hop_by_hop", hop_by_hop::cases().len()),
        ("host", host::cases().len()),
        ("limits", limits::cases().len()),
        ("line_endings", line_endings::cases().len()),
        ("pipelining", pipelining::cases().len()),
        ("slow_clients", slow_clients::cases().len()),
        ("target", target::cases().len()),
        ("transfer_encoding", transfer_encoding::cases().len()),
        ("upgrade", upgrade::cases().len()),
        ("version", version::cases().len()),
    ];
    for (group, n) in groups {
        eprintln!("{group}: {n}");
    }
    let total: usize = groups.iter().map(|(_, n)| n).sum();
    assert!(total >= 80, "{total} cases");
}
