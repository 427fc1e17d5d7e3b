//! The launcher as a library, on real processes (`/bin/sh` ranks) and a real
//! in-process coordinator: what each rank is told, how its lines reach the
//! console, how a failure stops the world and restarts it, and the exit codes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drove_launch::{Console, End, LaunchError, LaunchSpec, Progress, RestartPolicy, Stream, launch, var};

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
