//! The launcher: a [`LaunchSpec`] in, a [`LaunchOutcome`] out. `drove run` is
//! a thin call of [`launch`]; so can any binary be.

use std::ffi::OsString;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use drove_control::Clients;

use crate::error::LaunchError;
use crate::exit::signal_exit_code;
use crate::launcher::child::TorchWorld;
use crate::launcher::console::Console;
use crate::launcher::coordinator::{
    CoordinatorChoice, LaunchCoordinator, check_run_is_free, check_run_is_free_or_elastic, leave_all,
    watch_run,
};
use crate::launcher::restart::{Next, RestartPolicy};
use crate::launcher::signals::forward_signals;
use crate::launcher::spawn::{RankCommand, SupervisorEvent};
use crate::launcher::supervise::{Attempt, SlotPolicy, supervise};
use crate::launcher::watch::{LaunchWatch, WatchChoice, WatchTarget};
use crate::var;

/// Most ranks on one host.
pub const MAX_LOCAL_RANKS: usize = 4096;

/// What to launch, and how.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// Ranks to start on this host (1 to [`MAX_LOCAL_RANKS`]).
    pub np: usize,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Where the ranks meet.
    pub coordinator: CoordinatorChoice,
    /// The coordinator's bearer token (given to the ranks as `DROVE_TOKEN`).
    pub token: Option<String>,
    /// The run id (see [`check_run_id`]).
    pub run_id: String,
    /// Restarts of a failed world.
    pub restart: RestartPolicy,
    /// Between SIGTERM and SIGKILL when stopping the ranks.
    pub stop_grace: Duration,
    /// Extra variables for every rank.
    pub env: Vec<(String, String)>,
    /// An elastic launch (`--min-np`): the ranks run as members of an
    /// elastic run, a failed slot is started again alone.
    pub elastic: Option<ElasticLaunch>,
    /// Whether drove-watch's watcher goes into every Python rank (by
    /// default when the program is a Python interpreter or a `.py` file).
    pub watch: WatchChoice,
}

/// An elastic launch: the world sizes its run allows (`MIN:MAX`, given to
/// the ranks as `DROVE_ELASTIC`). A failed slot's process is started again
/// alone, counting against `--max-restarts` (torchrun counts membership
/// changes the same way), while the others go on; it joins the running world
/// at a step boundary. A second launch with the same coordinator and run id
/// adds its ranks to the running run, up to MAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElasticLaunch {
    /// The fewest ranks a world may have.
    pub min: usize,
    /// The most (at least this launch's `np`).
    pub max: usize,
}

impl LaunchSpec {
    /// `np` ranks of `program args`, with an in-process coordinator on a
    /// temporary store, a fresh run id, no restarts and a 10 s grace.
    pub fn new(
        np: usize,
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        LaunchSpec {
            np,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            coordinator: CoordinatorChoice::InProcess { store: None, metrics_listen: None },
            token: None,
            run_id: default_run_id(),
            restart: RestartPolicy::default(),
            stop_grace: Duration::from_secs(10),
            env: Vec::new(),
            elastic: None,
            watch: WatchChoice::Auto,
        }
    }

    fn check(&self) -> Result<(), LaunchError> {
        if !(1..=MAX_LOCAL_RANKS).contains(&self.np) {
            return Err(LaunchError::Spec(format!(
                "np must be 1 to {MAX_LOCAL_RANKS} ranks on one host, found {}",
                self.np
            )));
        }
        if let Some(e) = self.elastic {
            let problem = if e.min == 0 {
                Some("--min-np must be at least 1".to_string())
            } else if e.min > self.np {
                Some(format!(
                    "--min-np {} is above --np {}: the launch could never form a world",
                    e.min, self.np
                ))
            } else if e.max < self.np {
                Some(format!(
                    "--max-np {} is below --np {}: a world cannot take every rank started",
                    e.max, self.np
                ))
            } else {
                None
            };
            if let Some(p) = problem {
                return Err(LaunchError::Spec(p));
            }
        }
        check_run_id(&self.run_id).map_err(LaunchError::Spec)
    }

    /// The member ids of this launch's slots start with this: the host and
    /// the launcher's process id, so a second launch's slots are other members.
    fn member_prefix(&self) -> Option<String> {
        self.elastic?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        Some(format!("{}.{}.", host.trim(), std::process::id()))
    }

