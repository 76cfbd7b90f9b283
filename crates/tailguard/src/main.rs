//! The `tailguard` binary: parses the command line and hands each subcommand to its crate.
//!
//! This file is glue only. `run`, `check` and `config` belong to the gateway (`tailguard-proxy`,
//! wired in `run.rs`); `load`, `lab` and `upstream` belong to the lab (`tailguard-lab`),
//! which shares no code with the gateway it measures.

mod allocator;
mod apply;
mod bootstrap;
mod config_cmd;
mod etcd;
mod etcd_cache;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: every proxied request allocates and frees a few dozen
/// small blocks (hyper's heads and channels, the request's futures) on its serving thread,
/// and glibc's allocator spent about a tenth of that thread's user CPU on them, in
/// `malloc_consolidate` and `unlink_chunk` among others (perf,
/// `docs/benchmarks/2026-11-22-proxy-cpu/`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// tailguard: an HTTP API gateway whose observability and overload protection cost the
/// requests nothing.
#[derive(Debug, Parser)]
#[command(name = "tailguard", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (on the embedded default config when no --config is given).
    // Boxed: its flags make it twice the size of the next largest (clippy's
    // large_enum_variant).
    Run(Box<run::RunArgs>),
    /// Validate a config file and print every error with file, line and column.
    Check(run::CheckArgs),
    /// Store a validated config in etcd for a fleet of gateways (`push`), or print it (`get`).
    Config(config_cmd::ConfigArgs),
    /// Open-loop, constant-rate load generator with full latency distributions.
    Load(tailguard_lab::cli::LoadArgs),
    /// Rerun a field report's experiment on this machine (scenarios under lab/scenarios).
    Lab(tailguard_lab::cli::LabArgs),
    /// A built-in upstream for tests and benchmarks (fixed body, delay, CPU burn, errors).
    Upstream(tailguard_lab::cli::UpstreamArgs),
    /// HTTP/2 resource attacks for the lab (slow readers, held request streams), loopback
    /// only (lab/h2-attacks.sh).
    H2Attack(tailguard_lab::h2_attack::AttackArgs),
}

fn main() -> ExitCode {
    // `tailguard load --scrape` starts this executable again as its scraper process.
    tailguard_loadgen::scraper_process::run_if_child();
    // The main thread loads config and handles signals: the metrics shards are left to the
    // serving threads, whose records are then plain stores.
    tailguard_metrics::use_shared_shard();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => {
            allocator::give_back_freed_memory();
            run::run(*args)
        }
        Command::Check(args) => run::check(args),
        Command::Config(args) => config_cmd::config(args),
        Command::Load(args) => tailguard_lab::cli::load(args),
        Command::Lab(args) => tailguard_lab::cli::lab(args),
        Command::Upstream(args) => tailguard_lab::cli::upstream(args),
        Command::H2Attack(args) => {
            tailguard_lab::h2_attack::attack(&args).map(|_| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("tailguard: {err:#}");
            ExitCode::FAILURE
        }
    }
}
