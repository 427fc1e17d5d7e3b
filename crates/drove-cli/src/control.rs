//! Talking to a coordinator: `drove coordinator` serves one; `drove metrics`,
//! `drove runs` and `drove health` query one, through drove-control's
//! queries (whose errors name the gRPC code); and the printing of their answers.

use std::io::Write as _;

use anyhow::{anyhow, bail};
use clap::Args;
use drove_control::proto::metric_names;
use drove_control::proto::v1::{
    Aggregation, EndKind, Generation, GenerationState, MetricPoint, QueryRequest, RunInfo, WatchRequest,
};
use drove_control::runtime::block_on;
use drove_control::{Connection, ServingStatus, queries};
use serde_json::json;

/// Which coordinator to talk to, and how.
#[derive(Debug, Args)]
pub struct Target {
    /// Coordinator address, host:port [default: $DROVE_COORDINATOR].
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Bearer token, if the coordinator requires one [default: $DROVE_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Read a coordinator's store folder directly (as kept by `drove run
    /// --store DIR`), serving it in-process on loopback for the query.
    #[arg(long, value_name = "DIR", conflicts_with = "coordinator")]
    store: Option<std::path::PathBuf>,
}

impl Target {
    fn resolve(&self) -> anyhow::Result<(String, Option<String>)> {
        let addr = match &self.coordinator {
            Some(a) => a.clone(),
            None => drove_launch::coordinator_from_env().ok_or_else(|| {
                anyhow!("no coordinator given: pass --coordinator HOST:PORT or set DROVE_COORDINATOR")
            })?,
        };
        Ok((addr, crate::parse::token_or_env(self.token.as_deref())))
    }

    /// Where to connect; with `--store`, first starts a coordinator on that
    /// store, which lives as long as the returned handle.
    async fn connect(&self) -> anyhow::Result<(Connection, Option<drove_coordinator::Server>)> {
        if let Some(store) = &self.store {
            if !store.is_dir() {
                anyhow::bail!("no coordinator store at {}", store.display());
            }
            let server = drove_coordinator::serve_in_process(([127, 0, 0, 1], 0).into(), store, None, None)
                .await
                .map_err(|e| anyhow!("opening the store {}: {e}", store.display()))?;
            return Ok((Connection::new(&server.addr().to_string(), None), Some(server)));
        }
        let (addr, token) = self.resolve()?;
        Ok((drove_launch::connection(&addr, token.as_deref()), None))
    }
}

/// `drove coordinator`: serves until SIGINT or SIGTERM.
pub fn serve(flags: &drove_coordinator::Flags) -> anyhow::Result<()> {
    Ok(drove_coordinator::run_until_signal(flags)?)
}

/// Settings of `drove metrics`.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    #[command(flatten)]
    target: Target,
    /// The run whose points to show.
    #[arg(long, value_name = "ID")]
    run: String,
    /// Only this metric (default: every metric).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// How points of different ranks at one (name, step) combine [default: mean].
    #[arg(long, value_name = "raw|mean|min|max|sum|count", value_parser = aggregation)]
    agg: Option<Aggregation>,
    /// Only steps >= X.
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    min_step: Option<f64>,
    /// Only steps <= Y.
    #[arg(long, value_name = "Y", allow_negative_numbers = true)]
    max_step: Option<f64>,
    /// Print the stored points, then each new one as it arrives (raw, one line
    /// each), until the stream ends or Ctrl-C.
    #[arg(long)]
    watch: bool,
    /// Print JSON: one object (with --watch: one object per line).
    #[arg(long)]
    json: bool,
}

/// `--agg`: a word of drove-proto's table, refused in the table's words.
fn aggregation(s: &str) -> Result<Aggregation, String> {
    s.parse().map_err(|e: drove_control::proto::words::UnknownWord| format!("unknown aggregation: {e}"))
}

