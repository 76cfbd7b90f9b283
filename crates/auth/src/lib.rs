//! Who may call: authenticators that decide, per request, whether it goes on and as whom,
//! with the expensive parts (key fetches, password hashes, calls to an auth service) kept
//! off the serving threads.
//!
//! The pieces, bottom-up:
//! - [`AuthResult`] ([`result`]): the bounded set of outcomes, the `result` label of
//!   `tailguard_auth_requests_total` and `$auth_result`;
//! - [`Source`] ([`source`]): where a credential is read (`header:NAME`, `query:NAME`,
//!   `cookie:NAME`), and removed before the request goes upstream;
//! - [`Outcome`], [`Accepted`], [`Refusal`], [`Verdict`] ([`outcome`]): what an
//!   authenticator decides, now or later;
//! - [`Authenticate`], [`AuthRequest`] ([`authenticate`]): the interface every type
//!   implements;
//! - [`keys`], [`watch`]: stored key hashes, and files re-read off the request path;
//!   [`htpasswd`]: an htpasswd file's users and their hashes; [`hash_pool`]: the bounded
//!   pool of low-priority threads that checks slow password hashes;
//! - the types: [`ApiKey`] ([`api_key`]), [`Basic`] ([`basic`]), [`Forward`] ([`forward`],
//!   its connections by [`connect`]); [`Jwt`] ([`jwt`]) over
//!   [`jwk`] (keys bound to their family), [`jws`] (a token's refusals, its signature, its
//!   claims), [`jwks`] (key sets kept fresh by the key fetcher thread, [`fetch`]) and
//!   [`cache`] (verified tokens per serving thread);
//! - [`AuthMetrics`] ([`metrics`]) and [`Gate`] ([`gate`]): a route's authenticators, tried
//!   in order until one accepts, counted once per request;
//! - [`AuthLayer`] ([`layer`]): a gate as a tower layer, for an axum or hyper service
//!   (`examples/axum.rs`).
//!
//! # Adding an authenticator type
//!
//! Implement [`Authenticate`]. `check` is called on a serving thread with an
//! [`AuthRequest`] (method, target, head fields, peer, route id) and returns a [`Verdict`]:
//! - [`Verdict::Ready`] when the answer costs microseconds: a table lookup, a cached
//!   result, a signature check of a few tens of microseconds;
//! - [`Verdict::Pending`] with a boxed `'static + Send` future when it costs more (a bcrypt
//!   hash of milliseconds, a call to another service). The future owns copies of what it
//!   needs from the request, and its heavy work runs elsewhere: a small bounded pool of
//!   threads for hashes (a full pool refuses, it never queues without bound), a pooled
//!   client for a service. The serving thread only awaits it, so a flood on one route
//!   never takes another route's CPU. Only this path allocates.
//!
//! An [`Outcome::Accepted`] names the consumer (`$consumer`, a rate limit's
//! `key = "consumer"`, the span's `enduser.id`), the headers to set on the request sent
//! upstream (their names returned by [`Authenticate::sets_headers`], so the gateway removes
//! the client's own copies before any authenticator runs) and the credential to remove.
//! An [`Outcome::Refused`] carries the whole answer ([`Refusal`]: status, fields, body),
//! so a type can answer `401` with its challenge, `403`, `503`, or an auth service's own
//! answer as it came. Each maps to one [`AuthResult`].
//!
//! ```
//! use std::sync::Arc;
//! use http::{HeaderMap, HeaderValue, Method, Uri};
//! use tailguard_auth::{
//!     ApiKey, ApiKeySettings, AuthMetrics, AuthRequest, Authenticate, Check, Consumer,
//!     Decision, Gate, KeyHash,
//! };
//!
//! let registry = tailguard_metrics::Registry::new();
//! let metrics = AuthMetrics::register(&registry).unwrap();
//! let partners = ApiKey::build(ApiKeySettings {
//!     name: "partners".into(),
//!     from: vec![], // `header:x-api-key`
//!     consumers: vec![Consumer {
//!         name: Arc::from("acme"),
//!         keys: vec![KeyHash::of(b"acme-secret")],
//!     }],
//!     keys_file: None,
//!     forward_key: false,
//! })
//! .unwrap();
//! let auth: Arc<dyn Authenticate> = Arc::new(partners);
//! let gate = Gate::new([(Arc::from("partners"), auth, metrics.handles("orders", "partners").unwrap())]);
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("x-api-key", HeaderValue::from_static("acme-secret"));
//! let uri = Uri::from_static("/orders");
//! let req = AuthRequest {
//!     method: &Method::GET,
//!     uri: &uri,
//!     headers: &headers,
//!     peer: "127.0.0.1:5000".parse().unwrap(),
//!     client: "127.0.0.1".parse().unwrap(),
//!     tls: false,
//!     route: "orders",
//! };
//! let Check::Ready(Decision::Accepted { accepted, auth }) = gate.check(req) else {
//!     panic!("the key is acme's");
//! };
//! assert_eq!(accepted.consumer.as_deref(), Some("acme"));
//! assert_eq!(&*auth, "partners");
//! ```

pub mod api_key;
pub mod authenticate;
pub mod basic;
pub mod cache;
pub mod connect;
pub mod fetch;
pub mod forward;
pub mod gate;
pub mod hash_pool;
pub mod htpasswd;
pub mod jwk;
pub mod jwks;
pub mod jws;
pub mod jwt;
pub mod keys;
pub mod layer;
pub mod metrics;
pub mod outcome;
pub mod result;
pub mod source;
pub mod watch;

pub use api_key::{ApiKey, ApiKeySettings};
pub use authenticate::{AuthRequest, Authenticate};
pub use basic::{Basic, BasicSettings};
pub use forward::{Forward, ForwardSettings};
pub use gate::{Check, Decision, Gate, PendingCheck};
pub use jwk::{Alg, KeySet};
pub use jwks::{Location, Refresh};
pub use jws::ClaimRules;
pub use jwt::{Jwt, JwtSettings};
pub use keys::{Consumer, KeyHash, KeyTable};
pub use layer::{AuthFuture, AuthLayer, AuthService, Authenticated, PeerFn};
pub use metrics::{AuthMetrics, ResultCounters};
pub use outcome::{Accepted, Outcome, PendingOutcome, Refusal, Verdict};
pub use result::AuthResult;
pub use source::{Credential, Source};