    /// The variables every rank of an attempt gets (the rank's own are set
    /// at spawn): drove's, then torchrun's for a fixed world (`torch`), then
    /// the watcher's (`watch`), then the spec's own, which win.
    fn rank_env(
        &self,
        addr: &str,
        restarts: u32,
        progress: bool,
        torch: Option<&TorchWorld>,
        watch: &[(String, String)],
    ) -> Vec<(String, String)> {
        let mut env = vec![
            (var::WORLD_SIZE.to_string(), self.np.to_string()),
            (var::LOCAL_WORLD_SIZE.to_string(), self.np.to_string()),
            (var::RUN_ID.to_string(), self.run_id.clone()),
            (var::COORDINATOR.to_string(), addr.to_string()),
            (var::RESTART_COUNT.to_string(), restarts.to_string()),
        ];
        if let Some(t) = &self.token {
            env.push((var::TOKEN.to_string(), t.clone()));
        }
        // As torchrun sets OMP_NUM_THREADS: the ranks share this host's cores.
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            let threads =
                std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(self.np).max(1);
            env.push(("RAYON_NUM_THREADS".to_string(), threads.to_string()));
        }
        if progress {
            env.push((var::PROGRESS.to_string(), "launcher".to_string()));
        }
        if let Some(e) = self.elastic {
            env.push((var::ELASTIC.to_string(), format!("{}:{}", e.min, e.max)));
        }
        if let Some(world) = torch {
            env.extend(world.shared_vars().into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        env.extend(watch.iter().cloned());
        env.extend(self.env.iter().cloned());
        env
    }
}

/// A run id is 1 to 128 characters.
pub fn check_run_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err(format!("run id must be 1 to 128 characters, found {}", id.len()));
    }
    Ok(())
}

/// `run-MILLIS-PID`: the clock in ms and the process id.
pub fn default_run_id() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("run-{ms}-{}", std::process::id())
}

/// How a launch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Every rank exited 0.
    Succeeded,
    /// This rank failed first (in the last attempt), with this exit code.
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its shell-style exit code.
        code: u8,
    },
    /// The launcher was stopped by this signal.
    Interrupted(i32),
    /// The coordinator failed the run (a hung rank), for this reason.
    RunFailed(String),
    /// An elastic launch ended at once: a rank failed with no restart left
    /// and fewer ranks than its minimum could still finish.
    BelowMinimum {
        /// The rank whose failure left too few.
        rank: usize,
        /// Its shell-style exit code.
        code: u8,
        /// The ranks that could still have finished.
        left: usize,
        /// The launch's `--min-np`.
        min: usize,
    },
}

/// What a launch did.
#[derive(Clone, Debug)]
pub struct LaunchOutcome {
    /// The run id.
    pub run_id: String,
    /// Restarts made.
    pub restarts: u32,
    /// How it ended.
    pub end: End,
}

impl LaunchOutcome {
    /// The launcher's exit code: 0, the first failing rank's, 128 + N for
    /// signal N, or 1 when the coordinator failed the run.
    pub fn exit_code(&self) -> u8 {
        match &self.end {
            End::Succeeded => 0,
            End::RankFailed { code, .. } | End::BelowMinimum { code, .. } => *code,
            End::Interrupted(sig) => signal_exit_code(*sig),
            End::RunFailed(_) => 1,
        }
    }

    fn of(run_id: &str, restarts: u32, attempt: &Attempt) -> Self {
        let v = &attempt.decision;
        let end = match (&v.run_failed, v.first_failure, v.interrupted) {
            (Some(why), _, _) => End::RunFailed(why.clone()),
            (None, Some((rank, code)), _) if let Some((left, min)) = v.below_minimum => {
                End::BelowMinimum { rank, code, left, min }
            }
            (None, Some((rank, code)), _) => End::RankFailed { rank, code },
            (None, None, Some(sig)) => End::Interrupted(sig),
            (None, None, None) => End::Succeeded,
        };
        LaunchOutcome { run_id: run_id.to_string(), restarts, end }
    }
}

/// Launches `spec.np` ranks and supervises them until the run ends (see the
/// crate docs for the contract). Installs handlers for SIGINT, SIGTERM and
/// SIGHUP for the rest of the process's life: they stop the world.
pub fn launch(spec: &LaunchSpec, console: Arc<dyn Console>) -> Result<LaunchOutcome, LaunchError> {
    spec.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("drove-run")
        .build()
        .map_err(|e| LaunchError::io("starting the async runtime", e))?;
    let (tx, rx) = mpsc::channel();
    forward_signals(&rt, tx.clone())?;
    let coordinator = rt.block_on(LaunchCoordinator::open(&spec.coordinator, spec.token.as_deref()))?;
    if let Some(at) = coordinator.metrics_addr() {
        console.note(&format!("the coordinator serves Prometheus metrics at http://{at}/metrics"));
    }
    let outcome = rt.block_on(join(&coordinator.addr, spec)).and_then(|mut clients| {
        tracing::info!(
            coordinator = %coordinator.addr,
            run_id = %spec.run_id,
            np = spec.np,
            in_process = coordinator.in_process(),
            "starting {} ranks of {}",
            spec.np,
            spec.program.to_string_lossy()
        );
        let target = WatchTarget {
            addr: &coordinator.addr,
            token: spec.token.as_deref(),
            run_id: &spec.run_id,
            world_size: spec.np,
        };
        let watch =
            spec.watch.applies(&spec.program).then(|| LaunchWatch::start(&target, &console)).flatten();
        let watch_env = watch.as_ref().map(LaunchWatch::env).unwrap_or_default();
        let attempts =
            Attempts { spec, addr: &coordinator.addr, console: &console, rt: &rt, watch_env: &watch_env };
        let outcome = attempts.run(&mut clients, &tx, &rx);
        if let Some(watch) = watch {
            watch.finish();
        }
        outcome
    });
    drop(tx);
    rt.block_on(coordinator.close());
    outcome
}