/// Writes one line to stdout; `false` once stdout is closed (e.g. piped into `head`).
fn emit(line: &str) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// `drove metrics`.
pub fn metrics(args: &MetricsArgs) -> anyhow::Result<()> {
    for (flag, v) in [("--min-step", args.min_step), ("--max-step", args.max_step)] {
        if v.is_some_and(f64::is_nan) {
            bail!("{flag} must be a number, found NaN");
        }
    }
    if args.watch && args.agg.is_some_and(|a| a != Aggregation::Raw) {
        bail!("--watch prints raw points as they arrive; leave out --agg or use --agg raw");
    }
    block_on(async {
        let (connection, _server) = args.target.connect().await?;
        if args.watch { watch(args, &connection).await } else { query(args, &connection).await }
    })?
}

async fn query(args: &MetricsArgs, connection: &Connection) -> anyhow::Result<()> {
    let agg = args.agg.unwrap_or(Aggregation::Mean);
    let request = QueryRequest {
        run_id: args.run.clone(),
        name: args.name.clone().unwrap_or_default(),
        min_step: args.min_step,
        max_step: args.max_step,
        aggregation: agg as i32,
    };
    let points = queries::points(connection, request).await?;
    let raw = agg == Aggregation::Raw;
    if args.json {
        let points: Vec<_> = points
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "step": p.step,
                    "rank": if raw { json!(p.rank) } else { serde_json::Value::Null },
                    "value": p.value,
                    "count": p.count,
                    "wall_time_unix_ms": p.wall_time_unix_ms,
                })
            })
            .collect();
        let report = json!({ "run": args.run, "aggregation": agg.word(), "points": points });
        emit(&serde_json::to_string(&report)?)?;
        return Ok(());
    }
    if points.is_empty() {
        eprintln!(
            "run {:?} has no points{}",
            args.run,
            args.name.as_ref().map(|n| format!(" named {n:?}")).unwrap_or_default()
        );
        return Ok(());
    }
    let width = points.iter().map(|p| p.name.len()).max().unwrap_or(0).max(4);
    let value_header = if raw { "value".to_string() } else { format!("{agg} value") };
    let mut header = format!("{:<width$}  {:>12}  {:>20}  {:>5}", "name", "step", value_header, "count");
    if raw {
        header.push_str("   rank");
    }
    if !emit(&header)? {
        return Ok(());
    }
    for p in &points {
        let mut line = format!("{:<width$}  {:>12}  {:>20}  {:>5}", p.name, p.step, p.value, p.count);
        if raw {
            line.push_str(&format!("  {:>5}", p.rank));
        }
        if !emit(&line)? {
            break;
        }
    }
    Ok(())
}

fn watch_line(p: &MetricPoint, json_lines: bool) -> String {
    if json_lines {
        json!({
            "run": p.run_id,
            "name": p.name,
            "step": p.step,
            "rank": p.rank,
            "value": p.value,
            "wall_time_unix_ms": p.wall_time_unix_ms,
        })
        .to_string()
    } else {
        format!(
            "{:<12}  {:>12}  {:>5}  {:>20}  {}",
            p.name,
            p.step,
            p.rank,
            p.value,
            utc(p.wall_time_unix_ms)
        )
    }
}

async fn watch(args: &MetricsArgs, connection: &Connection) -> anyhow::Result<()> {
    let request = WatchRequest { run_id: args.run.clone(), name: args.name.clone().unwrap_or_default() };
    let stream = queries::watch(connection, request).await?;
    if !args.json
        && !emit(&format!(
            "{:<12}  {:>12}  {:>5}  {:>20}  {}",
            "name", "step", "rank", "value", "time (UTC)"
        ))?
    {
        return Ok(());
    }
    stream
        .for_each_until(drove_control::runtime::interrupted(), |point| {
            let in_range = args.min_step.is_none_or(|m| point.step >= m)
                && args.max_step.is_none_or(|m| point.step <= m);
            anyhow::Ok(!in_range || emit(&watch_line(&point, args.json))?)
        })
        .await
}

/// Settings of `drove runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// `drove runs`: every run, and the generations of the elastic ones.
pub fn runs(args: &RunsArgs) -> anyhow::Result<()> {
    let runs = block_on(async {
        let (connection, _server) = args.target.connect().await?;
        anyhow::Ok(queries::runs_with_generations(&connection).await?)
    })??;
    if args.json {
        let runs: Vec<_> = runs.iter().map(|(r, g)| run_json(r, g)).collect();
        emit(&json!({ "runs": runs }).to_string())?;
        return Ok(());
    }
    if runs.is_empty() {
        eprintln!("the coordinator knows no runs");
        return Ok(());
    }
    print_runs(&runs)
}

