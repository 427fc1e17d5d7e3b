//! The launcher as a library, on real processes (`/bin/sh` ranks) and a real
//! in-process coordinator: what each rank is told, how its lines reach the
//! console, how a failure stops the world and restarts it, and the exit codes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drove_collective::Element as _;
use drove_launch::{
    Console, ElasticLaunch, End, LaunchError, LaunchSpec, Progress, RestartPolicy, Stream, launch, var,
};

/// A console that keeps what it is given.
#[derive(Default)]
struct Recorder {
    lines: Mutex<Vec<(usize, Stream, String)>>,
    progress: Mutex<Vec<Progress>>,
    draws: bool,
}

impl Console for Recorder {
    fn line(&self, rank: usize, stream: Stream, line: &[u8]) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(line).trim_end().to_string();
        self.lines.lock().unwrap().push((rank, stream, text));
        Ok(())
    }

    fn draws_progress(&self) -> bool {
        self.draws
    }

    fn progress(&self, p: &Progress) {
        self.progress.lock().unwrap().push(p.clone());
    }
}

impl Recorder {
    fn lines_of(&self, stream: Stream) -> Vec<(usize, String)> {
        let mut l: Vec<_> =
            self.lines.lock().unwrap().iter().filter(|l| l.1 == stream).map(|l| (l.0, l.2.clone())).collect();
        l.sort();
        l
    }
}

fn sh(np: usize, script: &str) -> LaunchSpec {
    let mut spec = LaunchSpec::new(np, "/bin/sh", ["-c", script]);
    spec.stop_grace = Duration::from_secs(5);
    spec
}

#[test]
fn each_rank_is_told_its_place_and_its_lines_arrive_whole() {
    let console = Arc::new(Recorder::default());
    let script = format!(
        "echo rank=${r} of ${w} local=${l} run=${id} restart=${c}; test -n \"${coord}\" && echo coordinator set; echo oops >&2",
        r = var::RANK,
        w = var::WORLD_SIZE,
        l = var::LOCAL_RANK,
        id = var::RUN_ID,
        c = var::RESTART_COUNT,
        coord = var::COORDINATOR,
    );
    let mut spec = sh(3, &script);
    spec.run_id = "places".into();
    let outcome = launch(&spec, console.clone()).unwrap();
    assert_eq!((outcome.end.clone(), outcome.exit_code(), outcome.restarts), (End::Succeeded, 0, 0));
    let mut expected = Vec::new();
    for r in 0..3 {
        expected.push((r, "coordinator set".to_string()));
        expected.push((r, format!("rank={r} of 3 local={r} run=places restart=0")));
    }
    expected.sort();
    assert_eq!(console.lines_of(Stream::Stdout), expected);
    assert_eq!(console.lines_of(Stream::Stderr), (0..3).map(|r| (r, "oops".into())).collect::<Vec<_>>());
}

#[test]
fn a_console_that_draws_progress_gets_progress_lines_not_text() {
    let console = Arc::new(Recorder { draws: true, ..Recorder::default() });
    let line = Progress { loss: Some(0.5), ..Progress::at(3, 10) }.line();
    let script = format!(
        "test \"${}\" = launcher && [ \"${}\" = 0 ] && echo '{line}' >&2; echo done",
        var::PROGRESS,
        var::RANK
    );
    let outcome = launch(&sh(2, &script), console.clone()).unwrap();
    assert_eq!(outcome.end, End::Succeeded);
    assert_eq!(*console.progress.lock().unwrap(), vec![Progress { loss: Some(0.5), ..Progress::at(3, 10) }]);
    assert!(console.lines_of(Stream::Stderr).is_empty(), "{:?}", console.lines_of(Stream::Stderr));
}

