//! `drove-coordinator`: serves drove's control plane (rendezvous, weights,
//! metrics, health, reflection) until SIGINT or SIGTERM.
//!
//! Configuration: defaults < `--config FILE` (TOML) < `DROVE_*` environment < flags.

use clap::Parser;

/// The drove coordinator.
#[derive(Debug, Parser)]
#[command(name = "drove-coordinator", version, about)]
struct Args {
    #[command(flatten)]
    flags: drove_coordinator::Flags,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    drove_coordinator::run_until_signal(&args.flags)?;
    Ok(())
}
