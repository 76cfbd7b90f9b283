//! A small etcd v3 client: the gRPC calls tailguard's config from etcd makes (read, write,
//! conditional write, delete and compact one key; watch it), over `tonic` with HTTP/2
//! keep-alive pings.
//!
//! Why hand-written: the `etcd-client` crate generates its code from etcd's `.proto` files
//! in a build script, so every machine that builds tailguard would need `protoc` (and the
//! protobuf well-known types) installed; a fresh machine with only Rust could not build the
//! gateway. The subset tailguard uses is small: a dozen messages, written here with `prost`'s
//! derive ([`rpc`], with etcd's field numbers and types), and six methods, each a
//! [`tonic::client::Grpc`] call with [`tonic_prost::ProstCodec`]. Wire compatibility is
//! tested against a real etcd (`tests/`), and the encodings that matter (a compare at
//! revision 0, a transaction's operations, fields left out on decode) byte for byte.
//!
//! [`Client::connect`] builds a channel over every endpoint (requests go to one that
//! answers); it connects lazily, so it fails only on a malformed URL. Each call returns
//! etcd's response message; [`Client::watch`] returns a [`WatchStream`] of
//! [`WatchResponse`]s. The client has no timeouts of its own beyond connecting and the
//! keep-alive pings: callers bound each call (a watch stays open for as long as it is
//! needed).
//!
//! ```
//! use prost::Message as _;
//! use tailguard_etcd::rpc::Compare;
//! // "Write only if the key does not exist": mod revision 0 is sent, not left out.
//! let bytes = Compare::mod_revision("/k", 0).encode_to_vec();
//! assert_eq!(bytes, [0x10, 0x02, 0x1a, 0x02, b'/', b'k', 0x30, 0x00]);
//! ```

pub mod rpc;

use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use rpc::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, WatchRequest, watch_request,
};
pub use rpc::{
    CompactionResponse, Compare, DeleteRangeResponse, Event, KeyValue, PutResponse, RangeResponse,
    RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchResponse, event::EventType,
};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`Client::connect`] was given no endpoint.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// An endpoint is not an `http://host:port` URL.
    #[error("`{url}` is not an etcd endpoint: {reason}")]
    Endpoint {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The connection could not be used.
    #[error("{0}")]
    Transport(String),
    /// etcd (or the connection to it) answered with a gRPC status.
    #[error("{}", status_text(.0))]
    Status(#[from] tonic::Status),
}

/// A status as one line: its code, message and causes (a connection error's cause says
/// why, e.g. "Connection refused").
fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}", status.code());
    if !status.message().is_empty() {
        text.push_str(": ");
        text.push_str(status.message());
    }
    push_causes(&mut text, std::error::Error::source(status));
    text
}

fn push_causes(text: &mut String, mut cause: Option<&(dyn std::error::Error + 'static)>) {
    while let Some(e) = cause {
        let s = e.to_string();
        // Layers often repeat their cause's text.
        if !text.ends_with(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cause = e.source();
    }
}

fn transport(e: &tonic::transport::Error) -> Error {
    let mut text = e.to_string();
    push_causes(&mut text, std::error::Error::source(e));
    Error::Transport(text)
}

/// How the client connects.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
}

impl ConnectOptions {
    /// Options with no timeouts and no keep-alive pings.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Give up a TCP connection attempt after `timeout`.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> ConnectOptions {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Send an HTTP/2 ping every `interval`, even while no call is open, and drop the
    /// connection if one goes unanswered for `timeout`: a dead etcd behind a silent network
    /// ends an open watch with an error instead of leaving it waiting forever.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> ConnectOptions {
        self.keep_alive = Some((interval, timeout));
        self
    }

    fn endpoint(&self, url: &str) -> Result<Endpoint, Error> {
        // A bare host:port is plain HTTP, as etcdctl reads it.
        let url = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        if !url.starts_with("http://") {
            return Err(Error::Endpoint {
                url,
                reason: "only http:// endpoints are supported (this client has no TLS)".into(),
            });
        }
        let mut endpoint = Endpoint::from_shared(url.clone()).map_err(|e| Error::Endpoint {
            url,
            reason: transport(&e).to_string(),
        })?;
        if let Some(t) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        if let Some((interval, timeout)) = self.keep_alive {
            endpoint = endpoint
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true);
        }
        Ok(endpoint)
    }
}

