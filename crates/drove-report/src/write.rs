//! The report's files: every chart as SVG and PNG, `report.json` and the page.

use std::path::{Path, PathBuf};

use drove_proto::metric_names;
use serde::Serialize;

use crate::charts::{self, Chart};
use crate::{ReportError, RunData, RunVerdict, page};

/// What [`write()`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    /// The page: `index.html` in the folder.
    pub index: PathBuf,
    /// `report.json` beside it.
    pub json: PathBuf,
    /// The ids of the charts drawn, in page order (each as `ID.png` and `ID.svg`).
    pub charts: Vec<String>,
    /// The verdict on the page.
    pub verdict: RunVerdict,
    /// When the report was made, Unix milliseconds (in `report.json` and on the page).
    pub generated_unix_ms: i64,
}

/// What `report.json` holds: the header and every chart's data.
#[derive(Serialize)]
struct ReportJson<'a> {
    run: &'a RunData,
    verdict: &'a RunVerdict,
    generated_unix_ms: i64,
    charts: &'a [Chart],
}

/// Writes the report of `run` into the folder `out` (created): `index.html`,
/// `report.json`, and each chart as `ID.png` and `ID.svg`.
pub fn write(run: &RunData, out: &Path) -> Result<Written, ReportError> {
    std::fs::create_dir_all(out).map_err(|cause| ReportError::Io {
        what: "creating",
        path: out.to_path_buf(),
        cause,
    })?;
    let charts = charts::build(run);
    let verdict = RunVerdict::of(run, charts.iter().find(|c| c.id == metric_names::MASK_AGREEMENT));
    let mut svgs = Vec::with_capacity(charts.len());
    for chart in &charts {
        let drawn = |format| move |cause| ReportError::Draw { chart: chart.id.clone(), format, cause };
        let svg = chart.svg().map_err(drawn("SVG"))?;
        let png = chart.png().map_err(drawn("PNG"))?;
        save(&out.join(format!("{}.svg", chart.id)), svg.as_bytes())?;
        save(&out.join(format!("{}.png", chart.id)), &png)?;
        svgs.push(svg);
    }
    let generated_unix_ms = drove_store::now_ms();
    let json = ReportJson { run, verdict: &verdict, generated_unix_ms, charts: &charts };
    let json = serde_json::to_vec_pretty(&json).map_err(ReportError::Json)?;
    let json_path = out.join("report.json");
    save(&json_path, &json)?;
    let html = page::html(run, &verdict, &charts, &svgs, generated_unix_ms);
    let index = out.join("index.html");
    save(&index, html.as_bytes())?;
    tracing::debug!(run = %run.run_id, charts = charts.len(), out = %out.display(), "report written");
    Ok(Written {
        index,
        json: json_path,
        charts: charts.into_iter().map(|c| c.id).collect(),
        verdict,
        generated_unix_ms,
    })
}

/// Writes `bytes` to `path` through a temporary file, so that a reader (a
/// browser reloading the page of a live run) never sees half a file.
fn save(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial"));
    std::fs::write(&tmp, bytes).map_err(|cause| ReportError::Io {
        what: "writing",
        path: tmp.clone(),
        cause,
    })?;
    std::fs::rename(&tmp, path).map_err(|cause| ReportError::Rename {
        from: tmp,
        to: path.to_path_buf(),
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Point, RunState};
    use drove_diagnostic::Verdict;

    #[test]
    fn every_file_is_written_whole_and_named_in_what_comes_back() {
        let out = std::env::temp_dir().join(format!("drove-report-write-{}", std::process::id()));
        let point = |step: f64, value: f64| Point { name: "loss".into(), step, rank: 0, value };
        let run = RunData {
            run_id: "r".into(),
            state: RunState::Running,
            world_size: 1,
            joined: 1,
            restarts: 0,
            created_unix_ms: 0,
            updated_unix_ms: 0,
            events: Vec::new(),
            points: vec![point(1.0, 2.0), point(2.0, 1.5)],
        };
        let written = write(&run, &out).unwrap();
        assert_eq!((written.index, written.charts), (out.join("index.html"), vec!["loss".to_string()]));
        assert_eq!(written.verdict.status, Verdict::NotDiagnosed);
        let mut files: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["index.html", "loss.png", "loss.svg", "report.json"], "no partial file is left");
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&written.json).unwrap()).unwrap();
        assert_eq!(
            (&json["run"]["state"], &json["verdict"]["status"]),
            (&"running".into(), &"not_diagnosed".into())
        );
        assert_eq!(json["generated_unix_ms"], written.generated_unix_ms);
        std::fs::remove_dir_all(&out).unwrap();
    }
}
