//! Any byte stream from a client, through the real downstream server and the real upstream
//! client, to a recording upstream that reads strictly (`tailguard_http1_fuzz::read_request`):
//! every request the engine forwards must reach the upstream as one unambiguous message, with
//! the body the handler was given, in the same number and order; nothing may be left over
//! that a later request could complete.
#![no_main]

use std::cell::RefCell;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use libfuzzer_sys::fuzz_target;
use tailguard_http1::client::{self, Connection};
use tailguard_http1::server::{self, H1Body, Handler, Limits, OutgoingBody, Reader, Shutdown};
use tailguard_http1::timer::LazyTimer;
use tailguard_http1::{BodyError, RequestError};
use tailguard_http1_fuzz::{Message, Strict, read_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request body that keeps a copy of what passed through it.
struct Tee {
    inner: Option<H1Body>,
    seen: Rc<RefCell<Vec<u8>>>,
}

impl Body for Tee {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.seen.borrow_mut().extend_from_slice(data);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint)
    }
}

/// An empty answer to the client.
struct Empty;

impl Body for Empty {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(0)
    }
}

impl OutgoingBody for Empty {}

/// What the handler forwarded: each request answered by the upstream, with the body the
/// engine gave it.
#[derive(Default)]
struct Forwarded {
    answered: Vec<Message>,
}

struct Forwarder {
    upstream: SocketAddr,
    log: Rc<RefCell<Forwarded>>,
    current_body: Rc<RefCell<Vec<u8>>>,
}

impl Handler for &Forwarder {
    type Body = Tee;
    type ResponseBody = Empty;

    fn new_request(&self, _: usize) -> Box<Request<Tee>> {
        self.current_body.borrow_mut().clear();
        Box::new(Request::new(Tee {
            inner: None,
            seen: Rc::clone(&self.current_body),
        }))
    }

    fn attach_body(&self, req: &mut Request<Tee>, body: H1Body) {
        req.body_mut().inner = Some(body);
    }

    async fn serve(&self, mut req: Box<Request<Tee>>, _: &mut LazyTimer) -> Response<Empty> {
        // What the gateway does to every request before it goes upstream (`forward`): the
        // fields `Connection` names removed, and a Host for an HTTP/1.0 request without one.
        tailguard_http1::fields::remove_hop_by_hop(req.headers_mut());
        if !req.headers().contains_key(http::header::HOST) {
            req.headers_mut().insert(
                http::header::HOST,
                http::HeaderValue::from_static("upstream"),
            );
        }
        let method = req.method().to_string();
        // The origin form the upstream must see: an empty path is `/` (RFC 9112 §3.2.2),
        // so `GET http://h?q` goes up as `GET /?q`.
        let target = match req.uri().path_and_query().map(|p| p.as_str()) {
            Some(t) if t.starts_with('/') || t == "*" => t.to_string(),
            Some(t) => format!("/{t}"),
            None => "/".to_string(),
        };
        let mut answer = Response::new(Empty);
        let Ok(stream) = TcpStream::connect(self.upstream).await else {
            *answer.status_mut() = StatusCode::BAD_GATEWAY;
            return answer;
        };
        let conn = Connection::new(stream, self.upstream, Box::new(()));
        match client::send(conn, req, false, &[]).await {
            Ok((resp, _)) => {
                let mut body = resp.into_body();
                while let Some(Ok(_)) =
                    std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                {
                }
                self.log.borrow_mut().answered.push(Message {
                    method,
                    target,
                    body: self.current_body.borrow().clone(),
                });
            }
            Err(_) => *answer.status_mut() = StatusCode::BAD_GATEWAY,
        }
        answer
    }

    fn refused(&self, err: RequestError) -> (StatusCode, &'static str) {
        (
            StatusCode::from_u16(err.status()).unwrap_or(StatusCode::BAD_REQUEST),
            "refused\n",
        )
    }
}

struct Never;

impl Shutdown for Never {
    fn poll_draining(&mut self, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }

