//! Propagation: W3C Trace Context (`traceparent`, `tracestate`; `tracestate` keys by Level
//! 2's grammar) read and written, and Zipkin's B3 single header (`b3`) read.
//!
//! Reading never fails: a malformed header is reported (so the caller can count it) and
//! treated as absent, which starts a new trace, as the W3C spec asks ("if the vendor failed
//! to parse traceparent, it MUST NOT attempt to parse tracestate"). `traceparent` wins over
//! `b3` when both are valid. A `tracestate` member that breaks the grammar is dropped alone,
//! the members beside it kept. Writing replaces `traceparent`, passes `tracestate` on (as
//! received when every member was valid) and removes `b3`, whose parent would name a span
//! the upstream never saw.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

use crate::context::SpanContext;
use crate::id::{SpanId, TraceId, parse_hex};

/// `traceparent`.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// `b3`.
pub static B3: HeaderName = HeaderName::from_static("b3");

/// The spec's bounds a vendor may apply to `tracestate` (W3C Trace Context §3.3.1.1: "at
/// most 32 list-members"; 512 bytes is the length a vendor may truncate to).
pub const TRACESTATE_MAX_BYTES: usize = 512;
/// See [`TRACESTATE_MAX_BYTES`].
pub const TRACESTATE_MAX_MEMBERS: usize = 32;

/// A context header, for counting the malformed ones (`header` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextHeader {
    /// `traceparent`.
    Traceparent,
    /// `tracestate`.
    Tracestate,
    /// `b3`.
    B3,
}

impl ContextHeader {
    /// Every header, in label order.
    pub const ALL: [ContextHeader; 3] = [
        ContextHeader::Traceparent,
        ContextHeader::Tracestate,
        ContextHeader::B3,
    ];

    /// The header's name, the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextHeader::Traceparent => "traceparent",
            ContextHeader::Tracestate => "tracestate",
            ContextHeader::B3 => "b3",
        }
    }
}

/// What a request's headers said about its trace.
#[derive(Debug, Clone, Default)]
pub struct Extracted {
    /// The caller's span, when a valid `traceparent` or `b3` named one.
    pub parent: Option<SpanContext>,
    /// A sampling decision without ids (`b3: 0`, `b3: 1`, `b3: d`).
    pub sampling_hint: Option<bool>,
    /// `tracestate`, kept as received (one header, members joined) less the members the
    /// grammar forbids, when `traceparent` was valid and the list within the bounds.
    pub tracestate: Option<HeaderValue>,
    /// Headers present but malformed, each flagged once.
    pub malformed: [bool; 3],
    /// A `tracestate` or `b3` header came (valid or not): [`inject_known`] then has
    /// something to remove.
    pub carried_tracestate_or_b3: bool,
    /// A `traceparent` header came (valid or not): [`inject_beside_line`] then has it to
    /// remove.
    pub carried_traceparent: bool,
}

impl Extracted {
    /// The malformed headers.
    pub fn malformed(&self) -> impl Iterator<Item = ContextHeader> + '_ {
        ContextHeader::ALL
            .into_iter()
            .zip(self.malformed)
            .filter_map(|(h, bad)| bad.then_some(h))
    }

    fn flag(&mut self, header: ContextHeader) {
        self.malformed[header as usize] = true;
    }
}

