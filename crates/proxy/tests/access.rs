//! By address: `allow` / `deny` of routes and listeners through the real gateway, from real
//! IPv4 and IPv6 loopback peers (127.0.0.1, 127.0.0.2, ::1), with `X-Forwarded-For` from a
//! trusted and from an untrusted proxy.

use std::net::{IpAddr, SocketAddr};

use tailguard_test_support::Upstream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support;

/// One `GET` on a new connection from `from` (port 0) to `to`, with `extra` header lines;
/// the response's status and body.
async fn get_from(from: &str, to: SocketAddr, path: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let from: IpAddr = from.parse().expect("source address");
    let socket = match from {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the source");
    let mut c = socket.connect(to).await.expect("connect");
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n");
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).await.expect("request");
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).await.expect("response");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn addr_of(server: &tailguard_proxy::Server, i: usize) -> SocketAddr {
    server.local_addrs()[i]
}

#[tokio::test]
async fn a_routes_lists_pass_and_refuse_ipv4_and_ipv6_loopback_peers() {
    let upstream = Upstream::start().await;
    let (server, _) = support::start(support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[listeners]]\naddress = \"[::1]:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"v4\"\nupstream = \"up\"\npath = {{ prefix = \"/v4\" }}\n\
         allow = [\"127.0.0.0/8\"]\n\n\
         [[routes]]\nid = \"v6\"\nupstream = \"up\"\npath = {{ prefix = \"/v6\" }}\n\
         allow = [\"::1\"]\n\n\
         [[routes]]\nid = \"not-two\"\nupstream = \"up\"\npath = {{ prefix = \"/not-two\" }}\n\
         deny = [\"127.0.0.2\"]\n\n\
         [[routes]]\nid = \"deny-wins\"\nupstream = \"up\"\npath = {{ prefix = \"/deny-wins\" }}\n\
         deny = [\"127.0.0.2\", \"::1\"]\nallow = [\"127.0.0.0/8\", \"::/0\"]\n\n\
         [[routes]]\nid = \"open\"\nupstream = \"up\"\n",
        upstream.addr
    )));
    let v4 = addr_of(&server, 0);
    let v6 = addr_of(&server, 1);
    assert!(v6.is_ipv6(), "{v6}");
    let cases: [(&str, SocketAddr, &str, u16); 14] = [
        ("127.0.0.1", v4, "/v4", 200),
        ("127.0.0.2", v4, "/v4", 200),
        ("::1", v6, "/v4", 403),
        ("127.0.0.1", v4, "/v6", 403),
        ("::1", v6, "/v6", 200),
        ("127.0.0.1", v4, "/not-two", 200),
        ("127.0.0.2", v4, "/not-two", 403),
        ("::1", v6, "/not-two", 200),
        ("127.0.0.1", v4, "/deny-wins", 200),
        ("127.0.0.2", v4, "/deny-wins", 403),
        ("::1", v6, "/deny-wins", 403),
        ("127.0.0.1", v4, "/open", 200),
        ("127.0.0.2", v4, "/open", 200),
        ("::1", v6, "/open", 200),
    ];
    for (from, to, path, want) in cases {
        let (status, body) = get_from(from, to, path, &[]).await;
        assert_eq!(status, want, "{from} {path}: {body}");
        let expected = if want == 403 { "forbidden\n" } else { "ok" };
        assert_eq!(body, expected, "{from} {path}");
    }
    // Counted as refusals of the client's, by route.
    let text = support::metrics_text(&server);
    let denied = text
        .lines()
        .find(|l| l.starts_with("tailguard_errors_total{") && l.contains("kind=\"address_denied\""))
        .unwrap_or_else(|| panic!("no address_denied series:\n{text}"));
    assert!(denied.contains("blame=\"downstream\""), "{denied}");
    assert!(denied.ends_with(" 5"), "{denied}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("tailguard_requests_total{")
                && l.contains("route=\"deny-wins\"")
                && l.contains("status=\"403\"")),
        "{text}"
    );
}