/// Connects within 15 s and checks the run id is free.
async fn join(addr: &str, spec: &LaunchSpec) -> Result<Clients, LaunchError> {
    let mut clients = tokio::time::timeout(
        Duration::from_secs(15),
        crate::connection::coordinator_clients(addr, spec.token.as_deref()),
    )
    .await
    .map_err(|_| {
        LaunchError::Coordinator(format!("the coordinator at {addr} did not accept a connection within 15 s"))
    })??;
    match spec.elastic {
        // A second elastic launch adds its ranks to the running run.
        Some(_) => check_run_is_free_or_elastic(&mut clients, &spec.run_id).await?,
        None => check_run_is_free(&mut clients, &spec.run_id).await?,
    }
    Ok(clients)
}

/// The attempts of one launch.
struct Attempts<'a> {
    spec: &'a LaunchSpec,
    addr: &'a str,
    console: &'a Arc<dyn Console>,
    rt: &'a tokio::runtime::Runtime,
    /// The watcher's variables (none when the ranks are not watched).
    watch_env: &'a [(String, String)],
}

impl Attempts<'_> {
    /// Runs attempts until one succeeds, is interrupted, or no restart is left.
    fn run(
        &self,
        clients: &mut Clients,
        tx: &mpsc::Sender<SupervisorEvent>,
        rx: &mpsc::Receiver<SupervisorEvent>,
    ) -> Result<LaunchOutcome, LaunchError> {
        let spec = self.spec;
        let mut restarts = 0u32;
        let prefix = spec.member_prefix();
        let slots = spec.elastic.map(|e| SlotPolicy { min: e.min, max_restarts: spec.restart.max_restarts });
        let mut master_port = None;
        loop {
            // torchrun's variables for PyTorch programs, meeting at a fresh
            // port each start; none in an elastic launch, whose ranks change
            // with each world (see `child.rs`).
            let torch = match spec.elastic {
                Some(_) => None,
                None => Some(TorchWorld::start(spec.np, restarts, master_port)?),
            };
            master_port = torch.map(|t| t.master_port);
            let env = spec.rank_env(
                self.addr,
                restarts,
                self.console.draws_progress(),
                torch.as_ref(),
                self.watch_env,
            );
            let command = RankCommand {
                program: &spec.program,
                args: &spec.args,
                env: &env,
                member_prefix: prefix.as_deref(),
                torch: torch.is_some(),
            };
            let watcher =
                self.rt.spawn(watch_run(clients.rendezvous.clone(), spec.run_id.clone(), tx.clone()));
            let attempt = supervise(spec.np, &command, spec.stop_grace, self.console, tx.clone(), rx, slots);
            watcher.abort();
            let attempt = attempt?;
            if slots.is_some() {
                // Members leave the run themselves; slots were restarted alone.
                return Ok(LaunchOutcome::of(&spec.run_id, attempt.restarts, &attempt));
            }
            self.rt.block_on(leave_all(clients, &spec.run_id, &attempt));
            match spec.restart.next(restarts, &attempt) {
                Next::Done => return Ok(LaunchOutcome::of(&spec.run_id, restarts, &attempt)),
                Next::Restart(why) => {
                    restarts += 1;
                    tracing::warn!(
                        "run {}: {why}; restarting every rank ({restarts} of {})",
                        spec.run_id,
                        spec.restart.max_restarts
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{CoordinatorSource, LaunchEnv, Launcher};

    fn elastic(np: usize, min: usize, max: usize) -> Result<(), String> {
        let mut spec = LaunchSpec::new(np, "true", Vec::<String>::new());
        spec.elastic = Some(ElasticLaunch { min, max });
        spec.check().map_err(|e| e.to_string())
    }

    #[test]
    fn an_elastic_launch_s_sizes_are_checked_against_np() {
        assert_eq!(elastic(4, 3, 4), Ok(()));
        assert_eq!(elastic(4, 4, 6), Ok(()));
        assert_eq!(elastic(4, 0, 4).unwrap_err(), "--min-np must be at least 1");
        assert_eq!(
            elastic(4, 5, 6).unwrap_err(),
            "--min-np 5 is above --np 4: the launch could never form a world"
        );
        assert_eq!(
            elastic(4, 2, 3).unwrap_err(),
            "--max-np 3 is below --np 4: a world cannot take every rank started"
        );
    }

    #[test]
    fn an_elastic_launch_tells_its_ranks_the_world_sizes_and_member_ids() {
        let mut spec = LaunchSpec::new(2, "true", Vec::<String>::new());
        assert!(spec.member_prefix().is_none(), "a fixed launch names no members");
        spec.elastic = Some(ElasticLaunch { min: 1, max: 3 });
        let env = spec.rank_env("127.0.0.1:1", 0, false, None, &[]);
        assert!(env.contains(&(var::ELASTIC.to_string(), "1:3".to_string())), "{env:?}");
        let prefix = spec.member_prefix().unwrap();
        assert!(prefix.ends_with(&format!(".{}.", std::process::id())), "{prefix}");
    }

    /// Rank `rank`'s variables over what it inherits, as its process gets
    /// them (a later one wins), and those it must not inherit.
    fn child_env(
        spec: &LaunchSpec,
        torch: Option<&TorchWorld>,
        rank: usize,
    ) -> (HashMap<String, String>, &'static [&'static str]) {
        let env = spec.rank_env("127.0.0.1:7000", torch.map_or(0, |t| t.restart_count), true, torch, &[]);
        let prefix = spec.member_prefix();
        let command = RankCommand {
            program: &spec.program,
            args: &spec.args,
            env: &env,
            member_prefix: prefix.as_deref(),
            torch: torch.is_some(),
        };
        (command.vars(rank).into_iter().collect(), command.unset())
    }

    #[test]
    fn a_fixed_world_s_child_gets_torchrun_s_variables_and_reads_drove_s_alone() {
        let mut spec = LaunchSpec::new(2, "python", ["train.py"]);
        spec.run_id = "r1".into();
        let world = TorchWorld { np: 2, master_port: 29533, restart_count: 1 };
        for rank in 0..2 {
            let (vars, unset) = child_env(&spec, Some(&world), rank);
            assert!(unset.is_empty());
            let get = |name: &str| vars.get(name).map(String::as_str);
            let r = rank.to_string();
            assert_eq!(
                [var::TORCH_RANK, var::TORCH_LOCAL_RANK, var::RANK, var::LOCAL_RANK].map(get),
                [Some(r.as_str()); 4]
            );
            assert_eq!(
                [var::TORCH_WORLD_SIZE, var::TORCH_LOCAL_WORLD_SIZE, var::GROUP_RANK].map(get),
                [Some("2"), Some("2"), Some("0")]
            );
            assert_eq!(
                [var::MASTER_ADDR, var::MASTER_PORT, var::TORCHELASTIC_RESTART_COUNT, var::RESTART_COUNT]
                    .map(get),
                [Some("127.0.0.1"), Some("29533"), Some("1"), Some("1")]
            );
            // A drove rank among them reads drove's variables as if torchrun's were not there.
            let read = LaunchEnv::from_lookup(|n| vars.get(n).cloned()).unwrap();
            let drove_only =
                LaunchEnv::from_lookup(|n| vars.get(n).filter(|_| !var::TORCHRUN.contains(&n)).cloned())
                    .unwrap();
            assert_eq!(read, drove_only);
            assert_eq!(
                (read.launcher, read.coordinator_source),
                (Some(Launcher::Drove), Some(CoordinatorSource::Given))
            );
            assert_eq!(
                (read.rank().map(|r| r.get()), read.coordinator.as_deref()),
                (Some(rank), Some("127.0.0.1:7000"))
            );
        }
        // The spec's own variables win over the launcher's.
        spec.env.push((var::MASTER_ADDR.to_string(), "10.1.2.3".to_string()));
        assert_eq!(child_env(&spec, Some(&world), 0).0[var::MASTER_ADDR], "10.1.2.3");
    }

    #[test]
    fn an_elastic_launch_s_child_gets_and_inherits_none_of_torchrun_s_variables() {
        let mut spec = LaunchSpec::new(2, "python", ["train.py"]);
        spec.elastic = Some(ElasticLaunch { min: 1, max: 3 });
        let (vars, unset) = child_env(&spec, None, 1);
        assert_eq!(unset, var::TORCHRUN.as_slice());
        assert!(vars.keys().all(|k| !var::TORCHRUN.contains(&k.as_str())), "{vars:?}");
        assert_eq!((vars[var::RANK].as_str(), vars[var::ELASTIC].as_str()), ("1", "1:3"));
    }
}