/// Reads `traceparent`, `tracestate` and `b3`.
pub fn extract(headers: &HeaderMap) -> Extracted {
    let mut out = Extracted::default();
    // One pass over the names first: most requests carry none of the three, and comparing
    // a handful of names costs less than hashing three for lookups that find nothing.
    let (mut parent_seen, mut b3_seen) = (false, false);
    for name in headers.keys() {
        if *name == TRACEPARENT {
            parent_seen = true;
            out.carried_traceparent = true;
        } else if *name == TRACESTATE {
            out.carried_tracestate_or_b3 = true;
        } else if *name == B3 {
            out.carried_tracestate_or_b3 = true;
            b3_seen = true;
        }
    }
    if !parent_seen && !b3_seen {
        return out;
    }
    let mut parents = headers.get_all(&TRACEPARENT).iter();
    if let Some(first) = parents.next() {
        // Two `traceparent` fields cannot be combined into one: invalid (§3.2).
        match (parents.next().is_none()).then(|| parse_traceparent(first.as_bytes())) {
            Some(Some(ctx)) => out.parent = Some(ctx),
            _ => out.flag(ContextHeader::Traceparent),
        }
    }
    if out.parent.is_some() {
        let (state, malformed) = tracestate(headers);
        out.tracestate = state;
        if malformed {
            out.flag(ContextHeader::Tracestate);
        }
        return out;
    }
    if let Some(b3) = headers.get(&B3) {
        match parse_b3(b3.as_bytes()) {
            Some(B3Value::Context(ctx)) => out.parent = Some(ctx),
            Some(B3Value::Decision(sampled)) => out.sampling_hint = Some(sampled),
            None => out.flag(ContextHeader::B3),
        }
    }
    out
}

/// Writes `traceparent` naming `ctx` (version 00) and `tracestate` as received; removes a
/// `b3` header.
pub fn inject(headers: &mut HeaderMap, ctx: &SpanContext, tracestate: Option<&HeaderValue>) {
    inject_known(headers, ctx, tracestate, true);
}

/// [`inject`] into the headers of the request [`extract`] read, knowing from
/// [`Extracted::carried_tracestate_or_b3`] whether there is anything to remove: when not,
/// two lookups are saved.
pub fn inject_known(
    headers: &mut HeaderMap,
    ctx: &SpanContext,
    tracestate: Option<&HeaderValue>,
    carried_tracestate_or_b3: bool,
) {
    headers.insert(TRACEPARENT.clone(), traceparent_value(ctx));
    // The `traceparent` that came, if any, was just replaced: nothing more to remove.
    inject_beside_line(headers, tracestate, false, carried_tracestate_or_b3);
}

/// [`inject_known`] for a request whose head is written by the gateway's own HTTP/1.1
/// client, which takes `traceparent` as a ready field line ([`traceparent_line`]) instead
/// of a map entry: removes a `traceparent` that came (`carried_traceparent`), and does the
/// rest as [`inject_known`] does. The usual request, which came with none of the three,
/// touches the map not at all.
#[inline]
pub fn inject_beside_line(
    headers: &mut HeaderMap,
    tracestate: Option<&HeaderValue>,
    carried_traceparent: bool,
    carried_tracestate_or_b3: bool,
) {
    if carried_traceparent {
        headers.remove(&TRACEPARENT);
    }
    if carried_tracestate_or_b3 {
        headers.remove(&TRACESTATE);
        headers.remove(&B3);
    }
    if let Some(state) = tracestate {
        headers.insert(TRACESTATE.clone(), state.clone());
    }
}

/// Bytes of a [`traceparent_line`].
pub const TRACEPARENT_LINE_LEN: usize = 70;

/// Bytes of `traceparent: ` at the start of a [`traceparent_line`].
const TRACEPARENT_NAME_LEN: usize = 13;

/// `traceparent: 00-{trace-id}-{parent-id}-{flags}\r\n`, the whole field line for an
/// HTTP/1.1 head.
pub fn traceparent_line(ctx: &SpanContext) -> [u8; TRACEPARENT_LINE_LEN] {
    // The digits written where they go: built from the value's bytes, the line was three
    // copies of them (0.1 % of the serving core at 1 % sampling, where every request pays
    // for its line and few for their spans).
    let mut line = *b"traceparent: 00-00000000000000000000000000000000-0000000000000000-00\r\n";
    crate::id::hex_into(&ctx.trace_id.0, &mut line[16..48]);
    crate::id::hex_into(&ctx.span_id.0, &mut line[49..65]);
    if ctx.sampled {
        line[67] = b'1';
    }
    line
}