#[test]
fn a_failed_rank_stops_the_others_and_the_world_restarts_up_to_the_limit() {
    let console = Arc::new(Recorder::default());
    // Rank 1 fails in the first attempt only; rank 0 would wait a minute.
    let script = format!(
        "if [ \"${r}\" = 1 ] && [ \"${c}\" = 0 ]; then exit 3; fi; if [ \"${c}\" = 0 ]; then sleep 60; fi; echo attempt ${c}",
        r = var::RANK,
        c = var::RESTART_COUNT,
    );
    let mut spec = sh(2, &script);
    spec.restart = RestartPolicy { max_restarts: 1 };
    let started = Instant::now();
    let outcome = launch(&spec, console.clone()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(30), "rank 0 was stopped, not waited for");
    assert_eq!((outcome.end, outcome.restarts), (End::Succeeded, 1));
    assert_eq!(console.lines_of(Stream::Stdout), vec![(0, "attempt 1".into()), (1, "attempt 1".into())]);

    // Without restarts the first failure ends the launch with its exit code.
    let outcome = launch(&sh(2, &script), Arc::new(Recorder::default())).unwrap();
    assert_eq!((outcome.end.clone(), outcome.exit_code()), (End::RankFailed { rank: 1, code: 3 }, 3));
}

#[test]
fn an_elastic_launch_left_below_its_minimum_ends_at_once_naming_why() {
    // Ranks 1 and 2 fail at once; rank 0 would wait ten minutes for them.
    let script = format!("if [ \"${r}\" != 0 ]; then exit 3; fi; sleep 600", r = var::RANK);
    let mut spec = sh(3, &script);
    spec.elastic = Some(ElasticLaunch { min: 2, max: 3 });
    spec.restart = RestartPolicy { max_restarts: 1 };
    let started = Instant::now();
    let outcome = launch(&spec, Arc::new(Recorder::default())).unwrap();
    assert!(started.elapsed() < Duration::from_secs(120), "rank 0 was waited for: {:?}", started.elapsed());
    // One restart went to the first failed slot; the next failure left one
    // rank that could finish, below 2.
    let End::BelowMinimum { code, left, min, .. } = outcome.end else { panic!("{:?}", outcome.end) };
    assert_eq!((code, left, min, outcome.exit_code()), (3, 1, 2, 3));
}

#[test]
fn a_program_that_cannot_start_and_a_bad_spec_are_named() {
    let spec = LaunchSpec::new(2, "/nonexistent/program", Vec::<String>::new());
    let err = launch(&spec, Arc::new(Recorder::default())).unwrap_err();
    assert!(matches!(err, LaunchError::Spawn { rank: 0, .. }), "{err}");
    assert!(err.to_string().contains("cannot start rank 0: /nonexistent/program"), "{err}");
    let err = launch(&sh(0, "true"), Arc::new(Recorder::default())).unwrap_err();
    assert!(err.to_string().contains("np must be 1 to 4096"), "{err}");
    let mut spec = sh(1, "true");
    spec.run_id = String::new();
    assert!(launch(&spec, Arc::new(Recorder::default())).unwrap_err().to_string().contains("run id"));
}

/// `(rank, fields)` of each stdout line starting with `tag `.
fn tagged(console: &Recorder, tag: &str) -> Vec<(usize, Vec<String>)> {
    let prefix = format!("{tag} ");
    let lines = console.lines_of(Stream::Stdout);
    let tagged = lines.iter().filter_map(|(r, l)| Some((*r, l.strip_prefix(&prefix)?)));
    tagged.map(|(r, l)| (r, l.split(' ').map(str::to_string).collect())).collect()
}