/// A client of an etcd cluster. Cheap to clone: clones share the connections.
#[derive(Debug, Clone)]
pub struct Client {
    grpc: Grpc<Channel>,
}

const RANGE: &str = "/etcdserverpb.KV/Range";
const PUT: &str = "/etcdserverpb.KV/Put";
const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
const TXN: &str = "/etcdserverpb.KV/Txn";
const COMPACT: &str = "/etcdserverpb.KV/Compact";
const WATCH: &str = "/etcdserverpb.Watch/Watch";

impl Client {
    /// A client of the cluster at `endpoints` (`http://host:port`, or `host:port`), any of
    /// which may answer a call. Connects lazily, on the first call; must run in a tokio
    /// runtime (the channel's balancer is a task of it).
    pub async fn connect<S: AsRef<str>>(
        endpoints: &[S],
        options: &ConnectOptions,
    ) -> Result<Client, Error> {
        if endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let endpoints = endpoints
            .iter()
            .map(|e| options.endpoint(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        // Balanced over every member even when there is one, so a member that stops
        // answering is left for the others and reconnected in the background.
        let channel = Channel::balance_list(endpoints.into_iter());
        Ok(Client {
            grpc: Grpc::new(channel),
        })
    }

    async fn unary<Req, Resp>(&mut self, path: &'static str, request: Req) -> Result<Resp, Error>
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        self.grpc.ready().await.map_err(|e| transport(&e))?;
        let response = self
            .grpc
            .unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await?;
        Ok(response.into_inner())
    }

    /// Reads `key`: its value (if it exists) and the store's revision.
    pub async fn get(&mut self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        let request = RangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        self.unary(RANGE, request).await
    }

    /// Writes `value` under `key`; the response's revision is the write's.
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
        };
        self.unary(PUT, request).await
    }

    /// Deletes `key`.
    pub async fn delete(&mut self, key: impl Into<Vec<u8>>) -> Result<DeleteRangeResponse, Error> {
        let request = DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        self.unary(DELETE_RANGE, request).await
    }

    /// Runs a transaction.
    pub async fn txn(&mut self, request: TxnRequest) -> Result<TxnResponse, Error> {
        self.unary(TXN, request).await
    }

    /// Writes `value` under `key` only if the key's mod revision is `expected` (0: only if
    /// the key does not exist). Otherwise nothing is written, the response has
    /// `succeeded == false`, and [`TxnResponse::first_range`] holds the key as it is.
    pub async fn put_if_mod_revision(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        expected: i64,
    ) -> Result<TxnResponse, Error> {
        let key = key.into();
        let request = TxnRequest {
            compare: vec![Compare::mod_revision(key.clone(), expected)],
            success: vec![RequestOp::put(key.clone(), value)],
            failure: vec![RequestOp::range(key)],
        };
        self.txn(request).await
    }

    /// Compacts the history before `revision` away (answers once it is applied).
    pub async fn compact(&mut self, revision: i64) -> Result<CompactionResponse, Error> {
        let request = CompactionRequest {
            revision,
            physical: true,
        };
        self.unary(COMPACT, request).await
    }

    /// Starts a watch. The stream's first response says whether it was created (or, for a
    /// compacted start revision, cancelled with `compact_revision` set); events follow.
    pub async fn watch(&mut self, create: WatchCreateRequest) -> Result<WatchStream, Error> {
        // The create request is queued before the call: etcd answers the stream's headers
        // with its first response, so the call returns once the watch exists.
        let (requests, queued) = mpsc::channel(1);
        requests
            .try_send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
            })
            .expect("a new channel has room for one message");
        self.grpc.ready().await.map_err(|e| transport(&e))?;
        let responses = self
            .grpc
            .streaming(
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(queued)),
                PathAndQuery::from_static(WATCH),
                ProstCodec::<WatchRequest, WatchResponse>::default(),
            )
            .await?
            .into_inner();
        Ok(WatchStream {
            _requests: requests,
            responses,
        })
    }
}

/// The responses of one watch. Dropping it ends the watch (the stream is reset).
#[derive(Debug)]
pub struct WatchStream {
    /// Kept open: a finished request stream would half-close the call.
    _requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next response; `None` once etcd has closed the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        Ok(self.responses.message().await?)
    }
}
