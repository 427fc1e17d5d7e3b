//! The charts of a report: what each one holds ([`build`], from the run's raw
//! points) and how it is drawn ([`Chart::svg`], [`Chart::png`]) with plotters.
//! Text is set in DejaVu Sans, compiled in: no system font is needed.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;

use drove_proto::metric_names::{self as metric, Score};

use crate::{DrawError, Point, RunData};

/// Chart width in pixels (PNG) and user units (SVG).
pub const WIDTH: u32 = 960;
/// Chart height.
pub const HEIGHT: u32 = 380;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A line through every point.
    Line,
    /// A line with a dot at each point (few points: evaluations, diagnostics).
    Markers,
    /// A shaded band between `low` and `y`.
    Band,
    /// A vertical line across the plot at each x (when something happened to
    /// the run: its world re-formed); `y` is empty.
    Rule,
}

/// One series of a chart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series {
    /// Its name in the legend.
    pub label: String,
    /// How it is drawn.
    pub kind: Kind,
    /// Index into the palette.
    #[serde(skip)]
    pub color: usize,
    /// The x values, ascending.
    pub x: Vec<f64>,
    /// The values (a band's upper edge).
    pub y: Vec<f64>,
    /// A band's lower edge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<Vec<f64>>,
}

/// One chart: its file name, title, axes and series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chart {
    /// File name (without extension) and HTML id: `[a-z0-9_-]+`.
    pub id: String,
    /// The title drawn above it.
    pub title: String,
    /// What x is.
    pub x_label: String,
    /// What y is.
    pub y_label: String,
    /// What is drawn, back to front.
    pub series: Vec<Series>,
    /// The legend goes in the lower right corner (curves that rise).
    #[serde(skip)]
    pub legend_low: bool,
    /// A fixed y range (scores and fractions: 0 to 1), else the data's.
    #[serde(skip)]
    pub y_range: Option<(f64, f64)>,
}

/// The label of the mask chart's agreement series (what the verdict reads).
pub const AGREEMENT: &str = "agreement across ranks";

/// Blue, red, green, orange, purple, grey: the tab10 colours.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
];

/// Per-step statistics of one metric across ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// The step.
    pub step: f64,
    /// Mean across the ranks that recorded it.
    pub mean: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

/// The points of each metric, by name.
fn by_name(points: &[Point]) -> BTreeMap<&str, Vec<&Point>> {
    let mut map: BTreeMap<&str, Vec<&Point>> = BTreeMap::new();
    for p in points {
        map.entry(p.name.as_str()).or_default().push(p);
    }
    for v in map.values_mut() {
        v.sort_by(|a, b| a.step.total_cmp(&b.step).then(a.rank.cmp(&b.rank)));
    }
    map
}

/// Mean, min and max across ranks at each step of `points` (sorted by step).
pub fn per_step(points: &[&Point]) -> Vec<StepStats> {
    let mut out: Vec<StepStats> = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let step = points[i].step;
        let group: Vec<f64> = points[i..].iter().take_while(|p| p.step == step).map(|p| p.value).collect();
        i += group.len();
        let mean = group.iter().sum::<f64>() / group.len() as f64;
        let min = group.iter().copied().fold(f64::INFINITY, f64::min);
        let max = group.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.push(StepStats { step, mean, min, max });
    }
    out
}

fn line(label: &str, kind: Kind, color: usize, stats: &[StepStats]) -> Series {
    Series {
        label: label.into(),
        kind,
        color,
        x: stats.iter().map(|s| s.step).collect(),
        y: stats.iter().map(|s| s.mean).collect(),
        low: None,
    }
}

fn chart(id: &str, title: &str, x_label: &str, y_label: &str, series: Vec<Series>) -> Chart {
    Chart {
        id: id.into(),
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        series,
        legend_low: false,
        y_range: None,
    }
}

/// The label of the loss chart's rules where the world re-formed.
pub const REFORMED: &str = "world re-formed";