#[tokio::test]
async fn a_listeners_lists_refuse_before_routing() {
    let upstream = Upstream::start().await;
    let (server, _) = support::start(support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\ndeny = [\"127.0.0.2\"]\n\n\
         [[listeners]]\naddress = \"[::1]:0\"\nallow = [\"10.0.0.0/8\"]\n\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"echo\"\nupstream = \"up\"\npath = {{ prefix = \"/echo\" }}\n",
        upstream.addr
    )));
    let (guarded, v6, open) = (
        addr_of(&server, 0),
        addr_of(&server, 1),
        addr_of(&server, 2),
    );
    assert_eq!(get_from("127.0.0.1", guarded, "/echo", &[]).await.0, 200);
    // Refused before routing: a path no route matches is a 403 too, not a 404.
    assert_eq!(get_from("127.0.0.2", guarded, "/echo", &[]).await.0, 403);
    assert_eq!(get_from("127.0.0.2", guarded, "/nothing", &[]).await.0, 403);
    assert_eq!(get_from("127.0.0.1", guarded, "/nothing", &[]).await.0, 404);
    assert_eq!(get_from("::1", v6, "/echo", &[]).await.0, 403);
    // `/healthz` is every listener's own and asks no one's address.
    assert_eq!(get_from("::1", v6, "/healthz", &[]).await.0, 200);
    // Another listener of the same gateway, without lists, is open to the same peer.
    assert_eq!(get_from("127.0.0.2", open, "/echo", &[]).await.0, 200);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_address_decides_and_from_anyone_else_the_peer() {
    let upstream = Upstream::start().await;
    // 127.0.0.1 is the operator's proxy; 127.0.0.2 is not.
    let (server, _) = support::start(support::config(&format!(
        "trusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\"]\n\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"partners\"\nupstream = \"up\"\npath = {{ prefix = \"/partners\" }}\n\
         allow = [\"203.0.113.0/24\", \"2001:db8::/32\"]\n\n\
         [[routes]]\nid = \"public\"\nupstream = \"up\"\npath = {{ prefix = \"/public\" }}\n\
         deny = [\"198.51.100.0/24\"]\n",
        upstream.addr
    )));
    let gw = addr_of(&server, 0);
    let xff = |v| [("X-Forwarded-For", v)];
    let cases: [(&str, &str, Option<&str>, u16); 13] = [
        // From the trusted proxy: the address it forwarded.
        ("127.0.0.1", "/partners", Some("203.0.113.9"), 200),
        ("127.0.0.1", "/partners", Some("2001:db8::5"), 200),
        ("127.0.0.1", "/partners", Some("198.51.100.1"), 403),
        // A client's own spoofed element on the left is never read: the nearest untrusted
        // element (what our proxy saw) decides.
        (
            "127.0.0.1",
            "/partners",
            Some("203.0.113.9, 198.51.100.1"),
            403,
        ),
        // Trusted hops (10.0.0.0/8) are skipped to the client behind them.
        ("127.0.0.1", "/partners", Some("203.0.113.9, 10.1.1.1"), 200),
        (
            "127.0.0.1",
            "/partners",
            Some("198.51.100.1, 10.1.1.1"),
            403,
        ),
        // Without the field the trusted peer itself is the client (not in `allow`).
        ("127.0.0.1", "/partners", None, 403),
        ("127.0.0.1", "/public", Some("198.51.100.7"), 403),
        ("127.0.0.1", "/public", Some("203.0.113.9"), 200),
        // From a peer that is not a trusted proxy the field is the client's own words: the
        // peer decides, whatever it claims.
        ("127.0.0.2", "/partners", Some("203.0.113.9"), 403),
        ("127.0.0.2", "/partners", None, 403),
        ("127.0.0.2", "/public", Some("198.51.100.7"), 200),
        ("127.0.0.2", "/public", None, 200),
    ];
    for (from, path, forwarded, want) in cases {
        let extra: &[(&str, &str)] = match forwarded {
            Some(v) => &xff(v)[..],
            None => &[],
        };
        let extra = extra.to_vec();
        let (status, body) = get_from(from, gw, &format!("{path}/echo"), &extra).await;
        assert_eq!(status, want, "{from} {path} {forwarded:?}: {body}");
    }
    // Several field lines are one list: the last line holds the nearest hops.
    let (status, _) = get_from(
        "127.0.0.1",
        gw,
        "/partners/echo",
        &[
            ("X-Forwarded-For", "198.51.100.1"),
            ("X-Forwarded-For", "203.0.113.9"),
        ],
    )
    .await;
    assert_eq!(status, 200);
}

#[test]
fn bad_allow_and_deny_lists_are_reported_where_they_are() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"
deny = ["10.0.0.0/33"]

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "a"
upstream = "up"
allow = ["::1", "nope"]

[[routes]]
id = "b"
upstream = "up"
allow = []

[[routes]]
id = "c"
upstream = "up"
deny = [7]
"#;
    let errors = support::config_errors(text);
    let expected = [
        "gw.toml:3:9: listeners[0].deny[0]: invalid CIDR \"10.0.0.0/33\": the prefix length must be 0-32",
        "gw.toml:12:17: routes[0].allow[1]: invalid CIDR \"nope\": not an IP address",
        "gw.toml:17:9: routes[1].allow: an empty `allow` would refuse every address; leave it out to allow every address",
        "gw.toml:22:9: routes[2]: invalid type: integer `7`, expected a string",
    ];
    assert_eq!(errors, expected);
}
