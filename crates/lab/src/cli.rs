//! Command-line entry points of the lab: `load`, `lab` and `upstream`.

use std::process::ExitCode;

/// Arguments of `tailguard load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Target URL.
    pub url: String,
}

/// Arguments of `tailguard lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// Scenario name.
    pub scenario: String,
}

/// Arguments of `tailguard upstream`.
#[derive(Debug, clap::Args)]
pub struct UpstreamArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: String,
}

/// Runs `tailguard load`.
pub fn load(args: LoadArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("load is not built yet ({})", args.url)
}

/// Runs `tailguard lab`.
pub fn lab(args: LabArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("lab is not built yet ({})", args.scenario)
}

/// Runs `tailguard upstream`.
pub fn upstream(args: UpstreamArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("upstream is not built yet ({})", args.listen)
}
