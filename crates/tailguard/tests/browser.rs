//! A real headless Chromium (Debian's `chromium`, driven over WebDriver by `chromedriver`,
//! both installed by `scripts/install-tools`): enough of a browser for the status page's
//! tests, with no crate and no download. Each [`Browser`] is a `chromedriver` child on a
//! port of its own choosing and one session with a fresh profile directory.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The flags every headless run gets: no sandbox (tests run as root), no GPU, and nothing
/// that reaches out to the network on its own.
const FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// One chromedriver and one browser session.
pub(crate) struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a session of a `width` x `height` window.
    pub(crate) fn start(width: u32, height: u32) -> Browser {
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/install-tools installs chromium-driver)");
        let stdout = driver.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let port: u16 = loop {
            let line = lines
                .next()
                .expect("chromedriver says its port")
                .expect("chromedriver's stdout");
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').parse().expect("a port");
            }
        };
        // Keep reading its output so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let profile = tempfile::tempdir().expect("profile dir");
        let mut args: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push(format!("--window-size={width},{height}"));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let created = browser.call(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
            }}})),
        );
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        browser
    }

    /// Opens `url` (waits for its load event).
    pub(crate) fn open(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        self.call("POST", &path, Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub(crate) fn eval(&self, script: &str) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        self.call("POST", &path, Some(json!({ "script": script, "args": [] })))
    }

    /// Waits until `script` returns `true` (at most `limit`); how long it took.
    pub(crate) fn wait_for(&self, what: &str, script: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if self.eval(script) == Value::Bool(true) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "the page never showed {what} within {limit:?}; it shows:\n{}",
                self.eval("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the window.
    pub(crate) fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let path = format!("/session/{}/screenshot", self.session);
        let value = self.call("GET", &path, None);
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().expect("base64 PNG"))
            .expect("valid base64")
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(self.addr).expect("connect to chromedriver");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .expect("write to chromedriver");
        // chromedriver keeps the connection open whatever `Connection` says: read the head,
        // then exactly the body its framing announces.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16384];
        let (head, body_start) = loop {
            let n = stream.read(&mut buf).expect("read chromedriver's answer");
            assert!(n > 0, "chromedriver closed the connection: {raw:?}");
            raw.extend_from_slice(&buf[..n]);
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break (
                    String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase(),
                    at + 4,
                );
            }
        };
        let chunked = head.contains("transfer-encoding: chunked");
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        loop {
            let body = &raw[body_start..];
            let complete = match length {
                Some(n) => body.len() >= n,
                None if chunked => body.windows(5).any(|w| w == b"0\r\n\r\n"),
                None => false,
            };
            if complete {
                break;
            }
            let n = stream.read(&mut buf).expect("read chromedriver's body");
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&raw[body_start..]).into_owned();
        let json_text = if chunked {
            dechunk(&text)
        } else {
            text.clone()
        };
        let answer: Value = serde_json::from_str(&json_text)
            .unwrap_or_else(|e| panic!("chromedriver sent no JSON ({e}): {text}"));
        let value = answer["value"].clone();
        assert!(
            value.get("error").is_none(),
            "{method} {path}: chromedriver refused: {value}"
        );
        value
    }
}

/// The payload of a chunked body.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call("DELETE", &path, None)
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