/// `00-{trace-id}-{parent-id}-{flags}`: the value of [`traceparent_line`], one layout for
/// both.
pub fn traceparent_value(ctx: &SpanContext) -> HeaderValue {
    HeaderValue::from_bytes(&traceparent_line(ctx)[TRACEPARENT_NAME_LEN..TRACEPARENT_LINE_LEN - 2])
        .expect("hex digits and dashes are a valid header value")
}

/// Parses one `traceparent` value (W3C Trace Context Level 1 §3.2.2, and §4.3's rules for
/// versions this parser does not know).
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    // Optional whitespace around a field value is not part of it (RFC 9110 §5.5).
    let value = value.trim_ascii();
    if value.len() < 55 {
        return None;
    }
    let mut version = [0u8; 1];
    if !parse_hex(&value[0..2], &mut version) || version[0] == 0xff {
        return None;
    }
    match version[0] {
        // Version 00 is exactly 55 characters.
        0 if value.len() != 55 => return None,
        // A later version may be longer, but its fields start as 00's do and anything
        // after them is set off by a dash.
        0 => {}
        _ if value.len() > 55 && value[55] != b'-' => return None,
        _ => {}
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace_id = TraceId::from_hex(&value[3..35]).filter(TraceId::is_valid)?;
    let span_id = SpanId::from_hex(&value[36..52]).filter(SpanId::is_valid)?;
    let mut flags = [0u8; 1];
    if !parse_hex(&value[53..55], &mut flags) {
        return None;
    }
    Some(SpanContext {
        trace_id,
        span_id,
        sampled: flags[0] & 1 == 1,
    })
}

/// `tracestate`, every field joined with `,`, and whether it was malformed. A member the
/// grammar forbids (no `=`, a bad key or value) is dropped alone and the others go on
/// (Level 2's keys; the list is the members' own, §3.3.1.3); over the bounds the whole list
/// is dropped, as §3.3.1.1 allows. A list with nothing dropped goes on as received.
fn tracestate(headers: &HeaderMap) -> (Option<HeaderValue>, bool) {
    let mut fields = headers.get_all(&TRACESTATE).iter();
    let Some(first) = fields.next() else {
        return (None, false);
    };
    let rest: Vec<&HeaderValue> = fields.collect();
    let all = || std::iter::once(first).chain(rest.iter().copied());
    // Every non-empty member, trimmed: empty ones are allowed and do not count (§3.3.1.1).
    let members = || {
        all().flat_map(|field| {
            field
                .as_bytes()
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|m| !m.is_empty())
        })
    };
    let (mut kept, mut bytes, mut dropped) = (0, 0, false);
    for member in members() {
        if valid_member(member) {
            kept += 1;
            bytes += member.len();
        } else {
            dropped = true;
        }
    }
    if kept > TRACESTATE_MAX_MEMBERS || bytes > TRACESTATE_MAX_BYTES {
        return (None, true);
    }
    if kept == 0 {
        return (None, dropped);
    }
    if !dropped && rest.is_empty() {
        return (Some(first.clone()), false);
    }
    let mut joined = Vec::with_capacity(bytes + kept);
    if dropped {
        for member in members().filter(|m| valid_member(m)) {
            if !joined.is_empty() {
                joined.push(b',');
            }
            joined.extend_from_slice(member);
        }
    } else {
        for (i, field) in all().enumerate() {
            if i > 0 {
                joined.push(b',');
            }
            joined.extend_from_slice(field.as_bytes());
        }
    }
    // Every byte came from header values (a kept member's are printable ASCII): this fails
    // only for fields joined as received, which a `HeaderValue` already allowed.
    match HeaderValue::from_bytes(&joined) {
        Ok(v) => (Some(v), dropped),
        Err(_) => (None, true),
    }
}

/// `key=value` with the key and value grammars of §3.3.1.3.
fn valid_member(member: &[u8]) -> bool {
    let Some(eq) = member.iter().position(|&b| b == b'=') else {
        return false;
    };
    let (key, value) = (&member[..eq], &member[eq + 1..]);
    valid_key(key) && valid_value(value)
}