#[test]
fn each_rank_is_told_torchrun_s_variables_and_each_start_of_the_world_a_fresh_master_port() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("printed");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo touches no memory of ours.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
    // Both ranks print, then in the first start rank 1 fails once rank 0
    // has printed (it opens the FIFO that rank 0 writes to).
    let script = format!(
        "echo torch ${r} ${w} ${lr} ${lw} ${g} ${a} ${p} ${c} ${coord}; \
         if [ \"${c}\" = 0 ]; then if [ \"${r}\" = 0 ]; then echo go > '{f}'; else read x < '{f}'; exit 3; fi; fi",
        r = var::TORCH_RANK,
        w = var::TORCH_WORLD_SIZE,
        lr = var::TORCH_LOCAL_RANK,
        lw = var::TORCH_LOCAL_WORLD_SIZE,
        g = var::GROUP_RANK,
        a = var::MASTER_ADDR,
        p = var::MASTER_PORT,
        c = var::TORCHELASTIC_RESTART_COUNT,
        coord = var::COORDINATOR,
        f = fifo.display(),
    );
    let mut spec = sh(2, &script);
    spec.restart = RestartPolicy { max_restarts: 1 };
    let console = Arc::new(Recorder::default());
    let outcome = launch(&spec, console.clone()).unwrap();
    assert_eq!((outcome.end, outcome.restarts), (End::Succeeded, 1));
    let seen = tagged(&console, "torch");
    assert_eq!(seen.len(), 4, "each rank printed in each start: {seen:?}");
    let mut ports = Vec::new();
    for start in ["0", "1"] {
        let of_start: Vec<_> = seen.iter().filter(|(_, f)| f[7] == start).collect();
        let port: Vec<u16> = of_start.iter().map(|(_, f)| f[6].parse().unwrap()).collect();
        assert!(port[0] > 0 && port[0] == port[1], "start {start}: one port for the world: {of_start:?}");
        for (rank, f) in &of_start {
            let r = rank.to_string();
            assert_eq!(f[..6], [&r, "2", &r, "2", "0", "127.0.0.1"], "start {start}, rank {rank}");
            let coordinator_port = f[8].rsplit_once(':').unwrap().1;
            assert_ne!(coordinator_port, f[6], "MASTER_PORT is not drove's coordinator's");
        }
        ports.push(port[0]);
    }
    assert_ne!(ports[0], ports[1], "a restart meets at a fresh port");
}

/// Set for the ranks of the test below.
const CHILD: &str = "DROVE_LAUNCH_TEST_CHILD";

/// Not a test of its own: the rank program of the test below, which
/// launches this test binary with only this test selected. Like a PyTorch
/// program, rank 0 binds `MASTER_PORT` (as gloo's store does) and holds it
/// while it joins the other ranks through drove.
#[test]
fn a_drove_rank_beside_a_pytorch_store() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let env = drove_launch::LaunchEnv::from_env().unwrap();
    let master_port: u16 = std::env::var(var::MASTER_PORT).unwrap().parse().unwrap();
    let store = (env.rank().map(|r| r.get()) == Some(0))
        .then(|| std::net::TcpListener::bind(("0.0.0.0", master_port)).expect("MASTER_PORT is free"));
    let (launcher, source) = (env.launcher.map(|l| l.as_str()), env.coordinator_source.map(|s| s.as_str()));
    let world = drove_launch::Launched::from_launch_env(env).unwrap();
    let mut sum = [world.rank() as i64];
    world
        .comm()
        .all_reduce("ranks", &[1], i64::tensor_mut(&mut sum), drove_collective::ReduceOptions::sum())
        .unwrap();
    println!(
        "drove rank={} of={} sum={} launcher={launcher:?} coordinator={source:?} store={}",
        world.rank(),
        world.world_size(),
        sum[0],
        store.is_some()
    );
    world.finish(drove_launch::RankOutcome::Finished { steps: 1 });
}

#[test]
fn a_drove_rank_reads_drove_s_variables_and_leaves_master_port_to_pytorch() {
    let exe = std::env::current_exe().unwrap();
    let mut spec = LaunchSpec::new(2, exe, ["--exact", "a_drove_rank_beside_a_pytorch_store", "--nocapture"]);
    spec.stop_grace = Duration::from_secs(5);
    spec.env.push((CHILD.to_string(), "1".to_string()));
    let console = Arc::new(Recorder::default());
    let outcome = launch(&spec, console.clone()).unwrap();
    let seen = tagged(&console, "drove");
    assert_eq!(outcome.end, End::Succeeded, "{:?}", console.lines.lock().unwrap());
    let expected = |rank: usize| {
        let fields = format!(
            "rank={rank} of=2 sum=1 launcher=Some(\"drove\") coordinator=Some(\"given\") store={}",
            rank == 0
        );
        (rank, fields.split(' ').map(str::to_string).collect::<Vec<_>>())
    };
    assert_eq!(seen, vec![expected(0), expected(1)]);
}
