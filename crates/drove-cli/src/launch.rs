//! `drove run --np N -- PROGRAM ARGS...`: starts N ranks of a program on this
//! host. The launcher is `drove_launch::launch`; this file turns the flags into
//! its spec, draws rank 0's progress as a bar on a terminal, and prints how
//! the run ended.

use std::ffi::OsString;
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use drove_launch::{
    Console, CoordinatorChoice, ElasticLaunch, End, LaunchSpec, MAX_LOCAL_RANKS, PlainConsole, Progress,
    RestartPolicy, Stream, WatchChoice,
};
use indicatif::{ProgressBar, ProgressStyle};

use crate::parse;

/// Settings of `drove run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of ranks (processes) to start on this host.
    #[arg(long, value_name = "N", value_parser = |s: &str| ranks(s, "--np"))]
    np: usize,
    /// Keep the in-process coordinator's store (metrics, runs) in this folder
    /// instead of a temporary one; query it later with `drove metrics --store DIR`.
    #[arg(long, value_name = "DIR", conflicts_with = "coordinator")]
    pub store: Option<std::path::PathBuf>,
    /// A running coordinator (host:port) to use instead of starting one in-process.
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Have the in-process coordinator serve Prometheus metrics at
    /// http://ADDR/metrics, as `drove coordinator --metrics-listen` does (port
    /// 0: any free one; the address is printed on stderr). Off by default.
    #[arg(long, value_name = "ADDR", conflicts_with = "coordinator")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Bearer token: given to the ranks as DROVE_TOKEN and required by the
    /// in-process coordinator [default: $DROVE_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Run id [default: run-MILLIS-PID, the clock in ms and the process id].
    #[arg(long, value_name = "ID", value_parser = run_id)]
    run_id: Option<String>,
    /// Restart the whole world up to N times when a rank fails (torchrun's
    /// --max-restarts): every rank is stopped and all start again with
    /// DROVE_RESTART_COUNT set (`drove train ner` then resumes from its latest
    /// checkpoint). After N restarts the run fails with the last error.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_restarts: u32,
    /// An elastic launch (torchrun's --nnodes MIN:MAX): the ranks are
    /// members of an elastic run whose worlds may have MIN to --max-np
    /// members (DROVE_ELASTIC); a failed rank's process is started again
    /// alone while the others keep training (each restart counts against
    /// --max-restarts), and it joins their world at a step boundary. With
    /// --coordinator and the --run-id of a live elastic run, adds these
    /// ranks to it.
    #[arg(long, value_name = "MIN", value_parser = min_np)]
    min_np: Option<usize>,
    /// The most ranks an elastic run's world may have [default: --np].
    #[arg(long, value_name = "MAX", requires = "min_np", value_parser = |s: &str| ranks(s, "--max-np"))]
    max_np: Option<usize>,
    /// Seconds between SIGTERM and SIGKILL when stopping the ranks.
    #[arg(long, default_value_t = 10.0, value_name = "S", value_parser = parse::seconds)]
    stop_grace_secs: f64,
    /// Put drove's watcher (the story's bug in PyTorch programs) into every
    /// rank, also when the program is not a Python interpreter or a `.py`
    /// file (say, a shell script that starts Python).
    #[arg(long, conflicts_with = "no_watch")]
    watch: bool,
    /// Leave the ranks unwatched (the watcher goes into every Python rank by default).
    #[arg(long)]
    no_watch: bool,
    /// The program every rank runs, and its arguments (after `--` when they
    /// start with `-`). A flag before it that `drove run` does not know is an error.
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
    command: Vec<OsString>,
}

/// A count of ranks for `flag` (`--np`, `--max-np`): at least 1, at most
/// what one host starts.
fn ranks(s: &str, flag: &str) -> Result<usize, String> {
    let n = parse::at_least(s, 1, flag, " rank")?;
    if n > MAX_LOCAL_RANKS {
        Err(format!("{flag} must be at most {MAX_LOCAL_RANKS} ranks on one host, found {n}"))
    } else {
        Ok(n)
    }
}

fn min_np(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "--min-np", " rank")
}

fn run_id(s: &str) -> Result<String, String> {
    drove_launch::check_run_id(s).map(|()| s.to_string())
}

