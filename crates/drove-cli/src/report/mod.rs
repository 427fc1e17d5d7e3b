//! `drove report`: one run as pictures. The run's points and events, read from
//! a coordinator or straight from its store folder, become charts (each written
//! as PNG and SVG, drawn with plotters) and one self-contained HTML page with a
//! header: the run's id, world size, state, options and the diversity verdict.
//!
//! It works while the run goes on (the charts hold the points so far) and after
//! it ended. `report.json` beside the page holds every chart's data, exactly as
//! drawn. An elastic run's changes of world are drawn from what it stored: its
//! `world_size` points as a chart, and its `reform` events as rules on the loss.
//!
//! - [`data`]: the run as read ([`data::RunData`]), from either source.
//! - [`charts`]: what is drawn ([`charts::Chart`]), built from the points, and
//!   the drawing itself.
//! - [`page`]: the HTML page.

pub mod charts;
pub mod data;
mod page;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use drove_proto::metric_names;
use serde::Serialize;

use charts::Chart;
use data::RunData;

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

/// Where the run is read from.
pub enum Source<'a> {
    /// A store folder, read in this process.
    Store(&'a Path),
    /// A coordinator, over gRPC.
    Coordinator {
        /// host:port or a URL.
        addr: String,
        /// Its bearer token, if any.
        token: Option<String>,
    },
}

/// Whether the ranks' masks were independent, as far as the run tells.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// `alarm` (the diversity alarm went off), `diverse` (every diagnosed
    /// step within the band), `outliers` (some steps outside it, no alarm) or
    /// `not_diagnosed`.
    pub status: &'static str,
    /// What it means, in words.
    pub text: String,
}

impl Verdict {
    /// The verdict of `run` and its mask-agreement chart, if any.
    pub fn of(run: &RunData, masks: Option<&Chart>) -> Verdict {
        if let Some(alarm) = run.events.iter().find(|e| e.kind == metric_names::event::DIVERSITY_ALARM) {
            return Verdict {
                status: "alarm",
                text: format!(
                    "Diversity alarm at step {} (rank {}): {}",
                    alarm.step, alarm.rank, alarm.message
                ),
            };
        }
        let Some((agreement, outside)) = masks.and_then(charts::outside_band) else {
            return Verdict {
                status: "not_diagnosed",
                text: "Masks not diagnosed: masking augmentation off, a single rank, or --diagnose-every 0."
                    .into(),
            };
        };
        let n = agreement.len();
        let mean = agreement.iter().sum::<f64>() / n as f64;
        if outside == 0 {
            Verdict {
                status: "diverse",
                text: format!(
                    "Independent masks: agreement within the 3-sigma band of independent masks at all {n} \
                     diagnosed step(s) (mean {mean:.4})."
                ),
            }
        } else {
            Verdict {
                status: "outliers",
                text: format!(
                    "{outside} of {n} diagnosed step(s) outside the 3-sigma band (mean agreement {mean:.4}), \
                     but no diversity alarm: the alarm judges every diagnosed step so far together."
                ),
            }
        }
    }
}

/// What `report.json` holds: the header and every chart's data.
#[derive(Serialize)]
struct ReportJson<'a> {
    run: &'a RunData,
    verdict: &'a Verdict,
    generated_unix_ms: i64,
    charts: &'a [Chart],
}

/// `drove report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let source = match &args.store {
        Some(dir) => Source::Store(dir),
        None => Source::Coordinator {
            addr: match &args.coordinator {
                Some(a) => a.clone(),
                None => std::env::var("DROVE_COORDINATOR").map_err(|_| {
                    anyhow::anyhow!(
                        "no run source given: pass --store DIR, or --coordinator HOST:PORT (or set \
                         DROVE_COORDINATOR)"
                    )
                })?,
            },
            token: crate::control::token_or_env(args.token.as_deref()),
        },
    };
    let run = data::load(&source, args.run.as_deref())?;
    let written = write(&run, &args.out)?;
    println!(
        "wrote {} ({} chart(s) of run {:?}, {}; {} points)",
        args.out.join("index.html").display(),
        written,
        run.run_id,
        run.state,
        run.points.len()
    );
    Ok(())
}

/// Writes the report of `run` into `out`; returns the number of charts.
pub fn write(run: &RunData, out: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let charts = charts::build(run);
    let verdict = Verdict::of(run, charts.iter().find(|c| c.id == metric_names::MASK_AGREEMENT));
    let mut svgs = Vec::with_capacity(charts.len());
    for chart in &charts {
        let svg = chart.svg().with_context(|| format!("drawing chart {:?} as SVG", chart.id))?;
        let png = chart.png().with_context(|| format!("drawing chart {:?} as PNG", chart.id))?;
        save(&out.join(format!("{}.svg", chart.id)), svg.as_bytes())?;
        save(&out.join(format!("{}.png", chart.id)), &png)?;
        svgs.push(svg);
    }
    let generated_unix_ms = drove_coordinator::store::now_ms();
    let json = ReportJson { run, verdict: &verdict, generated_unix_ms, charts: &charts };
    let json = serde_json::to_vec_pretty(&json).context("serialising report.json")?;
    save(&out.join("report.json"), &json)?;
    let html = page::html(run, &verdict, &charts, &svgs, generated_unix_ms);
    save(&out.join("index.html"), html.as_bytes())?;
    Ok(charts.len())
}

/// Writes `bytes` to `path` through a temporary file, so that a reader (a
/// browser reloading the page of a live run) never sees half a file.
fn save(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let Some(name) = path.file_name() else { bail!("{} is not a file path", path.display()) };
    let tmp = path.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
