//! A small etcd v3 client: the gRPC calls tailguard's config from etcd makes (read, write,
//! conditional write, delete and compact one key; watch it), over `tonic` with HTTP/2
//! keep-alive pings, in plain text or over TLS (`https://` endpoints, optionally with a
//! client certificate), with etcd's user/password authentication.
//!
//! Why hand-written: the `etcd-client` crate generates its code from etcd's `.proto` files
//! in a build script, so every machine that builds tailguard would need `protoc` (and the
//! protobuf well-known types) installed; a fresh machine with only Rust could not build the
//! gateway. The subset tailguard uses is small: a few dozen messages, written here with
//! `prost`'s derive ([`rpc`], with etcd's field numbers and types), and ten methods, each a
//! [`tonic::client::Grpc`] call with [`tonic_prost::ProstCodec`]. Wire compatibility is
//! tested against a real etcd (`tests/`), and the encodings that matter (a compare at
//! revision 0, a transaction's operations, fields left out on decode) byte for byte.
//!
//! TLS and authentication were added to this client rather than switching to `etcd-client`
//! with a vendored `protoc` (issue 22): TLS is tonic's own (`tls-ring`, rustls with the ring
//! provider the workspace already builds, [`Tls`]), and authentication is one more unary
//! call (`Auth/Authenticate`) whose token goes in each request's `token` metadata; a
//! vendored `protoc` would have added a C++ build of protobuf to every fresh build.
//!
//! [`Client::connect`] builds a channel over every endpoint (requests go to one that
//! answers); it connects lazily, so it fails only on a malformed URL. With credentials
//! ([`ConnectOptions::with_credentials`]) the first call authenticates; a call etcd answers
//! with "invalid auth token" (the token expired) authenticates again and is retried once,
//! and so is a watch's creation. Each call returns etcd's response message;
//! [`Client::watch`] returns a [`WatchStream`] of [`WatchResponse`]s. A refusal that only a
//! change of settings can cure (no client certificate, an untrusted server, a wrong
//! password) is an [`Error::Refused`] naming it ([`Refusal`]). The client has no timeouts of
//! its own beyond connecting and the keep-alive pings: callers bound each call (a watch
//! stays open for as long as it is needed).
//!
//! ```
//! use prost::Message as _;
//! use tailguard_etcd::rpc::Compare;
//! // "Write only if the key does not exist": mod revision 0 is sent, not left out.
//! let bytes = Compare::mod_revision("/k", 0).encode_to_vec();
//! assert_eq!(bytes, [0x10, 0x02, 0x1a, 0x02, b'/', b'k', 0x30, 0x00]);
//! ```

pub mod rpc;

mod auth;
mod error;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use auth::{Auth, Token};
pub use error::{Error, Refusal};
use error::{Setup, token_expired};
use rpc::{
    AuthEnableRequest, AuthResponse, AuthUserAddRequest, AuthUserChangePasswordRequest,
    AuthUserGrantRoleRequest, AuthenticateRequest, AuthenticateResponse, CompactionRequest,
    DeleteRangeRequest, PutRequest, RangeRequest, WatchRequest, watch_request,
};
pub use rpc::{
    CompactionResponse, Compare, DeleteRangeResponse, Event, KeyValue, PutResponse, RangeResponse,
    RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchResponse, event::EventType,
};
use tls::Probe;
pub use tls::Tls;

/// How the client connects.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    tls: Option<Tls>,
    credentials: Option<(String, String)>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("ConnectOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("tls", &self.tls)
            .field("user", &self.credentials.as_ref().map(|c| &c.0))
            .finish()
    }
}

impl ConnectOptions {
    /// Options with no timeouts, no keep-alive pings, no TLS settings and no credentials.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Give up a TCP connection attempt (and a TLS handshake) after `timeout`.
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

    /// Speak TLS with these settings to every endpoint (which must then be `https://`; a
    /// bare `host:port` is read as `https://`). An `https://` endpoint without them trusts
    /// the system's roots and presents no client certificate.
    pub fn with_tls(mut self, tls: Tls) -> ConnectOptions {
        self.tls = Some(tls);
        self
    }