impl RunArgs {
    fn spec(&self) -> LaunchSpec {
        let (program, args) = self.command.split_first().expect("clap requires PROGRAM");
        let mut spec = LaunchSpec::new(self.np, program, args);
        spec.coordinator = match &self.coordinator {
            Some(addr) => CoordinatorChoice::At(addr.clone()),
            None => CoordinatorChoice::InProcess {
                store: self.store.clone(),
                metrics_listen: self.metrics_listen,
            },
        };
        spec.token = crate::parse::token_or_env(self.token.as_deref());
        if let Some(id) = &self.run_id {
            spec.run_id = id.clone();
        }
        spec.restart = RestartPolicy { max_restarts: self.max_restarts };
        spec.stop_grace = Duration::from_secs_f64(self.stop_grace_secs);
        spec.elastic = self.min_np.map(|min| ElasticLaunch { min, max: self.max_np.unwrap_or(self.np) });
        spec.watch = match (self.watch, self.no_watch) {
            (true, _) => WatchChoice::On,
            (_, true) => WatchChoice::Off,
            _ => WatchChoice::Auto,
        };
        spec
    }
}

/// On a terminal: one bar for the run, fed by rank 0's progress lines, with
/// the ranks' lines printed above it.
struct BarConsole(ProgressBar);

impl BarConsole {
    fn new() -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps {msg} (ETA {eta})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        BarConsole(bar)
    }
}

impl Console for BarConsole {
    fn line(&self, rank: usize, stream: Stream, line: &[u8]) -> std::io::Result<()> {
        let text = format!("[{rank}] {}", String::from_utf8_lossy(line).trim_end_matches('\n'));
        match stream {
            Stream::Stderr => self.0.println(text),
            Stream::Stdout => self.0.suspend(|| {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{text}").and_then(|()| stdout.flush());
            }),
        }
        Ok(())
    }

    fn draws_progress(&self) -> bool {
        true
    }

    fn note(&self, text: &str) {
        self.0.println(text);
    }

    fn progress(&self, p: &Progress) {
        self.0.set_length(p.total);
        self.0.set_position(p.step);
        let message = p.message();
        if !message.is_empty() {
            self.0.set_message(message);
        }
    }
}

/// `drove run`.
pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let spec = args.spec();
    let bar = std::io::stderr().is_terminal().then(|| Arc::new(BarConsole::new()));
    let console: Arc<dyn Console> = match &bar {
        Some(bar) => bar.clone(),
        None => Arc::new(PlainConsole),
    };
    let outcome = drove_launch::launch(&spec, console);
    if let Some(bar) = &bar {
        bar.0.finish_and_clear();
    }
    let outcome = outcome?;
    match &outcome.end {
        End::RunFailed(why) => eprintln!("error: run {} failed: {why}", outcome.run_id),
        End::BelowMinimum { rank, code, left, min } => eprintln!(
            "error: run {} failed: rank {rank} failed (exit code {code}) with no restart left, and only {left} \
             rank(s) could still finish, fewer than --min-np {min}",
            outcome.run_id
        ),
        End::RankFailed { rank, code } => {
            tracing::info!("run {} failed: rank {rank} failed first; exit code {code}", outcome.run_id);
        }
        End::Succeeded | End::Interrupted(_) => {}
    }
    Ok(ExitCode::from(outcome.exit_code()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked_and_default_to_time_and_pid() {
        assert!(run_id("").is_err());
        assert!(run_id(&"x".repeat(129)).is_err());
        assert_eq!(run_id("t1"), Ok("t1".into()));
        let id = drove_launch::default_run_id();
        assert!(id.starts_with("run-") && id.ends_with(&format!("-{}", std::process::id())), "{id}");
    }

    #[test]
    fn an_unknown_flag_before_the_program_is_an_error_naming_it() {
        use clap::Parser as _;
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let err =
            Cli::try_parse_from(["drove", "--np", "3", "--nnodes", "2", "--", "drove", "check"]).unwrap_err();
        assert!(err.to_string().contains("--nnodes"), "{err}");
        let elastic =
            Cli::try_parse_from(["drove", "--np", "3", "--min-np", "2", "--", "drove", "check"]).unwrap();
        assert_eq!((elastic.run.min_np, elastic.run.max_np), (Some(2), None));
        let err = Cli::try_parse_from(["drove", "--np", "3", "--max-np", "4", "drove"]).unwrap_err();
        assert!(err.to_string().contains("--min-np"), "--max-np needs --min-np: {err}");
        let ok = Cli::try_parse_from(["drove", "--np", "2", "--", "prog", "--flag", "-x"]).unwrap();
        assert_eq!(ok.run.command, ["prog", "--flag", "-x"]);
        let bare = Cli::try_parse_from(["drove", "--np", "2", "prog", "--flag"]).unwrap();
        assert_eq!(bare.run.command, ["prog", "--flag"]);
    }
}
