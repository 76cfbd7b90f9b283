//! Why a call failed, and, when etcd (or its TLS) refused the client, which setting an
//! operator has to fix: the [`Refusal`]s are told apart here from the gRPC status etcd sent
//! or the TLS alert the handshake ended with.

use std::sync::Arc;

use rustls::AlertDescription;

use crate::tls::Probe;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`Client::connect`](crate::Client::connect) was given no endpoint.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// An endpoint is not an `http://host:port` or `https://host:port` URL, or does not go
    /// with the TLS settings.
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
    Status(tonic::Status),
    /// etcd, or its TLS, refused this client: a setting has to change before a retry can
    /// succeed.
    #[error("{refusal} ({detail})")]
    Refused {
        /// What was refused.
        refusal: Refusal,
        /// What etcd or the TLS handshake said.
        detail: String,
    },
}

/// What etcd refused, in words that name the setting to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// etcd runs with `--client-cert-auth` and no client certificate was configured.
    #[error("etcd requires a client certificate and none is configured")]
    ClientCertificateRequired,
    /// etcd did not accept the client certificate (not signed by its `--trusted-ca-file`,
    /// expired, ...).
    #[error("etcd rejected the client certificate")]
    ClientCertificateRejected,
    /// The server's certificate did not verify against the configured CA.
    #[error("the etcd server's certificate is not trusted by the configured CA")]
    UntrustedServer,
    /// The server's certificate did not verify against the system's roots (no CA given).
    #[error("the etcd server's certificate is not trusted by the system's root certificates")]
    UntrustedServerSystemRoots,
    /// `Authenticate` failed: no such user, or the wrong password.
    #[error("etcd authentication failed: wrong user name or password")]
    WrongPassword,
    /// etcd has authentication enabled and no user name was configured.
    #[error("etcd requires authentication (a user name and password) and none is configured")]
    AuthenticationRequired,
    /// The user has no permission for the request.
    #[error("etcd denied the user permission")]
    PermissionDenied,
}

impl Error {
    /// What etcd refused, if it refused this client rather than failing to answer.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }
}

/// What the client was set up with: some refusals read differently with or without it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Setup {
    pub(crate) client_cert: bool,
    pub(crate) ca: bool,
    pub(crate) credentials: bool,
    /// With TLS: how to find out whether a failed connection was a TLS refusal.
    pub(crate) probe: Option<Arc<Probe>>,
}

impl Setup {
    /// An error from a call: a refusal if etcd's status says one, or, for a connection
    /// that failed over TLS, if a handshake of the probe's ends in one.
    pub(crate) async fn status(&self, status: tonic::Status) -> Error {
        let refusal = match self.refusal_of(&status) {
            Some(refusal) => Some((refusal, status_text(&status))),
            None if is_connection_failure(&status) => self.probe().await,
            None => None,
        };
        match refusal {
            Some((refusal, detail)) => Error::Refused { refusal, detail },
            None => Error::Status(status),
        }
    }

    /// An error getting a connection ready: a refusal if a probe's handshake ends in one.
    pub(crate) async fn transport(&self, e: &tonic::transport::Error) -> Error {
        let mut text = e.to_string();
        push_causes(&mut text, std::error::Error::source(e));
        match self.probe().await {
            Some((refusal, detail)) => Error::Refused { refusal, detail },
            None => Error::Transport(text),
        }
    }

    async fn probe(&self) -> Option<(Refusal, String)> {
        let error = self.probe.as_ref()?.tls_error().await?;
        let refusal = self.tls_refusal(&error)?;
        Some((refusal, format!("TLS: {error}")))
    }

    /// etcd's "permission denied": without credentials, because none were given (etcd
    /// checks a watch's permission as an anonymous user's then).
    fn permission_denied(&self) -> Refusal {
        if self.credentials {
            Refusal::PermissionDenied
        } else {
            Refusal::AuthenticationRequired
        }
    }

    fn refusal_of(&self, status: &tonic::Status) -> Option<Refusal> {
        self.refusal_in(status.message())
    }

    /// The refusal an etcd error message says (a status's, or a cancelled watch's reason).
    pub(crate) fn refusal_in(&self, message: &str) -> Option<Refusal> {
        // etcd's own errors (api/v3rpc/rpctypes): the message is the stable part.
        if message.contains("authentication failed, invalid user ID or password") {
            return Some(Refusal::WrongPassword);
        }
        if message.contains("user name is empty") {
            return Some(Refusal::AuthenticationRequired);
        }
        if message.contains("permission denied") {
            return Some(self.permission_denied());
        }
        None
    }

    fn tls_refusal(&self, error: &rustls::Error) -> Option<Refusal> {
        use rustls::Error as E;
        let refusal = match error {
            E::InvalidCertificate(_) if self.ca => Refusal::UntrustedServer,
            E::InvalidCertificate(_) => Refusal::UntrustedServerSystemRoots,
            // TLS 1.3 says "certificate required"; Go's TLS 1.2 says "bad certificate" for a
            // missing certificate as well as a rejected one.
            E::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateRevoked,
            ) if !self.client_cert => Refusal::ClientCertificateRequired,
            E::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateRevoked,
            ) => Refusal::ClientCertificateRejected,
            _ => return None,
        };
        Some(refusal)
    }
}

/// Whether a status is the connection's rather than etcd's answer (gRPC's codes for a
/// transport that failed or was torn down).
fn is_connection_failure(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

/// Whether etcd said (in a status's message or a cancelled watch's reason) the token is no
/// good any more: renew it and try again.
pub(crate) fn token_expired(message: &str) -> bool {
    message.contains("invalid auth token") || message.contains("revision of auth store is old")
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    async fn refusal(code: Code, message: &str) -> Option<Refusal> {
        Setup::default()
            .status(tonic::Status::new(code, message))
            .await
            .refusal()
    }

    #[tokio::test]
    async fn etcds_auth_messages_are_told_apart() {
        assert_eq!(
            refusal(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )
            .await,
            Some(Refusal::WrongPassword)
        );
        assert_eq!(
            refusal(Code::InvalidArgument, "etcdserver: user name is empty").await,
            Some(Refusal::AuthenticationRequired)
        );
        assert_eq!(
            refusal(Code::PermissionDenied, "etcdserver: permission denied").await,
            Some(Refusal::AuthenticationRequired),
            "without credentials, a denial means some are needed"
        );
        assert_eq!(refusal(Code::Unavailable, "connection refused").await, None);
        assert!(token_expired("etcdserver: invalid auth token"));
        // A cancelled watch's reason, as etcd 3.4 words it.
        assert!(token_expired(
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        ));
    }
}