    /// Authenticate as `user` with `password` (etcd's `auth enable`); the token is fetched
    /// on the first call and renewed when etcd says it expired.
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> ConnectOptions {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    fn setup(&self, endpoints: &[Endpoint]) -> Result<Setup, Error> {
        let tls_targets: Vec<(String, u16)> = endpoints
            .iter()
            .filter(|e| e.uri().scheme_str() == Some("https"))
            .filter_map(|e| {
                Some((
                    host(e.uri())?.to_owned(),
                    e.uri().port_u16().unwrap_or(2379),
                ))
            })
            .collect();
        let probe = if tls_targets.is_empty() {
            None
        } else {
            let tls = self.tls.clone().unwrap_or_else(Tls::system_roots);
            let probe = Probe::new(&tls, tls_targets, self.connect_timeout)
                .map_err(|e| Error::Transport(format!("TLS settings: {e}")))?;
            Some(Arc::new(probe))
        };
        Ok(Setup {
            client_cert: self.tls.as_ref().is_some_and(Tls::has_client_cert),
            ca: self.tls.as_ref().is_some_and(Tls::has_ca),
            credentials: self.credentials.is_some(),
            probe,
        })
    }

    fn endpoint(&self, url: &str) -> Result<Endpoint, Error> {
        // A bare host:port is plain HTTP, as etcdctl reads it, unless TLS is configured.
        let url = if url.contains("://") {
            url.to_owned()
        } else if self.tls.is_some() {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        let invalid = |reason: String| Error::Endpoint {
            url: url.clone(),
            reason,
        };
        let tls = if url.starts_with("https://") {
            Some(self.tls.clone().unwrap_or_else(Tls::system_roots))
        } else if url.starts_with("http://") {
            if self.tls.is_some() {
                return Err(invalid(
                    "TLS settings are given for a plain-text endpoint: use https://".into(),
                ));
            }
            None
        } else {
            return Err(invalid(
                "expected http://host:port or https://host:port".into(),
            ));
        };
        let mut endpoint =
            Endpoint::from_shared(url.clone()).map_err(|e| invalid(cause_text(&e)))?;
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.client_config(self.connect_timeout))
                .map_err(|e| invalid(cause_text(&e)))?;
        }
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

/// An endpoint URL's host, without an IPv6 address's brackets.
fn host(uri: &http::Uri) -> Option<&str> {
    let host = uri.host()?;
    Some(
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host),
    )
}

/// An error and its causes as one line.
fn cause_text(e: &tonic::transport::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A client of an etcd cluster. Cheap to clone: clones share the connections and the
/// authentication token.
#[derive(Debug, Clone)]
pub struct Client {
    grpc: Grpc<Channel>,
    auth: Option<Arc<Auth>>,
    setup: Setup,
}

const RANGE: &str = "/etcdserverpb.KV/Range";
const PUT: &str = "/etcdserverpb.KV/Put";
const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
const TXN: &str = "/etcdserverpb.KV/Txn";
const COMPACT: &str = "/etcdserverpb.KV/Compact";
const WATCH: &str = "/etcdserverpb.Watch/Watch";
/// The largest answer taken from etcd (a get, a watch event): 256 MiB, far above any
/// config document and etcd's 1.5 MiB default request cap (raised with
/// `--max-request-bytes` for large route tables), yet a bound on what one answer buffers.
const MAX_ANSWER_BYTES: usize = 256 << 20;
const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
const AUTH_ENABLE: &str = "/etcdserverpb.Auth/AuthEnable";
const USER_ADD: &str = "/etcdserverpb.Auth/UserAdd";
const USER_GRANT_ROLE: &str = "/etcdserverpb.Auth/UserGrantRole";
const USER_CHANGE_PASSWORD: &str = "/etcdserverpb.Auth/UserChangePassword";

impl Client {
    /// A client of the cluster at `endpoints` (`http://host:port`, `https://host:port`, or
    /// `host:port`), any of which may answer a call. Connects lazily, on the first call;
    /// must run in a tokio runtime (the channel's balancer is a task of it).
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
        let setup = options.setup(&endpoints)?;
        // Balanced over every member even when there is one, so a member that stops
        // answering is left for the others and reconnected in the background.
        let channel = Channel::balance_list(endpoints.into_iter());
        Ok(Client {
            // tonic refuses an answer over 4 MiB by default, and a config document with
            // 100,000 routes is about 7 MiB: a get or a watch event of it failed as
            // "decoded message length too large". etcd's own client allows 2 GiB; the
            // document is bounded by the server's `--max-request-bytes` anyway.
            grpc: Grpc::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES),
            auth: options
                .credentials
                .clone()
                .map(|(user, password)| Auth::new(user, password)),
            setup,
        })
    }

