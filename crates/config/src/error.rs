//! The config's one error type: a file that cannot be read, or the list of every problem
//! found in it.

use std::io;
use std::path::PathBuf;

use crate::diagnostic::{self, Diagnostic};

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config has errors; each one carries file, line, column and field.
    #[error("{}", diagnostic::lines(.0))]
    Config(Vec<Diagnostic>),
    /// The config file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}
