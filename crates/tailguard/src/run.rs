//! `tailguard run` and `tailguard check`: build the gateway's runtimes from a config and wait
//! for shutdown.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `tailguard run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Config file (TOML). Without it the embedded default config is used.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

/// Arguments of `tailguard check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// Config file (TOML) to validate.
    #[arg(long, short)]
    config: PathBuf,
}

pub(crate) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("run is not built yet (config {:?})", args.config)
}

pub(crate) fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("check is not built yet (config {:?})", args.config)
}
