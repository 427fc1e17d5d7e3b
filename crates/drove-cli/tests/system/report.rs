//! `drove report`, end to end, on a real run: `drove run --np 2` of `drove
//! train ner` (MiniLM, a slice of CoNLL-2003, masking augmentation, every step
//! diagnosed, two epochs evaluated on `valid`) with its store kept.
//!
//! - During the run, a report from the store says `running` and agrees with
//!   the final one as far as it goes.
//! - After it: the PNGs decode at the chart size, are not blank and have more
//!   than a few colours; the SVGs parse as XML; the chart data (report.json)
//!   equal the stored points; headless Chromium (Debian's package, from
//!   `scripts/browser-tools.sh`) loads the page, every chart drawn and no
//!   script error, and screenshots it.
//! - The same report comes from a coordinator serving the store over gRPC.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{DROVE, Proc, assets, coordinator, free_port, run, text};
use drove_report::png;
use drove_store::{Agg, Filter, Store};
use serde_json::Value;

const RUN: &str = "report";
const STEPS: u64 = 20;
const DEADLINE: Duration = Duration::from_secs(300);

fn training(store: &Path, out: &Path) -> Proc {
    let a = assets();
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", "2", "--run-id", RUN, "--store"])
        .arg(store)
        .args(["--", DROVE, "train", "ner", "--augment-mask", "0.15", "--diagnose-every", "1"])
        .args(["--epochs", "2", "--max-train-sentences", "40", "--batch-size", "2", "--workers", "1"])
        .args(["--eval", "valid", "--max-eval-sentences", "40", "--log-every", "1", "--data"])
        .arg(a.join("conll2003"))
        .arg("--model")
        .arg(a.join("minilm"))
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn");
    Proc::spawn(&mut cmd)
}

fn report(args: &[&str], out: &Path) -> Value {
    let o = run(Command::new(DROVE).arg("report").args(args).arg("--out").arg(out));
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json")).unwrap()
}

fn chart<'a>(report: &'a Value, id: &str) -> &'a Value {
    let charts = report["charts"].as_array().expect("charts");
    charts.iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("no chart {id}: {report}"))
}

fn series<'a>(chart: &'a Value, label: &str) -> &'a Value {
    let all = chart["series"].as_array().expect("series");
    all.iter().find(|s| s["label"] == label).unwrap_or_else(|| panic!("no series {label:?}: {chart}"))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("an array").iter().map(|x| x.as_f64().expect("a number")).collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{what}: {got:?} vs {want:?}");
    }
}

/// (steps, values) of `agg` of metric `name` across ranks, as the store computes it.
fn stored(store: &Store, name: &str, agg: Agg) -> (Vec<f64>, Vec<f64>) {
    let f = Filter { run_id: RUN.into(), name: Some(name.into()), ..Filter::default() };
    let rows = store.aggregate(&f, agg).unwrap();
    (rows.iter().map(|r| r.step).collect(), rows.iter().map(|r| r.value).collect())
}

/// Polls a report of the live run until it holds points; the run must still
/// be going when it does.
fn live_report(store: &Path, dir: &Path, training: &mut Proc) -> Value {
    let until = Instant::now() + DEADLINE;
    loop {
        let live = report(&["--store", store.to_str().unwrap(), "--run", RUN], dir);
        assert_eq!(live["run"]["state"], "running", "the run is not over: {}", training.stderr_now());
        let has_loss = live["charts"].as_array().unwrap().iter().any(|c| c["id"] == "loss");
        if has_loss {
            return live;
        }
        assert!(Instant::now() < until, "no loss point reached the store: {}", training.stderr_now());
    }
}

/// The live report agrees with the final one as far as it goes: its charts
/// are among the final ones, and its loss steps are the first final steps,
/// each within the final min-max band. (At the newest live step some rank's
/// point may not have arrived yet, so its mean and band may be narrower.)
fn assert_prefix(live: &Value, last: &Value) {
    let ids = |r: &Value| -> Vec<String> {
        r["charts"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap().to_string()).collect()
    };
    let (live_ids, last_ids) = (ids(live), ids(last));
    assert!(live_ids.iter().all(|id| last_ids.contains(id)), "{live_ids:?} within {last_ids:?}");
    let (live_loss, last_loss) = (chart(live, "loss"), chart(last, "loss"));
    let x = floats(&series(live_loss, "mean across ranks")["x"]);
    let mean = floats(&series(live_loss, "mean across ranks")["y"]);
    let band = series(live_loss, "min-max across ranks");
    let (high, low) = (floats(&band["y"]), floats(&band["low"]));
    let last_band = series(last_loss, "min-max across ranks");
    let (last_x, last_high, last_low) =
        (floats(&last_band["x"]), floats(&last_band["y"]), floats(&last_band["low"]));
    assert_eq!(x, last_x[..x.len()], "the live steps are the first steps");
    for i in 0..x.len() {
        let within =
            last_low[i] <= low[i] && low[i] <= mean[i] && mean[i] <= high[i] && high[i] <= last_high[i];
        assert!(
            within,
            "step {}: live {} <= {} <= {} within the final {}..{}",
            x[i], low[i], mean[i], high[i], last_low[i], last_high[i]
        );
    }
}

