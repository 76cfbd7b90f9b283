//! Credentials made with the real tools, for the authentication tests and benches: private
//! keys from the `openssl` CLI, htpasswd files from Apache's `htpasswd`.

use std::path::Path;
use std::process::{Command, Stdio};

/// A private key made by `openssl genpkey ARGS` in `dir` (as `NAME.pem`), returned as PKCS#8
/// DER, the form ring reads (`genpkey -outform DER` writes an EC key in its traditional form).
pub fn openssl_pkcs8(dir: &Path, name: &str, args: &[&str]) -> Vec<u8> {
    let pem = dir.join(format!("{name}.pem"));
    let der = dir.join(format!("{name}.der"));
    let status = Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&pem)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl genpkey {args:?}");
    let status = Command::new("openssl")
        .args(["pkcs8", "-topk8", "-nocrypt", "-outform", "DER", "-in"])
        .arg(&pem)
        .arg("-out")
        .arg(&der)
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl pkcs8 {name}");
    std::fs::read(der).expect("the key file")
}

/// Adds `user` to the htpasswd `file` with the real `htpasswd` in `format` (`-B` at cost 4,
/// `-m`, `-s`), creating the file if needed.
pub fn htpasswd_add(file: &Path, format: &str, user: &str, password: &str) {
    let mut cmd = Command::new("htpasswd");
    cmd.arg(if file.exists() { "-b" } else { "-cb" })
        .arg(format);
    if format == "-B" {
        // The lowest cost: the tests are about the format, not the hash's strength.
        cmd.args(["-C", "4"]);
    }
    let out = cmd
        .arg(file)
        .args([user, password])
        .output()
        .expect("htpasswd runs (apache2-utils; scripts/install-tools installs it)");
    assert!(out.status.success(), "htpasswd: {out:?}");
}