    fn is_draining(&self) -> bool {
        false
    }
}

/// Reads what one upstream connection receives, strictly, answering each whole message;
/// returns the messages and what was left over when the connection ended.
async fn record(mut stream: TcpStream) -> (Vec<Message>, Vec<u8>) {
    let mut buf = Vec::new();
    let mut messages = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match read_request(&buf) {
            Strict::Message(m, used) => {
                buf.drain(..used);
                messages.push(m);
                if stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .is_err()
                {
                    return (messages, buf);
                }
                continue;
            }
            Strict::Invalid(why) => panic!(
                "the upstream received a message it cannot frame strictly ({why}): {:?}",
                String::from_utf8_lossy(&buf)
            ),
            Strict::Partial => {}
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return (messages, buf),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
}

fuzz_target!(|data: &[u8]| {
    RUNTIME.with(|rt| rt.block_on(exchange(data)));
});

async fn exchange(data: &[u8]) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let forwarder = Forwarder {
        upstream,
        log: Rc::default(),
        current_body: Rc::default(),
    };
    let received: Rc<RefCell<Vec<(Vec<Message>, Vec<u8>)>>> = Rc::default();
    let (client, gateway) = tokio::io::duplex(64 * 1024);
    let (gateway_read, gateway_write) = tokio::io::split(gateway);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let limits = Limits {
        header_bytes: 4096,
        body_bytes: 1 << 20,
        idle: Some(Duration::from_millis(200)),
        header: Some(Duration::from_millis(200)),
        body: Some(Duration::from_millis(200)),
        park_after: None,
        linger: server::Linger::DEFAULT,
    };
    let serve = async {
        let mut never = Never;
        server::serve(
            Reader::new(Box::new(gateway_read), bytes::BytesMut::new()),
            Box::new(gateway_write),
            &forwarder,
            limits,
            &mut never,
            server::Start::New { sniff_h2: false },
        )
        .await;
    };
    let send = async {
        let _ = client_write.write_all(data).await;
        let _ = client_write.shutdown().await;
    };
    let drain = async {
        let mut sink = Vec::new();
        let _ = client_read.read_to_end(&mut sink).await;
    };
    let accepted = std::cell::Cell::new(0usize);
    let accept = async {
        // Each forwarded request opens a connection of its own and waits for its answer,
        // so one connection at a time is read.
        while let Ok((stream, _)) = listener.accept().await {
            accepted.set(accepted.get() + 1);
            let recorded = record(stream).await;
            received.borrow_mut().push(recorded);
        }
    };
    let mut accept = std::pin::pin!(accept);
    let done = async { tokio::join!(serve, send, drain) };
    let bounded = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = done => {}
            () = &mut accept => {}
        }
        // The last connection's end may not have been read yet.
        while received.borrow().len() < accepted.get() {
            tokio::select! {
                () = &mut accept => break,
                () = tokio::task::yield_now() => {}
            }
        }
    });
    assert!(bounded.await.is_ok(), "the exchange did not end within 5 s");
    let forwarded = forwarder.log.borrow();
    let received = received.borrow();
    let complete: Vec<&Message> = received.iter().flat_map(|(m, _)| m).collect();
    assert_eq!(
        complete.len(),
        forwarded.answered.len(),
        "the upstream framed {} messages for {} forwarded requests",
        complete.len(),
        forwarded.answered.len()
    );
    for (up, sent) in complete.iter().zip(&forwarded.answered) {
        assert_eq!((&up.method, &up.target), (&sent.method, &sent.target));
        assert_eq!(
            up.body, sent.body,
            "the upstream's body differs from the client's"
        );
    }
    for (messages, rest) in received.iter() {
        assert!(
            messages.len() <= 1,
            "two messages on one upstream connection"
        );
        assert!(
            messages.is_empty() || rest.is_empty(),
            "bytes after a whole message: {:?}",
            String::from_utf8_lossy(rest)
        );
    }
}
