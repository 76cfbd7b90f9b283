//! The access-log settings each listener logs with (its own `access_log` table, else the
//! top-level `[access_log]`), and their checks.

use tailguard_access_log::{Config as LogConfig, Output};

use crate::listener::ListenerConfig;

/// The settings each listener logs with: its own `access_log` table, else `top`.
pub fn effective<'a>(top: &'a LogConfig, listeners: &'a [ListenerConfig]) -> Vec<&'a LogConfig> {
    listeners
        .iter()
        .map(|l| l.access_log.as_ref().unwrap_or(top))
        .collect()
}

/// The problems of `[access_log]` (`top`) and the listeners' own, as `(field, message)`.
pub fn check(top: &LogConfig, listeners: &[ListenerConfig]) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    if let Err(e) = top.validate() {
        problems.push(("access_log".to_owned(), e.to_string()));
    }
    for (i, l) in listeners.iter().enumerate() {
        if let Some(own) = &l.access_log
            && let Err(e) = own.validate()
        {
            problems.push((format!("listeners[{i}].access_log"), e.to_string()));
        }
    }
    // One file, one writer: two listeners may share a path only with the same settings.
    let logs = effective(top, listeners);
    for (i, a) in logs.iter().enumerate() {
        if let Output::File(path) = &a.path
            && let Some(j) = logs[..i].iter().position(|b| b.path == a.path && b != a)
        {
            problems.push((
                format!("listeners[{i}].access_log"),
                format!(
                    "{} is also the access log of listeners[{j}], with different settings",
                    path.display()
                ),
            ));
        }
    }
    problems
}