/// Checks the loss chart against the store's own mean, min and max.
fn assert_loss(report: &Value, store: &Store) {
    let loss = chart(report, "loss");
    let (steps, mean) = stored(store, "loss", Agg::Mean);
    assert_eq!(steps, (1..=STEPS).map(|s| s as f64).collect::<Vec<_>>());
    let line = series(loss, "mean across ranks");
    assert_close("loss x", &floats(&line["x"]), &steps);
    assert_close("loss mean", &floats(&line["y"]), &mean);
    let band = series(loss, "min-max across ranks");
    assert_close("loss max", &floats(&band["y"]), &stored(store, "loss", Agg::Max).1);
    assert_close("loss min", &floats(&band["low"]), &stored(store, "loss", Agg::Min).1);
    assert!(stored(store, "loss", Agg::Count).1.iter().all(|&n| n == 2.0), "both ranks recorded every step");
}

/// Checks every other chart against the stored points.
fn assert_other_charts(report: &Value, store: &Store) {
    for (id, name, label) in [
        ("lr", "lr", "learning rate"),
        ("grad_norm", "grad_norm", "gradient norm"),
        ("sentences_per_s", "sentences_per_s", "sentences/s"),
        ("grad_cosine", "grad_cosine", "gradient cosine"),
        ("mask_agreement", "mask_agreement", "agreement across ranks"),
        ("mask_agreement", "mask_agreement_expected", "independent masks: p^2+(1-p)^2"),
        ("world_size", "world_size", "ranks"),
    ] {
        let s = series(chart(report, id), label);
        let (steps, values) = stored(store, name, Agg::Mean);
        assert!(!steps.is_empty(), "{name} was recorded");
        assert_close(&format!("{id} x"), &floats(&s["x"]), &steps);
        assert_close(&format!("{id} y"), &floats(&s["y"]), &values);
    }
    let (_, expected) = stored(store, "mask_agreement_expected", Agg::Mean);
    let (_, sigma) = stored(store, "mask_agreement_sigma", Agg::Mean);
    let band = series(chart(report, "mask_agreement"), "3-sigma band of independent masks");
    let high: Vec<f64> = expected.iter().zip(&sigma).map(|(e, s)| (e + 3.0 * s).min(1.0)).collect();
    let low: Vec<f64> = expected.iter().zip(&sigma).map(|(e, s)| (e - 3.0 * s).max(0.0)).collect();
    assert_close("band high", &floats(&band["y"]), &high);
    assert_close("band low", &floats(&band["low"]), &low);
    // Evaluations after epochs 1 and 2.
    let eval = chart(report, "eval_valid");
    assert_eq!(eval["x_label"], "epoch");
    for (label, name) in
        [("entity F1", "valid_f1"), ("precision", "valid_precision"), ("recall", "valid_recall")]
    {
        let s = series(eval, label);
        assert_eq!(floats(&s["x"]), [1.0, 2.0], "{label}");
        assert_close(label, &floats(&s["y"]), &stored(store, name, Agg::Mean).1);
    }
}

/// Width, height, distinct colours and the fraction of non-white pixels.
fn png_facts(path: &Path) -> (u32, u32, usize, f64) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("one frame");
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let mut colours = BTreeSet::new();
    let mut ink = 0usize;
    for px in pixels.chunks(channels) {
        let rgb = (px[0], px[1], px[2]);
        colours.insert(rgb);
        if rgb != (255, 255, 255) {
            ink += 1;
        }
    }
    (info.width, info.height, colours.len(), ink as f64 / (pixels.len() / channels) as f64)
}

fn assert_files(report: &Value, dir: &Path) {
    for c in report["charts"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        let (w, h, colours, ink) = png_facts(&dir.join(format!("{id}.png")));
        assert_eq!((w, h), (960, 380), "{id}.png");
        assert!(colours > 16, "{id}.png has {colours} colours");
        assert!(ink > 0.02, "{id}.png is {:.1}% ink", ink * 100.0);
        let svg = std::fs::read_to_string(dir.join(format!("{id}.svg"))).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{id}.svg: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{id}.svg");
        let title = c["title"].as_str().unwrap();
        assert!(
            doc.descendants().any(|n| n.has_tag_name("text") && n.text().map(str::trim) == Some(title)),
            "{id}.svg has its title as text"
        );
    }
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains(&format!("<code>{RUN}</code>")) && html.contains("class=\"verdict diverse\""));
}