/// Every chart the run's points allow, in page order: loss (with a rule at
/// each `reform` event's step), mask agreement, each evaluated set, gradient
/// cosine, learning rate, gradient norm, throughput, world size (the story's
/// charts first). A chart without points is left out.
pub fn build(run: &RunData) -> Vec<Chart> {
    let names = by_name(&run.points);
    let stats = |name: &str| names.get(name).map(|p| per_step(p)).unwrap_or_default();
    let mut charts = Vec::new();
    charts.extend(loss(&stats(metric::LOSS), &reforms(run)));
    charts.extend(mask_agreement(&stats));
    charts.extend(evaluations(&names, &stats(metric::EPOCH)));
    charts.extend(grad_cosine(&stats(metric::GRAD_COSINE)));
    for (id, title, y, label) in [
        (metric::LR, "Learning rate", "learning rate", "learning rate"),
        (metric::GRAD_NORM, "Gradient norm (before clipping)", "L2 norm", "gradient norm"),
        (metric::SENTENCES_PER_S, "Throughput", "sentences/s (all ranks)", "sentences/s"),
    ] {
        let s = stats(id);
        if !s.is_empty() {
            charts.push(chart(id, title, "step", y, vec![line(label, Kind::Line, 0, &s)]));
        }
    }
    charts.extend(world_size(&stats(metric::WORLD_SIZE)));
    charts
}

/// The steps of the run's `reform` events (the last step applied before
/// each new world), ascending, each once.
fn reforms(run: &RunData) -> Vec<f64> {
    let mut steps: Vec<f64> =
        run.events.iter().filter(|e| e.kind == metric::event::REFORM).map(|e| e.step).collect();
    steps.sort_by(f64::total_cmp);
    steps.dedup();
    steps
}

/// The ranks that took each step (the mean across them: every rank of a
/// world records the same), from 0 up.
fn world_size(ranks: &[StepStats]) -> Option<Chart> {
    let most = ranks.iter().map(|s| s.max).fold(f64::NEG_INFINITY, f64::max);
    if !most.is_finite() {
        return None;
    }
    let mut c =
        chart(metric::WORLD_SIZE, "World size", "step", "ranks", vec![line("ranks", Kind::Line, 2, ranks)]);
    c.legend_low = true;
    c.y_range = Some((0.0, most + 1.0));
    Some(c)
}

/// The mean loss across ranks in its min-max band, and a rule at each step
/// of `reformed` (where the world changed).
fn loss(loss: &[StepStats], reformed: &[f64]) -> Option<Chart> {
    if loss.is_empty() {
        return None;
    }
    let mut band = line("min-max across ranks", Kind::Band, 0, loss);
    band.y = loss.iter().map(|s| s.max).collect();
    band.low = Some(loss.iter().map(|s| s.min).collect());
    let mean = line("mean across ranks", Kind::Line, 0, loss);
    let mut series = vec![band, mean];
    if !reformed.is_empty() {
        let x = reformed.to_vec();
        series.push(Series {
            label: REFORMED.into(),
            kind: Kind::Rule,
            color: 3,
            x,
            y: Vec::new(),
            low: None,
        });
    }
    Some(chart(metric::LOSS, "Training loss", "step", "loss", series))
}

/// The gradient cosine of each diagnosed step.
fn grad_cosine(cosine: &[StepStats]) -> Option<Chart> {
    if cosine.is_empty() {
        return None;
    }
    let kind = if cosine.len() > 50 { Kind::Line } else { Kind::Markers };
    let mut c = chart(
        metric::GRAD_COSINE,
        "Gradient cosine between ranks (diagnosed steps)",
        "step",
        "mean cosine over pairs of ranks",
        vec![line("gradient cosine", kind, 4, cosine)],
    );
    c.legend_low = true;
    Some(c)
}

