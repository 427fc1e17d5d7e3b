//! `drove report`: the flags, the run read (drove-report's `RunData`, from a
//! store folder or a coordinator), the report written, and one line saying
//! where. The charts, the page and the verdict are `drove_report`'s.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use drove_report::Source;

/// Settings of `drove report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Read a coordinator's store folder directly (as kept by `drove run
    /// --store DIR`); safe while a coordinator serves it.
    #[arg(long, value_name = "DIR", conflicts_with = "coordinator")]
    store: Option<PathBuf>,
    /// Coordinator address, host:port [default: $DROVE_COORDINATOR].
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Bearer token, if the coordinator requires one [default: $DROVE_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// The run [default: the newest the coordinator knows].
    #[arg(long, value_name = "ID")]
    run: Option<String>,
    /// Folder to write into (created): index.html, report.json, and each
    /// chart as NAME.png and NAME.svg.
    #[arg(long, value_name = "DIR", default_value = "report")]
    out: PathBuf,
}

/// `drove report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let source = match &args.store {
        Some(dir) => Source::Store(dir),
        None => {
            let addr = match &args.coordinator {
                Some(a) => a.clone(),
                None => drove_launch::coordinator_from_env().ok_or_else(|| {
                    anyhow!(
                        "no run source given: pass --store DIR, or --coordinator HOST:PORT (or set \
                         DROVE_COORDINATOR)"
                    )
                })?,
            };
            let token = crate::parse::token_or_env(args.token.as_deref());
            // The address, token and CA (DROVE_TLS_CA) as every drove client reads them.
            Source::Coordinator(drove_launch::connection(&addr, token.as_deref()))
        }
    };
    let run = drove_report::load(&source, args.run.as_deref())?;
    let written = drove_report::write(&run, &args.out)?;
    println!(
        "wrote {} ({} chart(s) of run {:?}, {}; {} points)",
        written.index.display(),
        written.charts.len(),
        run.run_id,
        run.state,
        run.points.len()
    );
    Ok(())
}