/// A run as `drove runs --json` prints it.
fn run_json(r: &RunInfo, generations: &[Generation]) -> serde_json::Value {
    json!({
        "run_id": r.run_id,
        "state": r.state().word(),
        "world_size": r.world_size,
        "joined": r.joined,
        "points": r.points,
        "created_unix_ms": r.created_unix_ms,
        "updated_unix_ms": r.updated_unix_ms,
        "restarts": r.restarts,
        "events": r.events.iter().map(|e| json!({
            "rank": e.rank,
            "step": e.step,
            "kind": e.kind,
            "message": e.message,
            "wall_time_unix_ms": e.wall_time_unix_ms,
        })).collect::<Vec<_>>(),
        "generations": generations.iter().map(generation_json).collect::<Vec<_>>(),
    })
}

/// A generation as `drove runs --json` prints it (`end` null until it ended).
fn generation_json(g: &Generation) -> serde_json::Value {
    json!({
        "number": g.number,
        "state": g.state().word(),
        "world_size": g.world_size,
        "first_step": g.first_step,
        "last_step": g.last_step,
        "members": g.members.iter().map(|m| json!({
            "member_id": m.member_id,
            "rank": m.rank,
            "host": m.host,
            "address": m.address,
        })).collect::<Vec<_>>(),
        "end": g.end.as_ref().map(|e| json!({
            "kind": e.kind().word(),
            "members": e.members,
            "detail": e.detail,
        })),
        "started_unix_ms": g.started_ms,
        "ended_unix_ms": g.ended_ms,
    })
}