/// One chart per evaluated set (`SET_f1`, `SET_precision`, `SET_recall`),
/// against the epoch recorded at the evaluation's step (the step itself if
/// the run recorded no epochs).
fn evaluations(names: &BTreeMap<&str, Vec<&Point>>, epochs: &[StepStats]) -> Vec<Chart> {
    let epoch_at = |step: f64| epochs.iter().find(|e| e.step == step).map(|e| e.mean);
    let epochs_of =
        |stats: &[StepStats]| stats.iter().map(|s| epoch_at(s.step)).collect::<Option<Vec<f64>>>();
    let mut charts = Vec::new();
    for set in names.keys().filter_map(|n| Score::F1.set_of(n)) {
        let found: Vec<(usize, &str, Vec<StepStats>)> =
            [(Score::F1, "entity F1"), (Score::Precision, "precision"), (Score::Recall, "recall")]
                .into_iter()
                .enumerate()
                .filter_map(|(i, (score, label))| {
                    names.get(score.name(set).as_str()).map(|p| (i, label, per_step(p)))
                })
                .collect();
        let by_epoch = found.iter().all(|(_, _, stats)| epochs_of(stats).is_some());
        let series = found
            .iter()
            .map(|(i, label, stats)| {
                let mut s = line(label, Kind::Markers, *i, stats);
                if let Some(x) = epochs_of(stats).filter(|_| by_epoch) {
                    s.x = x;
                }
                s
            })
            .collect();
        let x = if by_epoch { "epoch" } else { "step" };
        let id = format!("eval_{}", file_safe(set));
        let mut c = chart(&id, &format!("Evaluation on {set}"), x, "entity-level score", series);
        c.legend_low = true;
        c.y_range = Some((0.0, 1.0));
        charts.push(c);
    }
    charts
}

/// `[a-z0-9_-]` only (other characters become `_`), for file names and ids.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c.to_ascii_lowercase() } else { '_' })
        .collect()
}

/// Mask agreement per diagnosed step, with the agreement of independent masks
/// and its 3-sigma band (from `mask_agreement_expected` and `_sigma`).
fn mask_agreement(stats: &dyn Fn(&str) -> Vec<StepStats>) -> Option<Chart> {
    let agreement = stats(metric::MASK_AGREEMENT);
    if agreement.is_empty() {
        return None;
    }
    let expected = stats(metric::MASK_AGREEMENT_EXPECTED);
    let sigma = stats(metric::MASK_AGREEMENT_SIGMA);
    let mut series = Vec::new();
    // The band where both the expected value and sigma were recorded.
    let band: Vec<(f64, f64, f64)> = expected
        .iter()
        .filter_map(|e| sigma.iter().find(|s| s.step == e.step).map(|s| (e.step, e.mean, s.mean)))
        .collect();
    if !band.is_empty() {
        series.push(Series {
            label: "3-sigma band of independent masks".into(),
            kind: Kind::Band,
            color: 5,
            x: band.iter().map(|b| b.0).collect(),
            // An agreement is a fraction: the band is cut to [0, 1].
            y: band.iter().map(|b| (b.1 + 3.0 * b.2).min(1.0)).collect(),
            low: Some(band.iter().map(|b| (b.1 - 3.0 * b.2).max(0.0)).collect()),
        });
    }
    if !expected.is_empty() {
        series.push(line("independent masks: p^2+(1-p)^2", Kind::Line, 5, &expected));
    }
    let kind = if agreement.len() > 50 { Kind::Line } else { Kind::Markers };
    series.push(line(AGREEMENT, kind, 1, &agreement));
    let mut c = chart(
        metric::MASK_AGREEMENT,
        "Mask agreement across ranks (diagnosed steps)",
        "step",
        "fraction of positions masked alike",
        series,
    );
    c.legend_low = true;
    c.y_range = Some((0.0, 1.0));
    Some(c)
}

