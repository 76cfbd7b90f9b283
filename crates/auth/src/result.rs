//! The bounded set of results an authentication ends with: the `result` label of
//! `tailguard_auth_requests_total` and the access log's `$auth_result`.

/// How an authentication ended. A fixed set, so a metric label never grows with traffic:
/// every authenticator type maps what it saw onto one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthResult {
    /// A credential was presented and accepted.
    Ok,
    /// No credential where the authenticator looks for one.
    Missing,
    /// A credential that matches no known key or account (an unknown API key, a token
    /// that does not parse, a wrong password).
    Invalid,
    /// A token whose signature does not verify.
    InvalidSignature,
    /// A token past its `exp` (with the leeway).
    Expired,
    /// A token before its `nbf` (with the leeway).
    NotYetValid,
    /// A token from another issuer.
    WrongIssuer,
    /// A token for another audience.
    WrongAudience,
    /// A valid token that lacks a required claim (`403`).
    MissingClaim,
    /// A token signed with a key the key set does not hold (or not yet: no key set yet).
    UnknownKey,
    /// A credential refused by a rule of RFC 8725 or the pinned algorithms (`none`, a key
    /// of another family, `jku`, `x5u`, an embedded `jwk`, an unknown `crit`), or by an
    /// address rule, or an auth service's own refusal.
    Refused,
    /// The auth service (forward auth) failed or timed out: `503`, never let through.
    AuthServiceError,
    /// The check could not be run now: the password-hash pool's queue was full (`503`).
    Busy,
    /// A token arrived before the authenticator's first key set did (a key server that
    /// has not answered yet): `503` with `Retry-After`, never let through.
    KeysUnavailable,
}

impl AuthResult {
    /// Every result, in label order (metric handles are made for each at load).
    pub const ALL: [AuthResult; 14] = [
        AuthResult::Ok,
        AuthResult::Missing,
        AuthResult::Invalid,
        AuthResult::InvalidSignature,
        AuthResult::Expired,
        AuthResult::NotYetValid,
        AuthResult::WrongIssuer,
        AuthResult::WrongAudience,
        AuthResult::MissingClaim,
        AuthResult::UnknownKey,
        AuthResult::Refused,
        AuthResult::AuthServiceError,
        AuthResult::Busy,
        AuthResult::KeysUnavailable,
    ];

    /// The label value, also what `$auth_result` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthResult::Ok => "ok",
            AuthResult::Missing => "missing",
            AuthResult::Invalid => "invalid",
            AuthResult::InvalidSignature => "invalid_signature",
            AuthResult::Expired => "expired",
            AuthResult::NotYetValid => "not_yet_valid",
            AuthResult::WrongIssuer => "wrong_issuer",
            AuthResult::WrongAudience => "wrong_audience",
            AuthResult::MissingClaim => "missing_claim",
            AuthResult::UnknownKey => "unknown_key",
            AuthResult::Refused => "refused",
            AuthResult::AuthServiceError => "auth_service_error",
            AuthResult::Busy => "busy",
            AuthResult::KeysUnavailable => "keys_unavailable",
        }
    }

    /// Its index in [`AuthResult::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_position_in_all() {
        for (i, r) in AuthResult::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{}", r.as_str());
        }
    }
}
