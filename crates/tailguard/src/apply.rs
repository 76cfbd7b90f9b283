//! A new config swapped into the running server, and its outcome logged: the one path of a
//! SIGHUP reload and of an etcd revision alike.

use tailguard_proxy::{Config, Error, Server};

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
