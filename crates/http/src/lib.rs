//! The gateway's HTTP vocabulary, which every layer above it speaks: the one error type
//! (each failure with its blame and exactly one HTTP status), the request bodies, the
//! header rules between downstream and upstream, gRPC as the gateway sees it, and the
//! kept body a retry sends again. No route, snapshot or record: values and rules only.
//!
//! How the main types interact:
//! - An [`Error`] is what every stage of a request fails with; [`Error::blame`] says who
//!   caused it ([`Blame`]), [`Error::status`] is THE mapping to an HTTP status (and
//!   [`Error::grpc_status`] the gRPC one, the codes in [`grpc::code`]). The upstream side's
//!   own error (`tailguard_upstream::UpstreamError`) and the config's convert into it.
//! - A [`body::RequestBody`] carries the downstream request body upstream under its size
//!   limit (failing with [`Error::BodyTooLarge`]), reading from an HTTP/1.1 or HTTP/2
//!   downstream, or from a [`replay::Reader`] when a retry sends a kept body again; a
//!   [`replay::Kept`] handle keeps the body within its [`replay::Budget`]. An HTTP/2
//!   upstream's response body arrives as a [`body::H2Body`] under its deadline.
//! - [`headers`] removes hop-by-hop fields, adds the forwarding ones
//!   ([`headers::add_forwarding`] for a [`headers::Client`]) and reads the request's host
//!   ([`headers::host_of`]); [`recycle`] keeps finished requests' containers per thread.
//!
//! The modules, as floors (each names only modules below it): [`grpc`], [`headers`],
//! [`replay`]; [`error`]; [`body`]; [`recycle`].
//!
//! An error's blame and answers, and a request's host:
//!
//! ```
//! use http::{Request, StatusCode};
//! use tailguard_http::{Blame, Error, grpc, headers};
//!
//! let err = Error::NoRoute;
//! assert_eq!(err.blame(), Blame::Downstream);
//! assert_eq!(err.status(), StatusCode::NOT_FOUND);
//! assert_eq!(err.grpc_status(), grpc::code::UNIMPLEMENTED);
//! assert_eq!(err.reason(), "no route\n");
//!
//! let req = Request::get("/").header("host", "api.example:8080").body(()).unwrap();
//! assert_eq!(headers::host_of(&req), "api.example");
//! ```

pub mod body;
pub mod error;
pub mod grpc;
pub mod headers;
pub mod recycle;
pub mod replay;

pub use error::{Blame, Error};
