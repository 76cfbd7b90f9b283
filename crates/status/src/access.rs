//! Who may read the status page: anyone who reaches the metrics listener (the default: it
//! binds 127.0.0.1), holders of a bearer token, or users of an htpasswd file.
//!
//! A token guards `/status.json` only: the page itself holds no data, and a browser cannot
//! send a bearer token when it navigates, so the page reads the token from its URL's
//! fragment (`/status#token=...`, never sent to any server) or asks for it, and sends it with
//! each poll. HTTP Basic (htpasswd) guards both, and the browser asks for it once.
//!
//! bcrypt is slow by design (tens of milliseconds a check): a credential that passed is
//! remembered (at most [`REMEMBERED`], compared in constant time) so a page polling every
//! second costs one bcrypt, not one a second. Comparisons use `subtle`; bcrypt comes from
//! the `bcrypt` crate: nothing here is hand-written cryptography.

use std::collections::VecDeque;
use std::sync::Mutex;

use base64::Engine as _;
use http::HeaderMap;
use subtle::ConstantTimeEq as _;
use tailguard_config::StatusAccess;

/// Accepted Basic credentials remembered (a handful of people at once).
const REMEMBERED: usize = 16;

/// The realm a browser shows when it asks for a user and password.
pub(crate) const BASIC_CHALLENGE: &str = "Basic realm=\"tailguard status\", charset=\"UTF-8\"";

/// `WWW-Authenticate` of a refused token.
pub(crate) const BEARER_CHALLENGE: &str = "Bearer realm=\"tailguard status\"";

/// Who may read the page (see the module doc).
pub(crate) enum Access {
    Open,
    Token(Vec<u8>),
    Basic {
        users: Vec<(String, String)>,
        accepted: Mutex<VecDeque<Vec<u8>>>,
    },
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Access::Open => "Open",
            Access::Token(_) => "Token(..)",
            Access::Basic { .. } => "Basic(..)",
        })
    }
}

impl Access {
    pub(crate) fn new(access: StatusAccess) -> Access {
        match access {
            StatusAccess::Open => Access::Open,
            StatusAccess::Token(token) => Access::Token(token),
            StatusAccess::Htpasswd(users) => Access::Basic {
                users,
                accepted: Mutex::default(),
            },
        }
    }

    /// Whether the page itself (not only its JSON) needs credentials.
    pub(crate) fn guards_page(&self) -> bool {
        matches!(self, Access::Basic { .. })
    }

    /// The `WWW-Authenticate` of a refusal (`None`: nothing is refused).
    pub(crate) fn challenge(&self) -> Option<&'static str> {
        match self {
            Access::Open => None,
            Access::Token(_) => Some(BEARER_CHALLENGE),
            Access::Basic { .. } => Some(BASIC_CHALLENGE),
        }
    }

    /// Whether a request with these headers may read the data.
    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        match self {
            Access::Open => true,
            Access::Token(token) => given
                .and_then(|v| strip_scheme(v, b"bearer"))
                .is_some_and(|t| bool::from(t.ct_eq(token))),
            Access::Basic { users, accepted } => {
                let Some(value) = given else { return false };
                let mut remembered = accepted.lock().unwrap_or_else(|p| p.into_inner());
                // Every remembered value is compared, so the time says nothing of which.
                let known = remembered
                    .iter()
                    .fold(0u8, |any, a| any | a.as_slice().ct_eq(value).unwrap_u8());
                if known == 1 {
                    return true;
                }
                if !basic_matches(users, value) {
                    return false;
                }
                if remembered.len() == REMEMBERED {
                    remembered.pop_front();
                }
                remembered.push_back(value.to_vec());
                true
            }
        }
    }
}

/// The credentials after `scheme ` (the scheme case-insensitive, RFC 9110 §11.1).
fn strip_scheme<'a>(value: &'a [u8], scheme: &[u8]) -> Option<&'a [u8]> {
    let (name, rest) = value.split_at_checked(scheme.len())?;
    (name.eq_ignore_ascii_case(scheme) && rest.first() == Some(&b' '))
        .then(|| rest[1..].trim_ascii())
}

/// Whether `Basic base64(user:password)` names a user whose bcrypt hash the password
/// matches.
fn basic_matches(users: &[(String, String)], value: &[u8]) -> bool {
    let Some(encoded) = strip_scheme(value, b"basic") else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
        return false;
    };
    let Ok(decoded) = String::from_utf8(decoded) else {
        return false;
    };
    let Some((user, password)) = decoded.split_once(':') else {
        return false;
    };
    users
        .iter()
        .find(|(u, _)| u == user)
        .is_some_and(|(_, hash)| bcrypt::verify(password, hash).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, authorization.parse().unwrap());
        h
    }

    #[test]
    fn a_token_must_match_exactly() {
        let a = Access::new(StatusAccess::Token(b"s3cret".to_vec()));
        assert!(a.allows(&headers("Bearer s3cret")));
        assert!(a.allows(&headers("bearer s3cret")));
        assert!(!a.allows(&headers("Bearer s3cre")));
        assert!(!a.allows(&headers("Bearer s3crett")));
        assert!(!a.allows(&headers("Basic s3cret")));
        assert!(!a.allows(&HeaderMap::new()));
        assert!(!a.guards_page());
    }

    #[test]
    fn basic_checks_bcrypt_and_remembers_what_passed() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let a = Access::new(StatusAccess::Htpasswd(vec![("ops".into(), hash)]));
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert!(!a.allows(&headers(&format!("Basic {}", b64("ops:wrong")))));
        assert!(!a.allows(&headers(&format!("Basic {}", b64("other:pw")))));
        let good = format!("Basic {}", b64("ops:pw"));
        assert!(a.allows(&headers(&good)));
        let Access::Basic { accepted, .. } = &a else {
            unreachable!()
        };
        assert_eq!(accepted.lock().unwrap().len(), 1);
        assert!(a.allows(&headers(&good)), "remembered");
        assert_eq!(accepted.lock().unwrap().len(), 1);
        assert!(a.guards_page());
    }
}