/// Debian's headless Chromium, if the project's script installed it.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DROVE_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/chromium-headless-shell", "/usr/bin/chromium"].iter().map(PathBuf::from).find(|p| p.exists())
}

fn browse(browser: &Path, profile: &Path, args: &[&str], page: &Path) -> (String, String) {
    let mut cmd = Command::new(browser);
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        .args(["--disable-background-networking", "--no-first-run", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()));
    let (status, out, err) = Proc::spawn(&mut cmd).finish(Duration::from_secs(120));
    assert!(status.success(), "{} {args:?}: {status}\n{err}", browser.display());
    (out.join("\n"), err)
}

fn assert_browser_loads(dir: &Path, charts: usize) {
    let Some(browser) = chromium() else {
        crate::common::skip(
            "the browser check: no Chromium (scripts/browser-tools.sh installs it as root on Debian)",
        );
        return;
    };
    let profile = tempfile::tempdir().unwrap();
    let page = dir.join("index.html");
    let (dom, err) = browse(&browser, profile.path(), &["--dump-dom", "--enable-logging=stderr"], &page);
    let body = dom.lines().find(|l| l.contains("<body")).unwrap_or_else(|| panic!("no body:\n{dom}"));
    assert!(body.contains(&format!("data-charts=\"{charts}\"")), "every chart drawn: {body}");
    assert!(body.contains("data-errors=\"0\""), "no script error: {body}\n{err}");
    assert!(!err.contains("Uncaught"), "{err}");
    let shot = dir.join("screenshot.png");
    browse(
        &browser,
        profile.path(),
        &[&format!("--screenshot={}", shot.display()), "--window-size=1050,2400"],
        &page,
    );
    let (w, h, colours, ink) = png_facts(&shot);
    assert_eq!((w, h), (1050, 2400));
    assert!(colours > 16 && ink > 0.05, "the screenshot shows the page: {colours} colours, {ink}");
}

#[test]
fn reports_a_run_while_it_goes_and_after_from_the_store_and_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let (store_dir, out) = (dir.path().join("store"), dir.path().join("out"));
    let mut training = training(&store_dir, &out);
    let until = Instant::now() + DEADLINE;
    loop {
        let line = training.stderr.recv_timeout(until.saturating_duration_since(Instant::now()));
        let line = line.unwrap_or_else(|e| panic!("no step 3 ({e:?}): {}", training.stderr_now()));
        if line.starts_with("[0] step 3/") {
            break;
        }
    }
    let live = live_report(&store_dir, &dir.path().join("live"), &mut training);
    let (status, _, err) = training.finish(DEADLINE);
    assert!(status.success(), "{err}");

    let store_arg = store_dir.to_str().unwrap();
    let final_dir = dir.path().join("final");
    let last = report(&["--store", store_arg, "--run", RUN], &final_dir);
    assert_eq!(
        (last["run"]["state"].as_str(), last["run"]["world_size"].as_i64()),
        (Some("finished"), Some(2))
    );
    assert_eq!(last["verdict"]["status"], "diverse", "{}", last["verdict"]);
    assert_eq!(last["run"]["events"][0]["kind"], "options");
    let ids: Vec<&str> =
        last["charts"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    let want = [
        "loss",
        "mask_agreement",
        "eval_valid",
        "grad_cosine",
        "lr",
        "grad_norm",
        "sentences_per_s",
        "world_size",
    ];
    assert_eq!(ids, want);
    assert_prefix(&live, &last);

    let store = Store::open(&store_dir).unwrap();
    assert_loss(&last, &store);
    assert_other_charts(&last, &store);
    assert_files(&last, &final_dir);
    assert_browser_loads(&final_dir, want.len());

    // The same charts from a coordinator serving the store.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _coordinator = coordinator(port, &store_dir, &[]);
    let grpc = report(&["--coordinator", &addr], &dir.path().join("grpc"));
    assert_eq!(grpc["charts"], last["charts"], "the newest run, over gRPC, draws the same");
    assert_eq!(grpc["run"], last["run"]);

    let o = run(Command::new(DROVE).args(["report", "--coordinator", &addr, "--run", "nosuch"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(&format!("knows no run \"nosuch\" (runs there: {RUN})")), "{err}");
}

#[test]
fn a_folder_without_a_store_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(DROVE).args(["report", "--store"]).arg(dir.path()).arg("--out").arg(dir.path()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!("no coordinator store at {} (no coordinator.db in it)", dir.path().display())),
        "{err}"
    );
    assert!(!dir.path().join("coordinator.db").exists(), "nothing is created");
    let o = run(Command::new(DROVE).arg("report").env_remove("DROVE_COORDINATOR"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no run source given"), "{}", text(&o));
}