    /// How many times this client (and its clones) fetched an authentication token: the
    /// first time, then once per renewal. 0 without credentials.
    pub fn authentications(&self) -> u64 {
        self.auth.as_ref().map_or(0, |a| a.authentications())
    }

    /// One call, with `token` in its metadata: the outer error is the connection's, the
    /// inner one etcd's answer.
    async fn call<Req, Resp>(
        &mut self,
        path: &'static str,
        request: Req,
        token: Option<&Token>,
    ) -> Result<Result<Resp, tonic::Status>, Error>
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        if let Err(e) = self.grpc.ready().await {
            return Err(self.setup.transport(&e).await);
        }
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            token.attach(request.metadata_mut());
        }
        let response = self
            .grpc
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await;
        Ok(response.map(tonic::Response::into_inner))
    }

    /// The token to send: fetched on the first call (`None` without credentials).
    async fn token(&mut self) -> Result<Option<Token>, Error> {
        match &self.auth {
            None => Ok(None),
            Some(auth) => match auth.current() {
                Some(token) => Ok(Some(token)),
                None => self.authenticate().await.map(Some),
            },
        }
    }

    /// Exchanges the credentials for a new token.
    async fn authenticate(&mut self) -> Result<Token, Error> {
        let auth = Arc::clone(
            self.auth
                .as_ref()
                .expect("authenticate only with credentials"),
        );
        let request = AuthenticateRequest {
            name: auth.name.clone(),
            password: auth.password.clone(),
        };
        let answer = self
            .call::<_, AuthenticateResponse>(AUTHENTICATE, request, None)
            .await?;
        let token = match answer {
            Ok(response) => Some(response.token),
            // etcd's own client carries on without a token then, so a fleet can be given
            // credentials before etcd enables authentication.
            Err(status) if status.message().contains("authentication is not enabled") => None,
            Err(status) => return Err(self.setup.status(status).await),
        };
        auth.store(token).map_err(Error::Transport)
    }

    /// Whether a failed call is worth one more try with a new token.
    fn renewable(&self, status: &tonic::Status, renewed: bool) -> bool {
        self.renewable_for(status.message(), renewed)
    }

    /// Whether etcd's error message `message` is worth one more try with a new token.
    fn renewable_for(&self, message: &str, renewed: bool) -> bool {
        // "user name is empty": etcd enabled authentication after the client found it off.
        self.auth.is_some()
            && !renewed
            && (token_expired(message) || message.contains("user name is empty"))
    }

    async fn unary<Req, Resp>(&mut self, path: &'static str, request: Req) -> Result<Resp, Error>
    where
        Req: prost::Message + Clone + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        let mut renewed = false;
        loop {
            let token = self.token().await?;
            match self.call(path, request.clone(), token.as_ref()).await? {
                Ok(response) => return Ok(response),
                Err(status) if self.renewable(&status, renewed) => {
                    self.authenticate().await?;
                    renewed = true;
                }
                Err(status) => return Err(self.setup.status(status).await),
            }
        }
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

    /// Adds a user with a password (to set authentication up).
    pub async fn user_add(
        &mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<(), Error> {
        let request = AuthUserAddRequest {
            name: user.into(),
            password: password.into(),
        };
        self.unary::<_, AuthResponse>(USER_ADD, request).await?;
        Ok(())
    }

    /// Gives `user` a new password (a password rotation); etcd invalidates the user's
    /// tokens, so its clients must authenticate again, with the new one.
    pub async fn user_change_password(
        &mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<(), Error> {
        let request = AuthUserChangePasswordRequest {
            name: user.into(),
            password: password.into(),
        };
        self.unary::<_, AuthResponse>(USER_CHANGE_PASSWORD, request)
            .await?;
        Ok(())
    }

    /// Grants `role` to `user` (`root`: every permission).
    pub async fn user_grant_role(
        &mut self,
        user: impl Into<String>,
        role: impl Into<String>,
    ) -> Result<(), Error> {
        let request = AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        };
        self.unary::<_, AuthResponse>(USER_GRANT_ROLE, request)
            .await?;
        Ok(())
    }

    /// Turns authentication on (etcd requires a `root` user with the `root` role first).
    /// From then on every request needs a token, this client's included unless it has
    /// credentials.
    pub async fn auth_enable(&mut self) -> Result<(), Error> {
        self.unary::<_, AuthResponse>(AUTH_ENABLE, AuthEnableRequest {})
            .await?;
        Ok(())
    }

    /// Starts a watch and waits for etcd's first response, which says whether it was
    /// created (or, for a compacted start revision, cancelled with `compact_revision` set)
    /// and is the stream's first message; events follow. A watch refused for an expired
    /// token is created again once with a new one.
    pub async fn watch(&mut self, create: WatchCreateRequest) -> Result<WatchStream, Error> {
        let mut renewed = false;
        loop {
            let token = self.token().await?;
            let mut stream = match self.open_watch(create.clone(), token.as_ref()).await? {
                Ok(stream) => stream,
                Err(status) if self.renewable(&status, renewed) => {
                    self.authenticate().await?;
                    renewed = true;
                    continue;
                }
                Err(status) => return Err(self.setup.status(status).await),
            };
            let first = match stream.responses.message().await {
                Ok(Some(first)) => first,
                Ok(None) => return Err(Error::Transport("watch stream closed".into())),
                Err(status) if self.renewable(&status, renewed) => {
                    self.authenticate().await?;
                    renewed = true;
                    continue;
                }
                Err(status) => return Err(self.setup.status(status).await),
            };
            // etcd checks a watch's token and permission once, at creation, and answers a
            // stale token (or none) by cancelling the watch with the error as its reason.
            if first.canceled {
                if self.renewable_for(&first.cancel_reason, renewed) {
                    self.authenticate().await?;
                    renewed = true;
                    continue;
                }
                if let Some(refusal) = self.setup.refusal_in(&first.cancel_reason) {
                    return Err(Error::Refused {
                        refusal,
                        detail: format!("watch cancelled: {}", first.cancel_reason),
                    });
                }
            }
            stream.first = Some(first);
            return Ok(stream);
        }
    }

    async fn open_watch(
        &mut self,
        create: WatchCreateRequest,
        token: Option<&Token>,
    ) -> Result<Result<WatchStream, tonic::Status>, Error> {
        // The create request is queued before the call: etcd answers the stream's headers
        // with its first response, so the call returns once the watch exists.
        let (requests, queued) = mpsc::channel(1);
        requests
            .try_send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
            })
            .expect("a new channel has room for one message");
        if let Err(e) = self.grpc.ready().await {
            return Err(self.setup.transport(&e).await);
        }
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(queued));
        if let Some(token) = token {
            token.attach(request.metadata_mut());
        }
        let responses = self
            .grpc
            .streaming(
                request,
                PathAndQuery::from_static(WATCH),
                ProstCodec::<WatchRequest, WatchResponse>::default(),
            )
            .await;
        Ok(responses.map(|r| WatchStream {
            _requests: requests,
            responses: r.into_inner(),
            first: None,
            setup: self.setup.clone(),
        }))
    }
}

/// The responses of one watch. Dropping it ends the watch (the stream is reset).
#[derive(Debug)]
pub struct WatchStream {
    /// Kept open: a finished request stream would half-close the call.
    _requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
    /// The response [`Client::watch`] waited for, not yet handed out.
    first: Option<WatchResponse>,
    setup: Setup,
}

impl WatchStream {
    /// The next response; `None` once etcd has closed the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        match self.responses.message().await {
            Ok(m) => Ok(m),
            Err(status) => Err(self.setup.status(status).await),
        }
    }
}