/// The table of `drove runs`: a line per run, then its generations and its
/// events, indented.
fn print_runs(runs: &[(RunInfo, Vec<Generation>)]) -> anyhow::Result<()> {
    let width = runs.iter().map(|(r, _)| r.run_id.len()).max().unwrap_or(0).max(6);
    let header = format!(
        "{:<width$}  {:<12}  {:>5}  {:>6}  {:>8}  {:>10}  {:<19}  {}",
        "run id", "state", "world", "joined", "restarts", "points", "created (UTC)", "updated (UTC)"
    );
    if !emit(&header)? {
        return Ok(());
    }
    for (r, generations) in runs {
        let line = format!(
            "{:<width$}  {:<12}  {:>5}  {:>6}  {:>8}  {:>10}  {:<19}  {}",
            r.run_id,
            r.state(),
            r.world_size,
            r.joined,
            r.restarts,
            r.points,
            utc(r.created_unix_ms),
            utc(r.updated_unix_ms)
        );
        let mut lines = vec![line];
        lines.extend(generations.iter().flat_map(generation_lines));
        // The options event is one long JSON object, for `drove report` and --json.
        for e in r.events.iter().filter(|e| e.kind != metric_names::event::OPTIONS) {
            lines.push(format!("    {} at step {} (rank {}): {}", e.kind, e.step, e.rank, e.message));
        }
        for line in &lines {
            if !emit(line)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A generation in `drove runs`' table: what it is, its members, and why it
/// ended (once it has).
fn generation_lines(g: &Generation) -> Vec<String> {
    let state = g.state();
    let steps = match state {
        GenerationState::Ended => format!("steps {}..{}", g.first_step, g.last_step),
        GenerationState::Running => format!("steps {}..", g.first_step),
        _ => format!("after step {}", g.first_step),
    };
    let size = if g.world_size > 0 {
        format!("world {}", g.world_size)
    } else {
        format!("{} member(s) joined", g.members.len())
    };
    let mut head = format!("    generation {}  {}  {size}  {steps}", g.number, state.word());
    if g.started_ms > 0 {
        head.push_str(&format!("  started {}", utc(g.started_ms)));
    }
    if g.ended_ms > 0 {
        head.push_str(&format!("  ended {}", utc(g.ended_ms)));
    }
    let members: Vec<String> = g
        .members
        .iter()
        .map(|m| match m.rank {
            r if r >= 0 => format!("{} (rank {r}, {})", m.member_id, m.host),
            _ => format!("{} ({})", m.member_id, m.host),
        })
        .collect();
    let mut lines = vec![head, format!("      members: {}", members.join(", "))];
    if let Some(end) = &g.end {
        let kind = end.kind();
        let mut why = format!("      ended by {}", kind.word());
        if !end.members.is_empty() {
            let role = if kind == EndKind::MemberAdded { "added" } else { "lost" };
            why.push_str(&format!(" ({role}: {})", end.members.join(", ")));
        }
        if !end.detail.is_empty() {
            why.push_str(&format!(": {}", end.detail));
        }
        lines.push(why);
    }
    lines
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) use drove_report::utc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forming_generation_lists_its_joined_members_and_an_ended_one_why() {
        use drove_control::proto::v1::{GenerationEnd, GenerationMember};
        let member = |id: &str, rank: i32| GenerationMember {
            member_id: id.into(),
            rank,
            host: "h".into(),
            address: "h:1".into(),
        };
        let forming = Generation {
            number: 3,
            state: GenerationState::Forming.into(),
            members: vec![member("a", -1), member("n", -1)],
            first_step: 7,
            ..Generation::default()
        };
        assert_eq!(
            generation_lines(&forming),
            ["    generation 3  forming  2 member(s) joined  after step 7", "      members: a (h), n (h)"]
        );
        let ended = Generation {
            number: 2,
            state: GenerationState::Ended.into(),
            members: vec![member("a", 0)],
            world_size: 1,
            first_step: 5,
            last_step: 7,
            end: Some(GenerationEnd {
                kind: EndKind::MemberAdded.into(),
                members: vec!["n".into()],
                detail: String::new(),
            }),
            ..Generation::default()
        };
        assert_eq!(
            generation_lines(&ended),
            [
                "    generation 2  ended  world 1  steps 5..7",
                "      members: a (rank 0, h)",
                "      ended by member-added (added: n)"
            ]
        );
        let json = generation_json(&ended);
        assert_eq!(json["end"], json!({"kind": "member-added", "members": ["n"], "detail": ""}));
        assert_eq!((&json["state"], &json["members"][0]["rank"]), (&json!("ended"), &json!(0)));
    }

    #[test]
    fn aggregations_parse_by_name() {
        for (s, a) in [("raw", Aggregation::Raw), ("mean", Aggregation::Mean), ("count", Aggregation::Count)]
        {
            assert_eq!(aggregation(s), Ok(a));
            assert_eq!(a.word(), s);
        }
        assert!(aggregation("median").unwrap_err().contains("unknown aggregation"));
    }
}

/// Settings of `drove health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Coordinator address, host:port [default: $DROVE_COORDINATOR].
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// The service to ask about (empty: the server as a whole).
    #[arg(long, default_value = "", value_name = "NAME")]
    service: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 5.0, value_name = "SECS", value_parser = crate::parse::positive_secs)]
    timeout: f64,
}

/// `drove health`: one `grpc.health.v1.Health/Check` call (no token needed), for
/// container health checks; succeeds only on `SERVING`.
pub fn health(args: &HealthArgs) -> anyhow::Result<()> {
    let addr = match &args.coordinator {
        Some(a) => a.clone(),
        None => drove_launch::coordinator_from_env().ok_or_else(|| {
            anyhow!("no coordinator given: pass --coordinator HOST:PORT or set DROVE_COORDINATOR")
        })?,
    };
    let limit = std::time::Duration::from_secs_f64(args.timeout);
    let connection = drove_launch::connection(&addr, None);
    let status = block_on(queries::health(&connection, &args.service, limit))??;
    let what = if args.service.is_empty() {
        "the coordinator".to_string()
    } else {
        format!("service {:?}", args.service)
    };
    match status {
        ServingStatus::Serving => {
            emit(&format!("{addr}: {what} is SERVING"))?;
            Ok(())
        }
        other => anyhow::bail!("{addr}: {what} is {}", other.as_str_name()),
    }
}
