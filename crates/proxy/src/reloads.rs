//! The last config reloads and their outcome, kept for the status page: recorded by
//! whoever applies a config (a SIGHUP, an etcd revision), read by the exporter thread.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

/// Reloads kept: enough to see a run of failures and the last success before it.
const KEPT: usize = 10;

/// Longest error text kept per reload: the page lists it, the log has it whole.
const MAX_ERROR_BYTES: usize = 2000;

/// One reload: when, of what, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// When it was applied or rejected.
    pub at: SystemTime,
    /// What was loaded (a file path, `etcd:KEY@REV`).
    pub source: String,
    /// `None` if applied, else why not (every error, one per line).
    pub error: Option<String>,
}

/// The last 10 reloads, newest last. Only the reloading thread writes it and only the
/// exporter thread reads it: no serving thread ever takes its lock.
#[derive(Debug, Default)]
pub struct Reloads {
    recent: Mutex<VecDeque<Reload>>,
}

impl Reloads {
    /// Records a reload of `source` that was applied (`Ok`) or rejected with this error.
    pub fn record(&self, source: &str, outcome: Result<(), String>) {
        let error = outcome.err().map(|mut e| {
            if e.len() > MAX_ERROR_BYTES {
                let mut end = MAX_ERROR_BYTES;
                while !e.is_char_boundary(end) {
                    end -= 1;
                }
                e.truncate(end);
                e.push_str(" ...");
            }
            e
        });
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(Reload {
            at: SystemTime::now(),
            source: source.to_owned(),
            error,
        });
    }

    /// The kept reloads, oldest first.
    pub fn recent(&self) -> Vec<Reload> {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_ten_and_cuts_long_errors() {
        let reloads = Reloads::default();
        for i in 0..12 {
            reloads.record(&format!("f{i}"), Ok(()));
        }
        reloads.record("bad", Err("é".repeat(1500)));
        let recent = reloads.recent();
        assert_eq!(recent.len(), 10);
        assert_eq!(recent[0].source, "f3");
        let error = recent[9].error.as_deref().unwrap();
        assert!(error.len() <= MAX_ERROR_BYTES + 4 && error.ends_with(" ..."));
    }
}