/// The agreement values of a mask chart and how many lie above and below its
/// band.
#[derive(Clone, Debug, PartialEq)]
pub struct BandSides {
    /// The agreement at each diagnosed step.
    pub agreement: Vec<f64>,
    /// Steps above the band (masks more alike than independent ones).
    pub above: usize,
    /// Steps below it (masks less alike: complementary).
    pub below: usize,
}

/// Where a mask chart's agreement lies against its band (`None` for a chart
/// without agreement).
pub fn band_sides(chart: &Chart) -> Option<BandSides> {
    let agreement = chart.series.iter().find(|s| s.label == AGREEMENT)?;
    let band = chart.series.iter().find(|s| s.kind == Kind::Band);
    let (mut above, mut below) = (0, 0);
    for (x, y) in agreement.x.iter().zip(&agreement.y) {
        let Some((high, low)) = band.and_then(|b| {
            let i = b.x.iter().position(|bx| bx == x)?;
            Some((b.y[i], b.low.as_ref()?[i]))
        }) else {
            continue;
        };
        above += usize::from(*y > high);
        below += usize::from(*y < low);
    }
    Some(BandSides { agreement: agreement.y.clone(), above, below })
}

/// Registers DejaVu Sans as plotters' "sans-serif" once.
fn fonts() -> Result<(), DrawError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok { Ok(()) } else { Err(DrawError::Font) }
}

/// A plotters error, in words.
fn plot(e: impl std::fmt::Display) -> DrawError {
    DrawError::Plot(e.to_string())
}

/// A padded range holding every value of `values` (finite ones).
fn range(values: impl Iterator<Item = f64>, pad: f64) -> Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let half = (hi.abs() * 0.1).max(0.5);
        return lo - half..hi + half;
    }
    let margin = (hi - lo) * pad;
    lo - margin..hi + margin
}

/// A tick label: 3 significant digits, scientific when small or large.
fn tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Chart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> Result<String, DrawError> {
        fonts()?;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
            self.draw(&root).map_err(plot)?;
            root.present().map_err(plot)?;
        }
        Ok(svg)
    }

    /// The chart as a PNG file's bytes (RGB, [`WIDTH`] x [`HEIGHT`]).
    pub fn png(&self) -> Result<Vec<u8>, DrawError> {
        fonts()?;
        let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
            self.draw(&root).map_err(plot)?;
            root.present().map_err(plot)?;
        }
        let mut png = Vec::new();
        let mut encoder = png::Encoder::new(&mut png, WIDTH, HEIGHT);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(DrawError::Png)?;
        writer.write_image_data(&rgb).map_err(DrawError::Png)?;
        writer.finish().map_err(DrawError::Png)?;
        Ok(png)
    }

    /// The x range, the y range and how many x labels to draw.
    fn axes(&self) -> (Range<f64>, Range<f64>, usize) {
        let xs = range(self.series.iter().flat_map(|s| s.x.iter().copied()), 0.02);
        let ys = match self.y_range {
            Some((lo, hi)) => {
                let pad = (hi - lo) * 0.04;
                lo - pad..hi + pad
            }
            None => range(
                self.series.iter().flat_map(|s| s.y.iter().chain(s.low.iter().flatten()).copied()),
                0.06,
            ),
        };
        // Whole epochs on an epoch axis.
        let x_labels = if self.x_label == "epoch" {
            ((xs.end - xs.start).round() as usize + 1).clamp(2, 10)
        } else {
            10
        };
        (xs, ys, x_labels)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let (xs, ys, x_labels) = self.axes();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(72)
            .build_cartesian_2d(xs, ys)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_labels(x_labels)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(RGBColor(247, 247, 247))
            .label_style(("sans-serif", 13))
            .draw()?;
        for s in &self.series {
            s.draw(&mut chart)?;
        }
        let corner =
            if self.legend_low { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight };
        chart
            .configure_series_labels()
            .position(corner)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font(("sans-serif", 13))
            .draw()?;
        Ok(())
    }
}

/// The chart area a series is drawn on.
type Plot<'a, 'b, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

