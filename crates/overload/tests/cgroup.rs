//! CPU accounting on fake cgroup trees (v2, v2 in a namespace, v1, hybrid root, none) and
//! the sampler's arithmetic, smoothing and failure handling.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use tailguard_overload::{
    CpuReader, CpuSampler, CpuSource, CpuSourceKind, CpuTotals, Error, MonotonicClock,
    SamplerHandle, Shedder, ShedderConfig, Smoothing,
};

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

const V2_MOUNT: &str = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

#[test]
fn v2_reads_the_process_own_cgroup_with_quota_and_cpuset() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(
        r,
        "proc/self/cgroup",
        "0::/system.slice/tailguard.service\n",
    );
    write(r, "proc/self/mountinfo", V2_MOUNT);
    let dir = "sys/fs/cgroup/system.slice/tailguard.service";
    write(
        r,
        &format!("{dir}/cpu.stat"),
        "usage_usec 1000000\nuser_usec 600000\nsystem_usec 400000\nnr_periods 10\nnr_throttled 0\nthrottled_usec 0\n",
    );
    write(r, &format!("{dir}/cpu.max"), "150000 100000\n");
    write(r, &format!("{dir}/cpuset.cpus.effective"), "0-3\n");
    // The root cgroup (the whole host) has different numbers: it must not be read.
    write(r, "sys/fs/cgroup/cpu.stat", "usage_usec 99999999999\n");

    let mut reader = CpuReader::detect(r, 8);
    assert_eq!(reader.kind(), &CpuSourceKind::CgroupV2 { dir: r.join(dir) });
    let got = reader.read().unwrap();
    assert_eq!(got.usage, Duration::from_secs(1));
    assert_eq!(got.throttled, Some(Duration::ZERO));
    assert_eq!(got.cores, 1.5, "min(cpuset 4, quota 1.5, affinity 8)");

    // 0.1875 s of CPU in 0.25 s of wall time on 1.5 cores is 50 %.
    let mut s = CpuSampler::new(Smoothing::Ewma { beta: 0.0 });
    s.update(Duration::from_millis(1000), Ok(got));
    write(
        r,
        &format!("{dir}/cpu.stat"),
        "usage_usec 1187500\nthrottled_usec 0\n",
    );
    let u = s.update(Duration::from_millis(1250), reader.read());
    assert_eq!(u, 500);

    // A tick with quota exhaustion reads as saturated, whatever the usage delta says.
    write(
        r,
        &format!("{dir}/cpu.stat"),
        "usage_usec 1200000\nthrottled_usec 5000\n",
    );
    assert_eq!(s.update(Duration::from_millis(1500), reader.read()), 1000);

    // Lifting the quota ("max") leaves cpuset and affinity.
    write(r, &format!("{dir}/cpu.max"), "max 100000\n");
    assert_eq!(reader.read().unwrap().cores, 4.0);
}

#[test]
fn v2_namespace_root_with_a_quota_is_our_own_cgroup() {
    // Inside a container with its own cgroup namespace, /proc/self/cgroup says "0::/" but the
    // mounted root has a cpu.max (the real host root has none).
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(r, "proc/self/cgroup", "0::/\n");
    write(r, "proc/self/mountinfo", V2_MOUNT);
    write(r, "sys/fs/cgroup/cpu.stat", "usage_usec 5\n");
    write(r, "sys/fs/cgroup/cpu.max", "200000 100000\n");
    let mut reader = CpuReader::detect(r, 16);
    assert!(matches!(reader.kind(), CpuSourceKind::CgroupV2 { .. }));
    assert_eq!(reader.read().unwrap().cores, 2.0);
}

#[test]
fn v2_bind_mounted_subtree_resolves_relative_to_the_mount_root() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(r, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    write(
        r,
        "proc/self/mountinfo",
        "40 30 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n",
    );
    write(r, "sys/fs/cgroup/ctr/cpu.stat", "usage_usec 42\n");
    let mut reader = CpuReader::detect(r, 2);
    assert_eq!(
        reader.kind(),
        &CpuSourceKind::CgroupV2 {
            dir: r.join("sys/fs/cgroup/ctr")
        }
    );
    assert_eq!(reader.read().unwrap().usage, Duration::from_micros(42));
}

#[test]
fn v1_reads_cpuacct_quota_and_cpuset() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(
        r,
        "proc/self/cgroup",
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n",
    );
    write(
        r,
        "proc/self/mountinfo",
        "25 24 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
         31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n\
         32 25 0:28 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n",
    );
    let cpu = "sys/fs/cgroup/cpu,cpuacct/docker/abc";
    write(r, &format!("{cpu}/cpuacct.usage"), "2500000000\n");
    write(r, &format!("{cpu}/cpu.cfs_quota_us"), "50000\n");
    write(r, &format!("{cpu}/cpu.cfs_period_us"), "100000\n");
    write(r, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-1\n");
    let mut reader = CpuReader::detect(r, 4);
    assert!(matches!(reader.kind(), CpuSourceKind::CgroupV1 { .. }));
    let got = reader.read().unwrap();
    assert_eq!(got.usage, Duration::from_millis(2500));
    assert_eq!(got.cores, 0.5);
    assert_eq!(got.throttled, None);
    // no quota: the cpuset decides
    write(r, &format!("{cpu}/cpu.cfs_quota_us"), "-1\n");
    assert_eq!(reader.read().unwrap().cores, 2.0);
}

