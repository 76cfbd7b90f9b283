//! `tailguard config push` and `tailguard config get`: store a config document in etcd only
//! once it validates, and print what is stored. etcd unreachable or refusing (TLS,
//! authentication) exits 69 (`EX_UNAVAILABLE`), as `run` does at start; `push` then says
//! nothing was written.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use tailguard_config::Config;

use crate::bootstrap::{EtcdArgs, Settings};
use crate::etcd::{Failure, connect, read};
use crate::run::EX_UNAVAILABLE;

/// Arguments of `tailguard config`.
#[derive(Debug, clap::Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ConfigCommand {
    /// Validate FILE like `tailguard check` and, only if it is valid, store it in etcd; prints
    /// the new revision.
    Push(PushArgs),
    /// Print the config document stored in etcd (its revision goes to stderr).
    Get(GetArgs),
}

#[derive(Debug, clap::Args)]
struct PushArgs {
    /// Config file (TOML) to validate and store.
    file: PathBuf,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Write only if the key's revision is still N (0: only if the key does not exist yet),
    /// so two operators cannot overwrite each other's change unseen.
    #[arg(long, value_name = "N")]
    expect_revision: Option<i64>,
}

#[derive(Debug, clap::Args)]
struct GetArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
}

/// Runs `tailguard config ...`.
pub(crate) fn config(args: ConfigArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a runtime")?;
    match args.command {
        ConfigCommand::Push(push_args) => {
            // Validate before touching etcd: an invalid file is never stored.
            if let Err(e) = Config::load(&push_args.file).map_err(tailguard_proxy::Error::from) {
                crate::run::print_errors(&e);
                eprintln!("tailguard: nothing written to etcd");
                return Ok(ExitCode::from(crate::run::EX_USAGE));
            }
            let Some(settings) = settings(&push_args.etcd)? else {
                return Ok(ExitCode::from(crate::run::EX_USAGE));
            };
            let text = std::fs::read(&push_args.file)
                .with_context(|| format!("reading {}", push_args.file.display()))?;
            runtime.block_on(push(&settings, text, push_args.expect_revision))
        }
        ConfigCommand::Get(get_args) => {
            let Some(settings) = settings(&get_args.etcd)? else {
                return Ok(ExitCode::from(crate::run::EX_USAGE));
            };
            runtime.block_on(get(&settings))
        }
    }
}

/// The etcd settings, or `None` after printing why there are none.
fn settings(args: &EtcdArgs) -> anyhow::Result<Option<Settings>> {
    match args.settings() {
        Ok(Some(s)) => Ok(Some(s)),
        Ok(None) => {
            eprintln!(
                "tailguard: name the etcd key: --etcd URL --etcd-key KEY, or --bootstrap FILE"
            );
            Ok(None)
        }
        Err(e) => {
            crate::run::print_errors(&e);
            Ok(None)
        }
    }
}

async fn push(settings: &Settings, text: Vec<u8>, expect: Option<i64>) -> anyhow::Result<ExitCode> {
    match try_push(settings, text, expect).await {
        Ok(code) => Ok(code),
        Err(message) => {
            // Unreachable, or refused (TLS, authentication): no write was made.
            eprintln!("tailguard: {message}; nothing written");
            Ok(ExitCode::from(EX_UNAVAILABLE))
        }
    }
}

async fn try_push(
    settings: &Settings,
    text: Vec<u8>,
    expect: Option<i64>,
) -> Result<ExitCode, String> {
    let key = settings.key.as_str();
    let mut client = with_timeout(settings, connect(settings)).await?;
    let write = |e: &tailguard_etcd::Error| Failure::from_etcd(&format!("write {key}"), e);
    let revision = match expect {
        None => {
            let response = with_timeout(settings, async {
                client.put(key, text).await.map_err(|e| write(&e))
            })
            .await?;
            response.revision()
        }
        Some(expected) => {
            // A key that does not exist has mod revision 0, so `0` means "create only". A
            // transaction: compare the mod revision, put if equal, else read the key.
            let response = with_timeout(settings, async {
                client
                    .put_if_mod_revision(key, text, expected)
                    .await
                    .map_err(|e| write(&e))
            })
            .await?;
            if !response.succeeded {
                let actual = response
                    .first_range()
                    .and_then(|r| r.kvs.first())
                    .map_or(0, |kv| kv.mod_revision);
                eprintln!(
                    "tailguard: etcd:{key} is at revision {actual}, not the expected {expected}; \
                     nothing written"
                );
                return Ok(ExitCode::FAILURE);
            }
            response.revision()
        }
    };
    eprintln!("tailguard: stored {}", settings.source_name(revision));
    println!("{revision}");
    Ok(ExitCode::SUCCESS)
}

async fn get(settings: &Settings) -> anyhow::Result<ExitCode> {
    let key = settings.key.as_str();
    let read = async {
        let mut client = with_timeout(settings, connect(settings)).await?;
        with_timeout(settings, read(&mut client, key)).await
    };
    let (store_revision, kv) = match read.await {
        Ok(r) => r,
        Err(message) => {
            // Unreachable, or refused (TLS, authentication): as `run` at start.
            eprintln!("tailguard: {message}");
            return Ok(ExitCode::from(EX_UNAVAILABLE));
        }
    };
    let Some(kv) = kv else {
        eprintln!("tailguard: etcd key {key} does not exist (etcd revision {store_revision})");
        return Ok(ExitCode::FAILURE);
    };
    eprintln!("tailguard: {}", settings.source_name(kv.mod_revision));
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(&kv.value).context("writing to stdout")?;
    out.flush().context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// An etcd call bounded by the settings' timeout; its failure as one line naming the
/// endpoints.
async fn with_timeout<T, E: std::fmt::Display>(
    settings: &Settings,
    future: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    let at = settings.endpoints.join(",");
    match tokio::time::timeout(settings.timeout, future).await {
        Ok(r) => r.map_err(|e| format!("etcd at {at}: {e}")),
        Err(_) => Err(format!(
            "etcd at {at}: no answer within {} ms",
            settings.timeout.as_millis()
        )),
    }
}
