//! A compact JWS (RFC 7515 §7.1) taken apart and checked against a key set: the header's
//! refusals of RFC 8725 (the JWT Best Current Practices) first, then the signature.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::jwk::{Alg, KeySet};
use crate::result::AuthResult;

/// The largest token looked at: 16 KiB (a token is a header value; anything longer is not
/// one a key server signed, and decoding it would be work for an attacker's bytes).
pub const MAX_TOKEN: usize = 16 * 1024;

/// A token whose signature verified, with its claims parsed.
#[derive(Debug)]
pub struct Verified {
    /// The claims set.
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// Why a token failed before its claims were looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Not a compact JWS, bad base64url, not JSON: `invalid`.
    Malformed,
    /// Refused by a rule: `none`, an algorithm not pinned or unknown, `jku`/`x5u`/`jwk`,
    /// an unknown `crit`: `refused`.
    Refused,
    /// No key with the token's `kid` (the caller may refetch the key set): `unknown_key`.
    UnknownKey,
    /// No key allowed verified the signature: `invalid_signature`.
    BadSignature,
}

impl Failure {
    /// The result it is counted as.
    pub fn result(self) -> AuthResult {
        match self {
            Failure::Malformed => AuthResult::Invalid,
            Failure::Refused => AuthResult::Refused,
            Failure::UnknownKey => AuthResult::UnknownKey,
            Failure::BadSignature => AuthResult::InvalidSignature,
        }
    }
}

/// Header parameters the gateway never trusts (RFC 8725 §3.10 and the Security
/// Considerations of RFC 7515 §10): a key or a key's location named by the token itself. A
/// token carrying one is refused, not verified with our keys anyway: a key server that
/// signs such tokens is misconfigured, and an attacker's token should fail loudly.
const UNTRUSTED: [&str; 3] = ["jku", "x5u", "jwk"];

/// Splits and verifies `token` with `keys` (and `secret` for HS*), allowing only `pinned`
/// algorithms.
pub fn verify(
    token: &[u8],
    pinned: &[Alg],
    keys: Option<&KeySet>,
    secret: Option<&crate::jwk::Key>,
) -> Result<Verified, Failure> {
    if token.len() > MAX_TOKEN {
        return Err(Failure::Malformed);
    }
    let token = std::str::from_utf8(token).map_err(|_| Failure::Malformed)?;
    let mut parts = token.split('.');
    let (Some(h64), Some(p64), Some(s64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Failure::Malformed);
    };
    let header = decode_json(h64)?;
    let alg = header
        .get("alg")
        .and_then(|a| a.as_str())
        .ok_or(Failure::Malformed)?;
    // `none` in any spelling, and any name that is not exactly an algorithm we verify.
    let alg = Alg::parse(alg).ok_or(Failure::Refused)?;
    if !pinned.contains(&alg) {
        return Err(Failure::Refused);
    }
    if UNTRUSTED.iter().any(|p| header.contains_key(*p)) {
        return Err(Failure::Refused);
    }
    // RFC 7515 §4.1.11: a `crit` the recipient does not understand must be refused; this
    // verifier understands no extension.
    if header.contains_key("crit") {
        return Err(Failure::Refused);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(serde_json::Value::String(k)) => Some(k.as_str()),
        Some(_) => return Err(Failure::Malformed),
    };
    let sig = URL_SAFE_NO_PAD
        .decode(s64)
        .map_err(|_| Failure::Malformed)?;
    let input = &token.as_bytes()[..h64.len() + 1 + p64.len()];
    let verified = if alg.is_hmac() {
        secret.is_some_and(|k| k.verify(alg, input, &sig))
    } else {
        let keys = keys.ok_or(Failure::UnknownKey)?;
        if let Some(k) = kid
            && !keys.has_kid(k)
        {
            return Err(Failure::UnknownKey);
        }
        keys.candidates(kid).any(|k| k.verify(alg, input, &sig))
    };
    if !verified {
        return Err(Failure::BadSignature);
    }
    Ok(Verified {
        claims: decode_json(p64)?,
    })
}

/// The `alg` a token's header names, if it is one the gateway knows: a peek before
/// [`verify`], to decide where the check runs (nothing is trusted from it).
pub fn header_alg(token: &[u8]) -> Option<Alg> {
    if token.len() > MAX_TOKEN {
        return None;
    }
    let h64 = token.split(|b| *b == b'.').next()?;
    let header = decode_json(std::str::from_utf8(h64).ok()?).ok()?;
    Alg::parse(header.get("alg")?.as_str()?)
}

fn decode_json(part: &str) -> Result<serde_json::Map<String, serde_json::Value>, Failure> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| Failure::Malformed)?;
    match serde_json::from_slice(&bytes) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(Failure::Malformed),
    }
}

/// What the claims must say (RFC 7519 §4.1), checked at `now` (seconds since the epoch).
#[derive(Debug, Clone, Default)]
pub struct ClaimRules {
    /// `iss` must equal this.
    pub issuer: Option<String>,
    /// `aud` (a string or an array) must contain one of these.
    pub audiences: Vec<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway_s: u64,
    /// Claims that must be present (`403` when missing).
    pub required: Vec<String>,
}

/// A NumericDate claim: absent, or a JSON number (RFC 7519 §2); a string is an error.
fn numeric_date(
    claims: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<Option<f64>, AuthResult> {
    match claims.get(name) {
        None => Ok(None),
        Some(serde_json::Value::Number(n)) => n.as_f64().map(Some).ok_or(AuthResult::Invalid),
        Some(_) => Err(AuthResult::Invalid),
    }
}

impl ClaimRules {
    /// Checks `claims` at `now`; `Ok` with the token's `exp` (for the cache).
    pub fn check(
        &self,
        claims: &serde_json::Map<String, serde_json::Value>,
        now: u64,
    ) -> Result<Option<u64>, AuthResult> {
        let now = now as f64;
        let leeway = self.leeway_s as f64;
        let exp = numeric_date(claims, "exp")?;
        let nbf = numeric_date(claims, "nbf")?;
        numeric_date(claims, "iat")?;
        if let Some(exp) = exp
            && now >= exp + leeway
        {
            return Err(AuthResult::Expired);
        }
        if let Some(nbf) = nbf
            && now + leeway < nbf
        {
            return Err(AuthResult::NotYetValid);
        }
        if let Some(iss) = &self.issuer
            && claims.get("iss").and_then(|v| v.as_str()) != Some(iss.as_str())
        {
            return Err(AuthResult::WrongIssuer);
        }
        if !self.audiences.is_empty() {
            let ok = match claims.get("aud") {
                Some(serde_json::Value::String(a)) => self.audiences.contains(a),
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .filter_map(|v| v.as_str())
                    .any(|a| self.audiences.iter().any(|w| w == a)),
                _ => false,
            };
            if !ok {
                return Err(AuthResult::WrongAudience);
            }
        }
        if self.required.iter().any(|c| !claims.contains_key(c)) {
            return Err(AuthResult::MissingClaim);
        }
        Ok(exp.map(|e| (e + leeway).max(0.0) as u64))
    }
}
