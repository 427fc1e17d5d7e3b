//! The report's HTML page: one file with everything in it (styles, the charts
//! as inline SVG), so that it can be mailed or attached to a ticket; links to
//! each chart's PNG and SVG beside it.

use std::fmt::Write as _;

use drove_proto::metric_names;
use drove_proto::v1::RunState;

use crate::charts::Chart;
use crate::{RunData, RunVerdict, utc};

/// `s` with `&`, `<`, `>` and quotes escaped for HTML text and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 24px auto; padding: 0 16px; max-width: 1000px; color: #222; }
h1 { font-size: 22px; margin: 0 0 12px; } h2 { font-size: 17px; margin: 24px 0 8px; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
table { border-collapse: collapse; font-size: 14px; }
td, th { padding: 3px 12px 3px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: normal; }
.verdict { padding: 10px 14px; border-radius: 4px; margin: 14px 0; font-size: 15px; }
.verdict.identical, .verdict.anticorrelated { background: #fde2e1; border-left: 5px solid #d62728; }
.verdict.outliers { background: #fff3dc; border-left: 5px solid #ff7f0e; }
.verdict.diverse { background: #e3f4e3; border-left: 5px solid #2ca02c; }
.verdict.not_diagnosed { background: #eef0f3; border-left: 5px solid #7f7f7f; }
.live { color: #1f77b4; font-weight: bold; }
figure { margin: 18px 0; } figure svg { width: 100%; height: auto; border: 1px solid #e5e5e5; }
figcaption { font-size: 13px; color: #555; }
details { font-size: 14px; margin: 8px 0; }
.missing { color: #777; font-size: 14px; }
";

/// The page's own check, for a browser or a test: every chart drawn and no
/// script error (`data-charts`, `data-errors` on `<body>`).
const CHECK: &str = "
window.addEventListener('error', function () {
  document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
});
window.addEventListener('load', function () {
  var drawn = 0;
  document.querySelectorAll('figure svg').forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    if (box.width > 0 && box.height > 0) { drawn += 1; }
  });
  document.body.dataset.charts = String(drawn);
  document.body.dataset.errors = document.body.dataset.errors || '0';
});
";

/// The whole page.
pub fn html(
    run: &RunData,
    verdict: &RunVerdict,
    charts: &[Chart],
    svgs: &[String],
    generated_ms: i64,
) -> String {
    let mut h = String::new();
    let id = escape(&run.run_id);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>drove report: {id}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
    );
    let _ = writeln!(h, "<h1>drove run <code>{id}</code></h1>");
    header(&mut h, run, generated_ms);
    let _ = writeln!(h, "<div class=\"verdict {}\">{}</div>", verdict.status.word(), escape(&verdict.text));
    options(&mut h, run);
    events(&mut h, run);
    if charts.is_empty() {
        let _ = writeln!(h, "<p class=\"missing\">No metric points recorded yet.</p>");
    }
    for (chart, svg) in charts.iter().zip(svgs) {
        let cid = escape(&chart.id);
        let _ = writeln!(
            h,
            "<figure id=\"chart-{cid}\">\n{svg}\n<figcaption>{} · <a href=\"{cid}.png\">PNG</a> · \
             <a href=\"{cid}.svg\">SVG</a></figcaption>\n</figure>",
            escape(&chart.title)
        );
    }
    for (missing, why) in [
        ("eval_", "No evaluation recorded (yet): sets are evaluated at the end of each epoch."),
        (metric_names::MASK_AGREEMENT, "No mask diagnostic recorded: see the verdict above."),
    ] {
        if !charts.iter().any(|c| c.id.starts_with(missing)) {
            let _ = writeln!(h, "<p class=\"missing\">{}</p>", escape(why));
        }
    }
    let _ = write!(h, "<script>{CHECK}</script>\n</body>\n</html>\n");
    h
}

fn header(h: &mut String, run: &RunData, generated_ms: i64) {
    let state = if matches!(run.state, RunState::Running | RunState::Rendezvous) {
        format!("<span class=\"live\">{}</span> (the points so far)", escape(run.state.word()))
    } else {
        escape(run.state.word())
    };
    let rows = [
        ("state", state),
        ("world size", format!("{} ({} joined)", run.world_size, run.joined)),
        ("restarts", run.restarts.to_string()),
        ("points", run.points.len().to_string()),
        ("started", format!("{} UTC", utc(run.created_unix_ms))),
        ("last change", format!("{} UTC", utc(run.updated_unix_ms))),
        ("report written", format!("{} UTC", utc(generated_ms))),
    ];
    h.push_str("<table class=\"facts\">\n");
    for (k, v) in rows {
        let _ = writeln!(h, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    h.push_str("</table>\n");
}

/// The options rank 0 recorded, as a table (nested values as JSON).
fn options(h: &mut String, run: &RunData) {
    let Some(options) = run.options() else {
        h.push_str("<p class=\"missing\">No options recorded (a run of an older drove, or not `drove train ner`).</p>\n");
        return;
    };
    let key: Vec<String> =
        ["seeding", "augment_mask", "batch_size", "lr", "epochs", "diagnose_every", "model"]
            .iter()
            .filter_map(|k| options.get(*k).map(|v| format!("{k} {}", shown(v))))
            .collect();
    let _ = writeln!(h, "<p class=\"key-options\"><code>{}</code></p>", escape(&key.join(" · ")));
    h.push_str("<details>\n<summary>Every option</summary>\n<table class=\"options\">\n");
    for (k, v) in &options {
        let _ = writeln!(h, "<tr><th>{}</th><td><code>{}</code></td></tr>", escape(k), escape(&shown(v)));
    }
    h.push_str("</table>\n</details>\n");
}

/// An option's value as shown: a string as it is, anything else as JSON.
fn shown(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// Events other than the options, oldest first.
fn events(h: &mut String, run: &RunData) {
    let events: Vec<_> = run.events.iter().filter(|e| e.kind != metric_names::event::OPTIONS).collect();
    if events.is_empty() {
        return;
    }
    h.push_str("<h2>Events</h2>\n<table class=\"events\">\n");
    for e in events {
        let _ = writeln!(
            h,
            "<tr><th>{} UTC</th><td>{} at step {} (rank {}): {}</td></tr>",
            utc(e.wall_time_unix_ms),
            escape(&e.kind),
            e.step,
            e.rank,
            escape(&e.message)
        );
    }
    h.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