/// Level 2's key (§3.3.1.3.1): `(lcalpha / DIGIT) 0*255(keychar)`, where `keychar` is
/// `lcalpha / DIGIT / "_" / "-" / "*" / "/" / "@"`. Level 1's `tenant@system` form, with its
/// 241- and 14-character parts and `@` at most once, is a special case of it: `foo@=1`,
/// `a@b@c=1` and a 244-character key with `@` are valid now.
fn valid_key(key: &[u8]) -> bool {
    match key {
        [first, rest @ ..] => {
            key.len() <= 256
                && (first.is_ascii_lowercase() || first.is_ascii_digit())
                && rest.iter().all(|&c| {
                    c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || matches!(c, b'_' | b'-' | b'*' | b'/' | b'@')
                })
        }
        [] => false,
    }
}

fn valid_value(value: &[u8]) -> bool {
    // 1-256 printable characters except `,` and `=`, the last not a space.
    !value.is_empty()
        && value.len() <= 256
        && value.last() != Some(&b' ')
        && value
            .iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
}

/// What one `b3` value says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum B3Value {
    /// Ids (and maybe a decision; none means "sampled", as B3 defers to the receiver and
    /// tailguard's receiver honours it).
    Context(SpanContext),
    /// Only a decision: `0` (deny), `1` or `d` (debug: sampled).
    Decision(bool),
}

