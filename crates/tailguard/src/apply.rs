//! A new config swapped into the running server, and its outcome logged: the one path of a
//! SIGHUP reload and of an etcd revision alike.
//!
//! A reload runs on a thread of its own at nice 19 ([`off_serving_threads`]): parsing and
//! building a table of 100,000 routes takes about a second of CPU, and the main thread that
//! used to do it shares the cores with the serving threads as an equal, so a serving thread
//! on its core waited for it at every turn. At nice 19 it gets a small share of a busy core,
//! and a serving thread that wakes waits at most the rest of its short slice. Not
//! `SCHED_IDLE`, as the exporter: that runs only on an idle core, so a reload waited behind
//! any niced batch job on the host (14 s for 100,000 routes here beside a build at nice 19).

use tailguard_metrics::{Priority, set_thread_priority};
use tailguard_proxy::{Config, Error, Server};

/// Runs `work` (a reload: parse, build, swap) on a thread of its own at nice 19, inside
/// the calling thread's tokio runtime (built-in responders start on it), and waits for it:
/// the caller (the main thread) did the same work itself before, so nothing else waits
/// longer. Runs `work` on the calling thread if no thread can be started.
pub(crate) fn off_serving_threads<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let runtime = tokio::runtime::Handle::try_current().ok();
    let mut work = Some(work);
    let result = std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("tailguard-reload".into())
            .spawn_scoped(scope, || {
                let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
                set_thread_priority(Priority::Nice(19), "reload");
                work.take().map(|work| work())
            });
        match spawned {
            Ok(thread) => Some(
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            ),
            Err(e) => {
                tracing::warn!("cannot start a reload thread ({e}); reloading on the main thread");
                None
            }
        }
    });
    match result.flatten() {
        Some(done) => done,
        None => (work
            .take()
            .expect("the work runs on one thread or the other"))(),
    }
}

/// Swaps a loaded config in (the SIGHUP path, for a file or an etcd revision alike) and
/// logs the outcome; `running` names what keeps serving on failure. True if applied.
pub(crate) fn apply(
    server: &Server,
    name: &str,
    running: &str,
    loaded: Result<Config, Error>,
) -> bool {
    if loaded.is_err() {
        server.gateway().metrics().reloaded(false);
    }
    let result = loaded.and_then(|config| server.reload(config));
    let reloads = server.gateway().reloads();
    match result {
        Ok(()) => {
            reloads.record(name, Ok(()));
            tracing::info!("tailguard: reloaded {name}");
            true
        }
        Err(Error::Config(diags)) => {
            reloads.record(
                name,
                Err(diags
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")),
            );
            for d in &diags {
                tracing::error!("{d}");
            }
            tracing::error!(
                "tailguard: reload of {name} rejected ({} errors); {running} keeps serving",
                diags.len()
            );
            false
        }
        Err(e) => {
            reloads.record(name, Err(e.to_string()));
            tracing::error!("tailguard: reload of {name} failed: {e}; {running} keeps serving");
            false
        }
    }
}