#[test]
fn root_cgroups_fall_back_to_the_process_itself() {
    // This machine's layout: hybrid v1 + unified, everything at "/", no quota. The root
    // cgroup's usage is the whole host (load generator included); with no /proc/stat to
    // read our cores from, the process's own /proc/self/stat is the fallback.
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(
        r,
        "proc/self/cgroup",
        "4:memory:/x\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n",
    );
    write(
        r,
        "proc/self/mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
         33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n\
         41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
    );
    write(r, "sys/fs/cgroup/cpuacct/cpuacct.usage", "457949010969\n");
    write(r, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
    write(r, "sys/fs/cgroup/unified/cpu.stat", "usage_usec 1\n");
    write(
        r,
        "proc/self/stat",
        "11680 (tail guard) S 1 1 1 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 32785\n",
    );
    let mut reader = CpuReader::detect(r, 1);
    assert_eq!(
        reader.kind(),
        &CpuSourceKind::Proc {
            stat: r.join("proc/self/stat")
        }
    );
    let got = reader.read().unwrap();
    assert_eq!(
        got.usage,
        Duration::from_secs(3),
        "300 ticks at USER_HZ 100"
    );
    assert_eq!(got.cores, 1.0, "the affinity mask");
}

#[test]
fn root_cgroup_reads_the_busy_time_of_the_cores_we_may_run_on() {
    // Hybrid root layout, pinned to CPU 1 of 2: CPU 1's busy time is the signal (a
    // CPU-bound neighbour there leaves us nothing, even though our own usage is low);
    // CPU 0 (the load generator's) is not.
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(r, "proc/self/cgroup", "2:cpuacct:/\n1:cpu:/\n0::/\n");
    write(
        r,
        "proc/self/mountinfo",
        "33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n",
    );
    write(r, "sys/fs/cgroup/cpuacct/cpuacct.usage", "1\n");
    let stat = |cpu0_user: u64, cpu1_user: u64| {
        format!(
            "cpu  {} 0 0 0 0 0 0 0 0 0\ncpu0 {cpu0_user} 0 0 500 0 0 0 0 0 0\ncpu1 {cpu1_user} 5 10 400 7 1 2 3 0 0\nintr 1 2 3\n",
            cpu0_user + cpu1_user
        )
    };
    write(r, "proc/stat", &stat(1000, 100));
    let mut reader = CpuReader::detect_cpus(r, &[1]);
    assert_eq!(
        reader.kind(),
        &CpuSourceKind::HostCores {
            stat: r.join("proc/stat"),
            cpus: vec![1]
        }
    );
    let got = reader.read().unwrap();
    // user 100 + nice 5 + system 10 + irq 1 + softirq 2 + steal 3 = 121 ticks (idle and
    // iowait are not busy)
    assert_eq!(got.usage, Duration::from_millis(1210));
    assert_eq!(got.cores, 1.0);
    let mut s = CpuSampler::new(Smoothing::Ewma { beta: 0.0 });
    s.update(Duration::ZERO, Ok(got));
    // 25 ticks of CPU 1 in 250 ms: saturated, whatever CPU 0 did.
    write(r, "proc/stat", &stat(9000, 125));
    assert_eq!(s.update(Duration::from_millis(250), reader.read()), 1000);
    // A CPU missing from /proc/stat is an error, not a zero.
    let mut other = CpuReader::with_kind(
        CpuSourceKind::HostCores {
            stat: r.join("proc/stat"),
            cpus: vec![1, 7],
        },
        2,
    );
    assert!(matches!(other.read(), Err(Error::Parse { .. })));
}

#[test]
fn no_cgroup_files_at_all_uses_proc() {
    let t = tempfile::tempdir().unwrap();
    let mut reader = CpuReader::detect(t.path(), 2);
    assert!(matches!(reader.kind(), CpuSourceKind::Proc { .. }));
    // ...and a missing file is an error, not a zero.
    assert!(matches!(reader.read(), Err(Error::Read { .. })));
}

#[test]
fn a_failed_read_keeps_the_value_and_is_counted() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(r, "proc/self/cgroup", "0::/svc\n");
    write(r, "proc/self/mountinfo", V2_MOUNT);
    write(r, "sys/fs/cgroup/svc/cpu.stat", "usage_usec 0\n");
    let mut reader = CpuReader::detect(r, 1);
    let mut s = CpuSampler::new(Smoothing::Ewma { beta: 0.0 });
    s.update(Duration::ZERO, reader.read());
    write(r, "sys/fs/cgroup/svc/cpu.stat", "usage_usec 230000\n");
    assert_eq!(s.update(Duration::from_millis(250), reader.read()), 920);

    std::fs::remove_file(r.join("sys/fs/cgroup/svc/cpu.stat")).unwrap();
    assert_eq!(s.update(Duration::from_millis(500), reader.read()), 920);
    write(r, "sys/fs/cgroup/svc/cpu.stat", "garbage\n");
    assert!(matches!(reader.read(), Err(Error::Parse { .. })));
    assert_eq!(s.update(Duration::from_millis(750), reader.read()), 920);
    assert_eq!(s.errors(), 2);
}

