//! Config parsing and validation: every error reported, with file:line:column and field.

use std::path::Path;

use tailguard_proxy::Config;

#[test]
fn embedded_default_is_valid_and_has_the_demo_upstream() {
    let c = Config::embedded_default();
    assert_eq!(c.listeners[0].address.get_ref(), "127.0.0.1:8080");
    assert!(
        c.upstreams
            .iter()
            .any(|u| u.name.get_ref() == "demo" && u.builtin.is_some())
    );
}

#[test]
fn reports_every_error_with_position_and_field() {
    let text = r#"
[[listeners]]
address = "not-an-address"

[[upstreams]]
name = "a"
endpoints = [{ address = "127.0.0.1:1", weight = 0 }]

[[upstreams]]
name = "a"
endpoints = [{ address = "127.0.0.1:2" }]

[[routes]]
id = "r"
upstream = "nope"

[[routes]]
id = "r"
upstream = "a"
path = { prefix = "no-slash" }
method = "get"

[[routes]]
id = "x"
upstream = "a"
colour = "blue"

[bogus]
"#;
    let errs = crate::support::config_errors(text);
    let expected = [
        "gw.toml:3:11: listeners[0].address: `not-an-address` is not an IP:PORT address",
        "gw.toml:7:50: upstreams[0].endpoints[0].weight: 0 is outside 1..=1000",
        "gw.toml:10:8: upstreams[1].name: duplicate upstream name `a`",
        "gw.toml:15:12: routes[0].upstream: unknown upstream `nope`",
        "gw.toml:18:6: routes[1].id: duplicate route id `r`",
        "gw.toml:20:8: routes[1].path: `no-slash` must start with `/`",
        "gw.toml:21:10: routes[1].method: `get` is not an uppercase HTTP method",
    ];
    for e in expected {
        assert!(
            errs.iter().any(|got| got == e),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert!(
        errs.iter()
            .any(|e| e.starts_with("gw.toml:26:1: routes[2]: unknown field `colour`")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("gw.toml:28:2: bogus: unknown section")),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 9, "{errs:#?}");
}

#[test]
fn syntax_errors_have_positions() {
    let errs = crate::support::config_errors("[[listeners]]\naddress = \"127.0.0.1:80\n");
    assert!(errs[0].starts_with("gw.toml:2:"), "{errs:?}");
}

#[test]
fn unreadable_certificate_is_reported() {
    let errs = crate::support::config_errors(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\ntls = { cert = \"/nonexistent/cert.pem\", key = \"/nonexistent/key.pem\" }\n",
    );
    assert!(
        errs[0]
            .starts_with("gw.toml:3:16: listeners[0].tls.cert: cannot read /nonexistent/cert.pem"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("gw.toml:3:47: listeners[0].tls.key: cannot read"),
        "{errs:?}"
    );
}

#[test]
fn override_upstream_replaces_builtin_and_rejects_unknown_names() {
    let mut c = Config::embedded_default();
    c.override_upstream("demo", &["127.0.0.1:9".parse().unwrap()])
        .unwrap();
    let demo = c
        .upstreams
        .iter()
        .find(|u| u.name.get_ref() == "demo")
        .unwrap();
    assert!(demo.builtin.is_none());
    assert_eq!(demo.endpoints[0].address.get_ref(), "127.0.0.1:9");
    let err = c.override_upstream("nope", &[]).unwrap_err().to_string();
    assert!(err.contains("no upstream named `nope`"), "{err}");
}

#[test]
fn docs_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.example.toml");
    let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.routes.len() >= 3);
}

#[test]
fn read_ms_parses_defaults_to_a_minute_and_a_misspelling_next_to_it_is_an_error() {
    let listener = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n";
    let parse = |rest: &str| {
        Config::parse(&format!("{listener}{rest}"), "gw.toml", Path::new("."))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(parse("").timeouts.read_ms, 60_000);
    assert_eq!(
        parse("[timeouts]\nrequest_ms = 5\n").timeouts.read_ms,
        60_000
    );
    let set = parse("[timeouts]\nread_ms = 1500\n").timeouts;
    assert_eq!((set.read_ms, set.request_ms), (1500, 30_000));
    assert_eq!(parse("[timeouts]\nread_ms = 0\n").timeouts.read_ms, 0);
    let errs = crate::support::config_errors(&format!(
        "{listener}[timeouts]\nread_ms = 1500\nread_timeout_ms = 1500\n"
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with("gw.toml:6:1: timeouts: unknown field `read_timeout_ms`"),
        "{errs:#?}"
    );
    let errs = crate::support::config_errors(&format!("{listener}[timeouts]\nread_ms = \"1s\"\n"));
    assert!(errs[0].contains("timeouts"), "{errs:#?}");
}

#[test]
fn trusted_proxies_are_networks_and_each_bad_one_is_reported_where_it_is() {
    let errs = crate::support::config_errors(
        "trusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\", \"::1\", \"nope\", 7]\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n",
    );
    assert_eq!(
        errs,
        [
            "gw.toml:1:34: trusted_proxies[1]: invalid CIDR \"10.0.0.0/33\": the prefix length must be 0-32",
            "gw.toml:1:56: trusted_proxies[3]: invalid CIDR \"nope\": not an IP address",
            "gw.toml:1:64: trusted_proxies[4]: expected a string, like \"10.0.0.0/8\"",
        ]
    );
}

#[test]
fn health_table_is_checked_with_position_and_field() {
    let text = r#"
[[listeners]]
address = "127.0.0.1:8080"

[[upstreams]]
name = "a"
endpoints = [{ address = "127.0.0.1:1" }]

[upstreams.health]
path = "health"
interval_ms = 0
healthy = 0
expect_status = ["200-299", "399-300", 700]
ejection_ms = 0
max_ejected_percent = 101

[[upstreams]]
name = "b"
endpoints = [{ address = "127.0.0.1:2" }]
health = { expect_status = "2xx" }

[[upstreams]]
name = "c"
endpoints = [{ address = "127.0.0.1:3" }]
health = { expect_status = [[200]] }

[[upstreams]]
name = "d"
endpoints = [{ address = "127.0.0.1:4" }]
health = { timeout = 5 }
"#;
    let errs = crate::support::config_errors(text);
    let expected = [
        "gw.toml:10:8: upstreams[0].health.path: `health` is not a request path (it must start with `/`)",
        "gw.toml:11:15: upstreams[0].health.interval_ms: must be at least 1",
        "gw.toml:12:11: upstreams[0].health.healthy: must be at least 1",
        "gw.toml:13:17: upstreams[0].health.expect_status: range `399-300` is empty (its start is above its end)",
        "gw.toml:14:15: upstreams[0].health.ejection_ms: must be at least 1 (set `consecutive_failures = 0` to disable ejection)",
        "gw.toml:15:23: upstreams[0].health.max_ejected_percent: 101 is outside 0..=100",
        "gw.toml:20:28: upstreams[1].health.expect_status: `2xx` is not a status or a range like \"200-399\"",
    ];
    for e in expected {
        assert!(
            errs.iter().any(|got| got == e),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert!(
        errs.iter().any(|e| e.starts_with("gw.toml:25:")
            && e.contains("upstreams[2]")
            && e.contains("a status (204), a range")),
        "{errs:#?}"
    );
    assert!(
        errs.iter().any(|e| e.starts_with("gw.toml:30:")
            && e.contains("upstreams[3]")
            && e.contains("unknown field `timeout`")),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), expected.len() + 2, "{errs:#?}");
}

#[test]
fn health_table_defaults_and_a_single_status() {
    let c = Config::parse(
        r#"
[[listeners]]
address = "127.0.0.1:8080"

[[upstreams]]
name = "a"
endpoints = [{ address = "127.0.0.1:1" }]
health = { path = "/ready?full=1", expect_status = 204 }

[[upstreams]]
name = "b"
endpoints = [{ address = "127.0.0.1:2" }]
health = { consecutive_failures = 0 }
"#,
        "gw.toml",
        Path::new("."),
    )
    .expect("valid");
    let a = c.upstreams[0]
        .health
        .as_ref()
        .expect("a has a health table");
    let check = a.active().expect("a path: active checks");
    assert_eq!(check.path, "/ready?full=1");
    assert_eq!(
        (check.interval.as_millis(), check.timeout.as_millis()),
        (5000, 1000)
    );
    assert_eq!((check.healthy, check.unhealthy), (2, 3));
    assert!(check.passes(204) && !check.passes(200));
    let ejection = a.ejection().expect("on by default");
    assert_eq!(
        (
            ejection.consecutive_failures,
            ejection.base.as_millis(),
            ejection.max_ejected_percent
        ),
        (5, 30_000, 50)
    );
    let b = c.upstreams[1]
        .health
        .as_ref()
        .expect("b has a health table");
    assert!(b.active().is_none() && b.ejection().is_none());
    // The default range.
    let default = Config::parse(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[upstreams]]\nname = \"a\"\n\
         endpoints = [{ address = \"127.0.0.1:1\" }]\nhealth = { path = \"/\" }\n",
        "gw.toml",
        Path::new("."),
    )
    .expect("valid");
    let check = default.upstreams[0]
        .health
        .as_ref()
        .unwrap()
        .active()
        .unwrap();
    assert!(check.passes(200) && check.passes(399) && !check.passes(400) && !check.passes(199));
}
