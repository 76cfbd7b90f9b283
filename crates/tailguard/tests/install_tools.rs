//! `scripts/install-tools` run for real in a sandbox: a `PATH` where every tool is missing, a
//! stand-in `apt-get` that asks `policy-rc.d` what Debian's `invoke-rc.d` would ask (may
//! nginx start?), and `$DPKG_ROOT` pointing at a temporary root, so the machine's own
//! `/usr/sbin/policy-rc.d` and packages are never touched (issue 22, item 7).

use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The policy file an earlier `policy-rc.d` of the machine would be: allows every start.
const MACHINE_POLICY: &str = "#!/bin/sh\n# the machine's own\nexit 0\n";

/// Commands that stop services; the sandbox's stand-ins record each call.
const STOPPERS: [&str; 4] = ["pkill", "killall", "systemctl", "service"];

/// A sandbox for one run of the script.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        std::fs::create_dir_all(dir.path().join("root/usr/sbin")).expect("root/usr/sbin");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        // Only what the script's install part runs; no promtool, etcd, valgrind..., so every
        // tool is missing and apt-get is called.
        for tool in ["bash", "chmod", "rm", "mktemp", "mkdir"] {
            symlink(on_path(tool), bin.join(tool)).expect("symlink a real tool");
        }
        let log = dir.path().join("calls.log");
        let log = log.display();
        // Root without being root: the script refuses to apt-get otherwise.
        script(&bin.join("id"), "echo 0\n");
        // Present, so the script does not `go install` it.
        script(&bin.join("h2spec"), "exit 0\n");
        std::fs::create_dir_all(dir.path().join("tmp")).expect("tmp");
        // A stand-in Go that records each call (from the directory it ran in) and builds
        // nothing; `go version -m` prints $FAKE_GO_VERSION_M, as the real one prints the
        // modules a binary was built from.
        script(
            &bin.join("go"),
            &format!(
                "echo \"go $* (in $PWD)\" >> {log}\n\
                 if [ \"$1\" = version ]; then printf '%s' \"$FAKE_GO_VERSION_M\"; fi\n\
                 exit 0\n"
            ),
        );
        // What invoke-rc.d and deb-systemd-invoke do when a package's postinst starts its
        // service: run policy-rc.d if it is executable, and start only on 0.
        script(
            &bin.join("apt-get"),
            &format!(
                "echo \"apt-get $*\" >> {log}\n\
                 [ \"$1\" = install ] || exit 0\n\
                 policy=\"$DPKG_ROOT/usr/sbin/policy-rc.d\"\n\
                 if [ -x \"$policy\" ]; then \"$policy\" nginx start; echo \"policy-rc.d nginx start: $?\" >> {log}\n\
                 else echo 'policy-rc.d: none' >> {log}; fi\n\
                 exit \"${{FAKE_APT_EXIT:-0}}\"\n"
            ),
        );
        // The ways to stop a service (bar bash's builtin kill): none may be called.
        for stopper in STOPPERS {
            script(
                &bin.join(stopper),
                &format!("echo \"{stopper} $*\" >> {log}\n"),
            );
        }
        Sandbox { dir }
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("root/usr/sbin/policy-rc.d")
    }

    /// `scripts/install-tools` in the sandbox: its tools, its home, its root.
    fn command(&self) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-tools");
        let mut cmd = Command::new(on_path("bash"));
        cmd.arg(script)
            .env_clear()
            .env("PATH", self.dir.path().join("bin"))
            .env("HOME", self.dir.path().join("home"))
            .env("DPKG_ROOT", self.dir.path().join("root"))
            .env("TMPDIR", self.dir.path().join("tmp"))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `scripts/install-tools` in the sandbox with `apt-get install` exiting `apt_exit`.
    fn run(&self, apt_exit: u8) -> Output {
        self.command()
            .env("FAKE_APT_EXIT", apt_exit.to_string())
            .output()
            .expect("run scripts/install-tools")
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default()
    }
}