/// Parses `{traceid}-{spanid}[-{sampled}[-{parentspanid}]]` or a lone `{sampled}`
/// (openzipkin/b3-propagation, "Single Header"). A 64-bit trace id is padded on the left
/// with zeros to 128 bits.
pub fn parse_b3(value: &[u8]) -> Option<B3Value> {
    let value = value.trim_ascii();
    let decision = |s: &[u8]| match s {
        b"0" => Some(false),
        b"1" | b"d" => Some(true),
        _ => None,
    };
    if value.len() == 1 {
        return decision(value).map(B3Value::Decision);
    }
    let mut parts = value.split(|&b| b == b'-');
    let trace = parts.next()?;
    let span = parts.next()?;
    let sampled = match parts.next() {
        Some(s) => Some(decision(s)?),
        None => None,
    };
    if let Some(parent) = parts.next() {
        SpanId::from_hex(parent).filter(SpanId::is_valid)?;
    }
    if parts.next().is_some() {
        return None;
    }
    let trace_id = match trace.len() {
        32 => TraceId::from_hex(trace)?,
        16 => {
            let mut id = [0u8; 16];
            if !parse_hex(trace, &mut id[8..]) {
                return None;
            }
            TraceId(id)
        }
        _ => return None,
    };
    let ctx = SpanContext {
        trace_id: Some(trace_id).filter(TraceId::is_valid)?,
        span_id: SpanId::from_hex(span).filter(SpanId::is_valid)?,
        sampled: sampled.unwrap_or(true),
    };
    Some(B3Value::Context(ctx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    // The examples of W3C Trace Context Level 1 §3.2.2.
    const SPEC: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specs_example_parses_and_round_trips() {
        let ctx = parse_traceparent(SPEC.as_bytes()).expect("valid");
        assert_eq!(ctx.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id.to_string(), "00f067aa0ba902b7");
        assert!(ctx.sampled);
        assert_eq!(traceparent_value(&ctx).as_bytes(), SPEC.as_bytes());
        let unsampled =
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn version_00_rules() {
        for bad in [
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // uppercase
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // version ff is invalid
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // version 00 with more after it
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            // short, wrong separators, bad flags
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad}");
        }
        // Other flags than sampled are ignored.
        assert!(
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09").is_some()
        );
    }

    #[test]
    fn future_versions_are_read_as_00_when_they_keep_its_shape() {
        let ctx = parse_traceparent(
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        )
        .expect("a later version's extra fields are ignored");
        assert!(ctx.sampled);
        assert!(
            parse_traceparent(b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_some()
        );
        assert!(
            parse_traceparent(b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x")
                .is_none()
        );
    }

    #[test]
    fn extraction_keeps_tracestate_and_flags_malformed_headers() {
        let e = extract(&headers(&[
            ("traceparent", SPEC),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ]));
        assert!(e.parent.is_some());
        assert_eq!(
            e.tracestate.as_ref().expect("kept").as_bytes(),
            b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
        );
        assert_eq!(e.malformed().count(), 0);

        let e = extract(&headers(&[("traceparent", "00-zz"), ("tracestate", "a=b")]));
        assert!(e.parent.is_none() && e.tracestate.is_none());
        assert_eq!(
            e.malformed().collect::<Vec<_>>(),
            [ContextHeader::Traceparent]
        );

        let e = extract(&headers(&[("traceparent", SPEC), ("traceparent", SPEC)]));
        assert!(e.parent.is_none(), "two traceparent fields are invalid");

        let e = extract(&headers(&[("traceparent", SPEC), ("tracestate", "Bad=1")]));
        assert!(e.parent.is_some() && e.tracestate.is_none());
        assert_eq!(
            e.malformed().collect::<Vec<_>>(),
            [ContextHeader::Tracestate]
        );
    }

    #[test]
    fn tracestate_over_the_bounds_is_dropped() {
        let members: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        let e = extract(&headers(&[
            ("traceparent", SPEC),
            ("tracestate", &members.join(",")),
        ]));
        assert!(e.tracestate.is_none());
        let thirty_two = members[..32].join(",");
        let e = extract(&headers(&[
            ("traceparent", SPEC),
            ("tracestate", &thirty_two),
        ]));
        assert!(e.tracestate.is_some());
        let long = format!("a={}", "x".repeat(256));
        let e = extract(&headers(&[
            ("traceparent", SPEC),
            (
                "tracestate",
                &[long.clone(), long.replace("a=", "b=")].join(","),
            ),
        ]));
        assert!(e.tracestate.is_none(), "over 512 bytes");
        let e = extract(&headers(&[
            ("traceparent", SPEC),
            ("tracestate", "vendor@tenant1=x, ,b=y"),
        ]));
        assert!(
            e.tracestate.is_some(),
            "multi-tenant keys and empty members"
        );
    }

    /// The value `extract` passes on for these `tracestate` fields, and whether it flagged
    /// the header.
    fn state(fields: &[&str]) -> (Option<String>, bool) {
        let mut pairs = vec![("traceparent", SPEC)];
        pairs.extend(fields.iter().map(|f| ("tracestate", *f)));
        let e = extract(&headers(&pairs));
        let malformed = e.malformed().any(|h| h == ContextHeader::Tracestate);
        let value = e.tracestate.map(|v| v.to_str().expect("ascii").to_owned());
        (value, malformed)
    }

    /// Regression (issue 44): keys were checked by Level 1's `tenant@system` form (241 and
    /// 14 characters, one `@`, a system part that starts with a letter), so these were lost
    /// with every member beside them.
    #[test]
    fn tracestate_keys_follow_level_2s_grammar() {
        let long_tenant = format!("{}@v=1", "t".repeat(242));
        let long_system = format!("t@{}=1", "v".repeat(15));
        let longest = format!("{}=1", "z".repeat(256));
        for member in [
            "foo@=1",
            "a@b@c=1",
            "0abc=1",
            "foo@@bar=1",
            "foo@bar@baz=1",
            long_tenant.as_str(),
            long_system.as_str(),
            longest.as_str(),
        ] {
            let field = format!("{member},bar=2");
            assert_eq!(state(&[&field]), (Some(field.clone()), false), "{member}");
        }
        // The spec's test suite: every character a key and a value may hold.
        let key = "abcdefghijklmnopqrstuvwxyz0123456789_-*/";
        let value: String = (0x20u8..=0x7e)
            .filter(|c| !matches!(c, b',' | b'='))
            .map(char::from)
            .collect();
        for key in [key.to_owned(), format!("{key}@a-z0-9_-*/")] {
            let member = format!("{key}={value}");
            assert_eq!(state(&[&member]), (Some(member.clone()), false));
        }
    }

    /// A member the grammar forbids is dropped alone: the members beside it, in the same
    /// field or another, go on (in order, joined by `,`), and the header is counted as
    /// malformed.
    #[test]
    fn a_forbidden_tracestate_member_is_dropped_alone() {
        let too_long = format!("{}=1", "z".repeat(257));
        for bad in [
            "@foo=1",
            "FOO=1",
            "foo.bar=1",
            "foo =1",
            "_foo=1",
            "foo=",
            "foo=bar=baz",
            "foo",
            "=1",
            too_long.as_str(),
        ] {
            assert_eq!(
                state(&[&format!("a=1, {bad} ,b=2"), "c=3"]),
                (Some("a=1,b=2,c=3".to_owned()), true),
                "{bad}"
            );
            assert_eq!(state(&[bad]), (None, true), "{bad} alone");
        }
        // The bounds count the members kept: 32 of them and a bad one go on.
        let mut members: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        let kept = members.join(",");
        members.insert(7, "Bad=1".to_owned());
        assert_eq!(state(&[&members.join(",")]), (Some(kept), true));
    }

    #[test]
    fn b3_single_header() {
        let Some(B3Value::Context(c)) =
            parse_b3(b"80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90")
        else {
            panic!("valid b3");
        };
        assert_eq!(c.trace_id.to_string(), "80f198ee56343ba864fe8b2a57d3eff7");
        assert_eq!(c.span_id.to_string(), "e457b5a2e4d86bd1");
        assert!(c.sampled);
        let Some(B3Value::Context(c)) = parse_b3(b"64fe8b2a57d3eff7-e457b5a2e4d86bd1-0") else {
            panic!("64-bit trace id");
        };
        assert_eq!(c.trace_id.to_string(), "000000000000000064fe8b2a57d3eff7");
        assert!(!c.sampled);
        assert_eq!(parse_b3(b"0"), Some(B3Value::Decision(false)));
        assert_eq!(parse_b3(b"d"), Some(B3Value::Decision(true)));
        assert!(
            matches!(parse_b3(b"64fe8b2a57d3eff7-e457b5a2e4d86bd1-d"), Some(B3Value::Context(c)) if c.sampled)
        );
        for bad in [
            "2",
            "64fe8b2a57d3eff7",
            "64fe8b2a57d3eff7-e457b5a2e4d86bd1-x",
            "0000000000000000-e457b5a2e4d86bd1",
        ] {
            assert_eq!(parse_b3(bad.as_bytes()), None, "{bad}");
        }
        let e = extract(&headers(&[("b3", "0")]));
        assert_eq!((e.parent, e.sampling_hint), (None, Some(false)));
        let e = extract(&headers(&[("b3", "nonsense")]));
        assert_eq!(e.malformed().collect::<Vec<_>>(), [ContextHeader::B3]);
    }

    #[test]
    fn injection_replaces_traceparent_and_drops_b3() {
        let mut h = headers(&[("traceparent", SPEC), ("b3", "1"), ("tracestate", "old=1")]);
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: false,
        };
        let state = HeaderValue::from_static("congo=t61rcWkgMzE");
        inject(&mut h, &ctx, Some(&state));
        assert_eq!(parse_traceparent(h[&TRACEPARENT].as_bytes()), Some(ctx));
        assert_eq!(h[&TRACESTATE], state);
        assert!(h.get(&B3).is_none());
    }

    #[test]
    fn what_extract_saw_decides_what_inject_known_removes() {
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
        for incoming in [
            &[("b3", "1")][..],
            &[("tracestate", "orphan=1")],
            &[
                ("traceparent", "garbage"),
                ("tracestate", "a=1"),
                ("b3", "0"),
            ],
            &[("traceparent", SPEC), ("tracestate", "a=1")],
        ] {
            let mut h = headers(incoming);
            let found = extract(&h);
            assert!(found.carried_tracestate_or_b3, "{incoming:?}");
            inject_known(
                &mut h,
                &ctx,
                found.tracestate.as_ref(),
                found.carried_tracestate_or_b3,
            );
            assert_eq!(
                parse_traceparent(h[&TRACEPARENT].as_bytes()),
                Some(ctx),
                "{incoming:?}"
            );
            assert!(h.get(&B3).is_none(), "{incoming:?}");
            assert_eq!(
                h.get(&TRACESTATE),
                found.tracestate.as_ref(),
                "only a valid context's tracestate goes on: {incoming:?}"
            );
        }
        for incoming in [&[][..], &[("traceparent", SPEC)], &[("x-b3", "1")]] {
            assert!(!extract(&headers(incoming)).carried_tracestate_or_b3);
        }
    }

    #[test]
    fn the_line_and_what_is_left_in_the_map_say_what_inject_known_says() {
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
        for incoming in [
            &[][..],
            &[("x-other", "1")],
            &[("traceparent", "garbage")],
            &[("traceparent", SPEC), ("tracestate", "a=1")],
            &[("tracestate", "orphan=1"), ("b3", "1")],
        ] {
            let mut by_map = headers(incoming);
            let found = extract(&by_map);
            inject_known(
                &mut by_map,
                &ctx,
                found.tracestate.as_ref(),
                found.carried_tracestate_or_b3,
            );
            let mut by_line = headers(incoming);
            inject_beside_line(
                &mut by_line,
                found.tracestate.as_ref(),
                found.carried_traceparent,
                found.carried_tracestate_or_b3,
            );
            let line = traceparent_line(&ctx);
            let (name, value) = line
                .strip_suffix(b"\r\n")
                .and_then(|l| l.split_at_checked(13))
                .expect("a field line");
            assert_eq!(name, b"traceparent: ", "{incoming:?}");
            assert_eq!(value, by_map[&TRACEPARENT].as_bytes(), "{incoming:?}");
            // The map plus the line carry exactly the fields the map alone does.
            by_line.insert(
                TRACEPARENT.clone(),
                HeaderValue::from_bytes(value).expect("value"),
            );
            assert_eq!(by_line, by_map, "{incoming:?}");
        }
    }

    #[test]
    fn the_field_line_carries_the_value_and_its_flag() {
        for sampled in [false, true] {
            let ctx = SpanContext {
                trace_id: TraceId([0xa7; 16]),
                span_id: SpanId([0x3c; 8]),
                sampled,
            };
            let mut want = b"traceparent: ".to_vec();
            want.extend_from_slice(traceparent_value(&ctx).as_bytes());
            want.extend_from_slice(b"\r\n");
            assert_eq!(traceparent_line(&ctx).as_slice(), want, "sampled {sampled}");
        }
        let spelled_out = |sampled| SpanContext {
            trace_id: TraceId::from_hex(b"4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
            span_id: SpanId::from_hex(b"00f067aa0ba902b7").expect("hex"),
            sampled,
        };
        let line = traceparent_line(&spelled_out(false));
        assert_eq!(
            line.as_slice(),
            b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\r\n"
        );
        let sampled = traceparent_value(&spelled_out(true));
        assert_eq!(
            sampled.as_bytes(),
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_valid_context_round_trips(t in any::<u128>(), s in any::<u64>(), sampled in any::<bool>()) {
                prop_assume!(t != 0 && s != 0);
                let ctx = SpanContext { trace_id: TraceId(t.to_be_bytes()), span_id: SpanId(s.to_be_bytes()), sampled };
                prop_assert_eq!(parse_traceparent(traceparent_value(&ctx).as_bytes()), Some(ctx));
            }

            #[test]
            fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
                let _ = parse_traceparent(&bytes);
                let _ = parse_b3(&bytes);
            }

            #[test]
            fn one_changed_character_is_rejected_or_read_consistently(pos in 0usize..55, c in any::<u8>()) {
                let mut v = SPEC.as_bytes().to_vec();
                v[pos] = c;
                if let Some(ctx) = parse_traceparent(&v) {
                    // Whatever was accepted prints back to the same bytes (up to flags beyond sampled).
                    let back = traceparent_value(&ctx);
                    prop_assert_eq!(&back.as_bytes()[3..52], &v[3..52]);
                }
            }
        }
    }
}