/// Ticks for a step from idle to a saturated CPU to read >= 900.
fn ticks_to_detect(smoothing: Smoothing) -> u32 {
    let mut s = CpuSampler::new(smoothing);
    let q = Duration::from_millis(250);
    let totals = |n: u32| CpuTotals {
        usage: q * n,
        throttled: None,
        cores: 1.0,
    };
    s.update(Duration::ZERO, Ok(totals(0)));
    for n in 1..200 {
        if s.update(q * n, Ok(totals(n))) >= 900 {
            return n;
        }
    }
    panic!("never detected");
}

#[test]
fn gozero_smoothing_takes_twelve_seconds_to_see_saturation_ours_two_and_a_half() {
    // go-zero: int64(prev*0.95 + cur*0.05) per 250 ms tick. Research §1.2 says ~45 ticks
    // (11 s) from the continuous formula; the integer truncation makes it 47 (11.75 s).
    assert_eq!(ticks_to_detect(Smoothing::GoZero), 47);
    // tau = 1 s: beta = exp(-0.25); 1 - beta^n >= 0.9 at n = 10.
    assert_eq!(ticks_to_detect(Smoothing::adaptive()), 10);
}

#[test]
fn this_machine_has_a_readable_cpu_source() {
    let mut reader = CpuReader::system();
    let got = reader
        .read()
        .expect("the test process can read its own CPU time");
    assert!(got.cores >= 1.0);
}

#[test]
fn the_off_reader_reads_an_idle_cpu_on_the_affinity_cores() {
    let mut reader = CpuReader::with_kind(CpuSourceKind::Off, 3);
    let mut s = CpuSampler::new(Smoothing::Ewma { beta: 0.0 });
    for n in 0..4 {
        assert_eq!(s.update(Duration::from_millis(250) * n, reader.read()), 0);
    }
    assert_eq!((s.cores(), s.errors()), (3.0, 0));
    assert_eq!(CpuReader::off().kind(), &CpuSourceKind::Off);
}

/// A source that fails every read and reports each attempt.
struct Failing(mpsc::Sender<()>);

impl CpuSource for Failing {
    fn read(&mut self) -> Result<CpuTotals, Error> {
        let _ = self.0.send(());
        Err(Error::Parse {
            path: "/nowhere".into(),
            what: "a reading",
        })
    }
}

#[test]
fn sampler_thread_counts_failed_reads_and_never_reports_zero_as_a_reading() {
    let shedder = Shedder::new(ShedderConfig::adaptive()).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = SamplerHandle::spawn(
        shedder,
        Failing(tx),
        MonotonicClock,
        Smoothing::adaptive(),
        Duration::from_millis(10),
    )
    .unwrap();
    for _ in 0..3 {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the sampler reads");
    }
    assert!(handle.gauge().errors() >= 2, "failures are counted");
    assert_eq!(
        handle.gauge().millicpu(),
        0,
        "no reading ever became a value"
    );
    drop(handle); // joins the thread
    assert!(rx.try_iter().count() < 1000, "the thread stopped");
}

#[test]
fn sampler_thread_ticks_the_shedder_groups() {
    let shedder = Shedder::new(ShedderConfig::adaptive()).unwrap();
    let handle = SamplerHandle::spawn(
        shedder.clone(),
        CpuReader::system(),
        MonotonicClock,
        Smoothing::adaptive(),
        Duration::from_millis(250),
    )
    .unwrap();
    let group = shedder.group("g");
    // Ticks roll the window: after a few, the cap (10 x C + cores, C = 10 with no history)
    // is in place and refuses a normal request above it.
    let held: Vec<_> = (0..103)
        .map(|_| {
            group
                .admit(Duration::ZERO, tailguard_overload::Class::Critical)
                .unwrap()
        })
        .collect();
    let mut capped = false;
    for _ in 0..500 {
        if group
            .admit(Duration::ZERO, tailguard_overload::Class::Normal)
            .is_err()
        {
            capped = true;
            break;
        }
        std::thread::park_timeout(Duration::from_millis(20));
    }
    drop(held);
    drop(handle);
    assert!(capped, "{:?}", group.snapshot(Duration::ZERO));
}