fn on_path(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{tool} is not installed"))
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("write a stand-in");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Kills a child of the test on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn install_tools_forbids_service_starts_during_apt_get_and_stops_nothing() {
    let sandbox = Sandbox::new();
    // A process named nginx, as on a developer's machine that serves with nginx: the script
    // used to `pkill -x nginx` after installing anything. (The sandbox's pkill is a recording
    // stand-in; this one catches a stop by any other path.)
    let nginx = sandbox.dir.path().join("nginx");
    std::fs::copy(on_path("sleep"), &nginx).expect("copy sleep");
    let mut running = Running(
        Command::new(&nginx)
            .arg("600")
            .spawn()
            .expect("start the stand-in nginx"),
    );
    // Right after fork the child still bears the test thread's name: wait for the exec.
    let comm_path = format!("/proc/{}/comm", running.0.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let comm = std::fs::read_to_string(&comm_path).expect("comm");
        if comm.trim() == "nginx" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stand-in nginx never ran as nginx: {comm}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    let out = sandbox.run(0);
    assert!(out.status.success(), "{}", text(&out));
    let calls = sandbox.calls();
    assert!(
        calls.contains("policy-rc.d nginx start: 101"),
        "during apt-get install, policy-rc.d must forbid starts:\n{calls}\n{}",
        text(&out)
    );
    let install = calls
        .lines()
        .find(|l| l.starts_with("apt-get install"))
        .expect("apt-get install was called");
    assert!(install.contains(" valgrind"), "{install}");
    assert!(
        !sandbox.policy().exists(),
        "the script's policy-rc.d must be gone after the install"
    );
    for stopper in STOPPERS {
        assert!(
            !calls.lines().any(|l| l.starts_with(&format!("{stopper} "))),
            "the script must stop nothing:\n{calls}"
        );
    }
    assert_eq!(
        running.0.try_wait().expect("try_wait"),
        None,
        "the machine's nginx was stopped"
    );
}

#[test]
fn install_tools_removes_its_policy_rc_d_when_apt_get_fails() {
    let sandbox = Sandbox::new();
    let out = sandbox.run(100);
    assert_eq!(out.status.code(), Some(100), "{}", text(&out));
    let calls = sandbox.calls();
    assert!(calls.contains("policy-rc.d nginx start: 101"), "{calls}");
    assert!(
        !sandbox.policy().exists(),
        "a failed install must not leave the machine unable to start services"
    );
}

#[test]
fn install_tools_leaves_an_existing_policy_rc_d_alone() {
    let sandbox = Sandbox::new();
    let policy = sandbox.policy();
    std::fs::write(&policy, MACHINE_POLICY).expect("write the machine's policy");
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let out = sandbox.run(0);
    assert!(out.status.success(), "{}", text(&out));
    // The machine's policy decided (it allows the start), and it is still there, unchanged.
    assert!(
        sandbox.calls().contains("policy-rc.d nginx start: 0"),
        "{}",
        sandbox.calls()
    );
    assert_eq!(
        std::fs::read_to_string(&policy).expect("policy still there"),
        MACHINE_POLICY
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("policy-rc.d exists"),
        "{}",
        text(&out)
    );
}

#[test]
fn install_tools_removes_its_policy_rc_d_when_interrupted() {
    let sandbox = Sandbox::new();
    // An apt-get that hangs: the script is stopped with SIGTERM while it waits, as a Ctrl-C or
    // a CI timeout would.
    let marker = sandbox.dir.path().join("apt-started");
    script(
        &sandbox.dir.path().join("bin/apt-get"),
        &format!(
            "[ \"$1\" = install ] || exit 0\n: > {}\nexec /bin/sleep 600\n",
            marker.display()
        ),
    );
    let mut child = Running(
        sandbox
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("run scripts/install-tools"),
    );
    let start = Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "apt-get install never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sandbox.policy().exists(), "policy-rc.d during the install");
    // The whole group, as a terminal's Ctrl-C or `timeout` would: the script and its apt-get.
    let group = format!("-{}", child.0.id());
    let ok = Command::new(on_path("kill"))
        .args(["-TERM", "--", &group])
        .status()
        .expect("kill(1)")
        .success();
    assert!(ok, "kill -TERM {group}");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "install-tools did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert!(
        !sandbox.policy().exists(),
        "an interrupted install must not leave the machine unable to start services"
    );
}

#[test]
fn install_tools_builds_jaeger_as_a_tool_of_a_throwaway_module() {
    let sandbox = Sandbox::new();
    let out = sandbox.run(0);
    assert!(out.status.success(), "{}", text(&out));
    let calls = sandbox.calls();
    let go: Vec<&str> = calls.lines().filter(|l| l.starts_with("go ")).collect();
    let home = sandbox.dir.path().join("home");
    let tmp = sandbox.dir.path().join("tmp");
    let position = |wanted: &str| {
        go.iter()
            .position(|l| l.starts_with(wanted))
            .unwrap_or_else(|| panic!("no `{wanted}` among the Go calls:\n{calls}"))
    };
    let init = position("go mod init ");
    let get = position("go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0 ");
    let build = position(&format!(
        "go build -o {}/go/bin/jaeger github.com/jaegertracing/jaeger/cmd/jaeger ",
        home.display()
    ));
    assert!(init < get && get < build, "{calls}");
    // All three in one module made for the build, under $TMPDIR, never the working tree.
    let module = |line: &str| line.rsplit_once("(in ").map(|(_, dir)| dir.to_owned());
    let dir = module(go[get]).expect("a directory");
    assert!(dir.starts_with(&tmp.display().to_string()), "{calls}");
    assert_eq!(module(go[init]), Some(dir.clone()), "{calls}");
    assert_eq!(module(go[build]), Some(dir.clone()), "{calls}");
    assert!(
        std::fs::read_dir(&tmp).expect("tmp").next().is_none(),
        "the throwaway module must be removed"
    );
    // Caddy is for lab machines only.
    assert!(!calls.contains("caddy"), "{calls}");
}

#[test]
fn install_tools_keeps_a_jaeger_built_from_the_same_version() {
    let sandbox = Sandbox::new();
    let out = sandbox
        .command()
        .env("FAKE_APT_EXIT", "0")
        .env(
            "FAKE_GO_VERSION_M",
            "jaeger: go1.26.8\n\tpath\tgithub.com/jaegertracing/jaeger/cmd/jaeger\n\
             \tdep\tgithub.com/jaegertracing/jaeger\tv1.76.0\th1:x=\n",
        )
        .output()
        .expect("run scripts/install-tools");
    assert!(out.status.success(), "{}", text(&out));
    let calls = sandbox.calls();
    assert!(calls.contains("go version -m "), "{calls}");
    assert!(
        !calls.contains("go get"),
        "a current jaeger is not rebuilt:\n{calls}"
    );
    assert!(!calls.contains("go build"), "{calls}");

    // One built from another version is rebuilt.
    let sandbox = Sandbox::new();
    let out = sandbox
        .command()
        .env("FAKE_APT_EXIT", "0")
        .env(
            "FAKE_GO_VERSION_M",
            "\tdep\tgithub.com/jaegertracing/jaeger\tv1.75.0\th1:x=\n",
        )
        .output()
        .expect("run scripts/install-tools");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        sandbox
            .calls()
            .contains("go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0"),
        "{}",
        sandbox.calls()
    );
}

#[test]
fn install_tools_builds_caddy_on_lab_machines() {
    let sandbox = Sandbox::new();
    let out = sandbox
        .command()
        .env("FAKE_APT_EXIT", "0")
        .env("TAILGUARD_LAB_TOOLS", "1")
        .output()
        .expect("run scripts/install-tools");
    assert!(out.status.success(), "{}", text(&out));
    let calls = sandbox.calls();
    assert!(
        calls.contains("go install github.com/caddyserver/caddy/v2/cmd/caddy@v2.11.9"),
        "{calls}"
    );
}