impl Series {
    /// Draws this series and its legend entry.
    fn draw<DB: DrawingBackend>(
        &self,
        chart: &mut Plot<'_, '_, DB>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let color = PALETTE[self.color % PALETTE.len()];
        let points: Vec<(f64, f64)> = self.x.iter().copied().zip(self.y.iter().copied()).collect();
        let band = self.kind == Kind::Band;
        let legend = if self.kind == Kind::Rule {
            let ys = chart.y_range();
            let style = color.stroke_width(2);
            chart.draw_series(
                self.x.iter().map(|&x| PathElement::new(vec![(x, ys.start), (x, ys.end)], style)),
            )?
        } else if band {
            let low = self.low.as_deref().unwrap_or(&[]);
            let mut outline = points;
            outline.extend(self.x.iter().copied().zip(low.iter().copied()).rev());
            chart.draw_series(std::iter::once(Polygon::new(outline, color.mix(0.18).filled())))?
        } else {
            if self.kind == Kind::Markers || points.len() == 1 {
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            }
            chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?
        };
        // A swatch for a band, a short thick line otherwise.
        let (half, style) = if band { (5, color.mix(0.3).filled()) } else { (1, color.filled()) };
        legend
            .label(self.label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - half), (x + 20, y + half)], style));
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn p(name: &str, step: f64, rank: i32, value: f64) -> Point {
        Point { name: name.into(), step, rank, value }
    }

    /// A finished run of two ranks holding `points` and no events.
    pub(crate) fn run(points: Vec<Point>) -> RunData {
        RunData {
            run_id: "r".into(),
            state: drove_proto::v1::RunState::Finished,
            world_size: 2,
            joined: 2,
            restarts: 0,
            created_unix_ms: 0,
            updated_unix_ms: 0,
            events: Vec::new(),
            points,
        }
    }

    #[test]
    fn loss_is_the_mean_across_ranks_within_the_min_max_band() {
        let r = run(vec![
            p("loss", 1.0, 0, 2.0),
            p("loss", 1.0, 1, 4.0),
            p("loss", 2.0, 1, 1.0),
            p("loss", 2.0, 0, 3.0),
        ]);
        let charts = build(&r);
        assert_eq!(charts.len(), 1);
        let [band, mean] = &charts[0].series[..] else { panic!("{:?}", charts[0].series) };
        assert_eq!(
            (band.kind, &band.x, &band.y, band.low.as_deref()),
            (Kind::Band, &vec![1.0, 2.0], &vec![4.0, 3.0], Some(&[2.0, 1.0][..]))
        );
        assert_eq!((mean.kind, &mean.y), (Kind::Line, &vec![3.0, 2.0]));
    }

    #[test]
    fn evaluations_are_drawn_against_the_epoch_of_their_step() {
        let r = run(vec![
            p("epoch", 5.0, 0, 1.0),
            p("epoch", 10.0, 0, 2.0),
            p("valid_f1", 5.0, 0, 0.5),
            p("valid_f1", 10.0, 0, 0.7),
            p("valid_recall", 5.0, 0, 0.4),
            p("valid_recall", 10.0, 0, 0.6),
        ]);
        let charts = build(&r);
        let eval = charts.iter().find(|c| c.id == "eval_valid").expect("an evaluation chart");
        assert_eq!(eval.x_label, "epoch");
        assert_eq!(eval.series.len(), 2, "no precision was recorded");
        assert_eq!((&eval.series[0].x, &eval.series[0].y), (&vec![1.0, 2.0], &vec![0.5, 0.7]));
        // Without epochs, the steps.
        let r = run(vec![p("test set_f1", 7.0, 0, 0.9)]);
        let eval = &build(&r)[0];
        assert_eq!(
            (eval.id.as_str(), eval.x_label.as_str(), &eval.series[0].x),
            ("eval_test_set", "step", &vec![7.0])
        );
    }

    #[test]
    fn mask_agreement_outside_its_band_is_counted() {
        let mut points = Vec::new();
        for (step, agreement) in [(1.0, 0.75), (2.0, 0.99)] {
            points.push(p("mask_agreement", step, 0, agreement));
            points.push(p("mask_agreement_expected", step, 0, 0.745));
            points.push(p("mask_agreement_sigma", step, 0, 0.01));
        }
        let charts = build(&run(points));
        let masks = &charts[0];
        assert_eq!(
            masks.series.iter().map(|s| s.kind).collect::<Vec<_>>(),
            [Kind::Band, Kind::Line, Kind::Markers]
        );
        let band = &masks.series[0];
        assert!((band.y[0] - 0.775).abs() < 1e-12 && (band.low.as_ref().unwrap()[0] - 0.715).abs() < 1e-12);
        assert_eq!(band_sides(masks), Some(BandSides { agreement: vec![0.75, 0.99], above: 1, below: 0 }));
    }

    #[test]
    fn a_chart_draws_as_svg_and_png() {
        let r = run(vec![p("loss", 1.0, 0, 2.0), p("loss", 2.0, 0, 1.0)]);
        let chart = &build(&r)[0];
        let svg = chart.svg().unwrap();
        assert!(svg.contains("<svg") && svg.contains("Training loss"), "{svg}");
        let png = chart.png().unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }

    #[test]
    fn an_elastic_run_gets_its_world_size_and_a_rule_on_the_loss_at_each_reform() {
        let mut points = Vec::new();
        // Generation 1: ranks 0-2 for steps 1-2; generation 2: ranks 0-1 from step 3.
        for (step, world) in [(1.0, 3), (2.0, 3), (3.0, 2), (4.0, 2)] {
            for rank in 0..world {
                points.push(p("loss", step, rank, 2.0 - step / 10.0));
                points.push(p("world_size", step, rank, f64::from(world)));
            }
        }
        let mut r = run(points);
        let reform = |step: f64, rank: i32| crate::Event {
            rank,
            step,
            kind: metric::event::REFORM.into(),
            message: "generation 2: 2 rank(s) from step 2 ...".into(),
            wall_time_unix_ms: 0,
        };
        r.events = vec![reform(2.0, 0), reform(2.0, 0)];
        let charts = build(&r);
        assert_eq!(charts.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["loss", "world_size"]);
        let rule = charts[0].series.last().unwrap();
        assert_eq!(
            (rule.label.as_str(), rule.kind, &rule.x),
            (REFORMED, Kind::Rule, &vec![2.0]),
            "once each"
        );
        assert!(rule.y.is_empty());
        let world = &charts[1].series[0];
        assert_eq!((&world.x, &world.y), (&vec![1.0, 2.0, 3.0, 4.0], &vec![3.0, 3.0, 2.0, 2.0]));
        assert_eq!(charts[1].y_range, Some((0.0, 4.0)));
        let json = serde_json::to_value(&charts[0]).unwrap();
        assert_eq!(
            json["series"][2],
            serde_json::json!({"label": REFORMED, "kind": "rule", "x": [2.0], "y": []})
        );
        for c in &charts {
            assert!(c.svg().unwrap().contains(&c.title));
            c.png().unwrap();
        }
        // A fixed world: no rule, and its world size all the same.
        let fixed = run(vec![p("loss", 1.0, 0, 2.0), p("world_size", 1.0, 0, 1.0)]);
        let charts = build(&fixed);
        assert_eq!(charts[0].series.len(), 2);
        assert_eq!(charts[1].series[0].y, [1.0]);
        assert!(build(&run(vec![p("loss", 1.0, 0, 2.0)])).iter().all(|c| c.id != "world_size"));
    }

    #[test]
    fn ticks_keep_three_digits() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(0.745), "0.745");
        assert_eq!(tick(5e-5), "5.0e-5");
        assert_eq!(tick(120.0), "120");
    }
}
