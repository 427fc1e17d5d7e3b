//! Bad input a user gives `drove`, each refused with a clear error that names
//! what was wrong and where: a flag's value, a peers file that disagrees with
//! the world, a coordinator nobody serves. The binary runs as a user runs it;
//! no panic reaches them, and nothing waits past its deadline (each run is
//! bounded by a generous outer one, never timed tightly).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{DROVE, Proc, free_port, launch_env_removed, tiny_training};

/// Long enough for a loaded machine; a hang still ends the test.
const DEADLINE: Duration = Duration::from_secs(180);

/// Runs `cmd` to its end within the deadline: its exit code and stderr.
fn refused(cmd: &mut Command) -> (Option<i32>, String) {
    let (status, _, err) = Proc::spawn(cmd).finish(DEADLINE);
    (status.code(), err)
}

/// A user's error: exit code `code`, no panic, and every one of `says` on stderr.
fn assert_clear_error((code, err): &(Option<i32>, String), want: i32, says: &[&str]) {
    eprintln!("--- the user saw:\n{err}");
    assert_eq!(*code, Some(want), "{err}");
    assert!(!err.contains("panicked"), "a panic reached the user:\n{err}");
    for s in says {
        assert!(err.contains(s), "{s:?} not in:\n{err}");
    }
}

#[test]
fn a_batch_size_of_0_is_refused_naming_the_flag() {
    // Refused while the flags are read, before any data or model is looked for.
    let out = refused(Command::new(DROVE).args(["train", "ner", "--batch-size", "0"]));
    assert_clear_error(&out, 2, &["--batch-size must be at least 1, found 0"]);
}

#[test]
fn drove_run_with_no_ranks_is_refused_naming_the_flag() {
    for (flags, says) in [
        (&["--np", "0"][..], "'--np <N>': --np must be at least 1 rank, found 0"),
        (&["--np", "2", "--min-np", "0"][..], "'--min-np <MIN>': --min-np must be at least 1 rank, found 0"),
    ] {
        let out = refused(Command::new(DROVE).arg("run").args(flags).args(["--", DROVE, "check"]));
        assert_clear_error(&out, 2, &[says]);
    }
}

/// `drove check` as rank `rank` of `world` with `env`, given no launcher's
/// variables of this process.
fn check_rank(rank: usize, world: usize, env: &[(&str, &std::ffi::OsStr)]) -> Command {
    let mut cmd = launch_env_removed(Command::new(DROVE));
    cmd.arg("check").env("DROVE_RANK", rank.to_string()).env("DROVE_WORLD_SIZE", world.to_string());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

#[test]
fn a_peers_file_of_another_world_size_is_refused_naming_the_file_and_both_counts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("peers.txt");
    let ports = [free_port(), free_port(), free_port()];
    let lines: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    std::fs::write(&file, format!("# three ranks' addresses\n{}\n", lines.join("\n"))).unwrap();
    let out = refused(&mut check_rank(0, 2, &[("DROVE_PEERS_FILE", file.as_os_str())]));
    let says = format!("{} lists 3 addresses but DROVE_WORLD_SIZE is 2", file.display());
    assert_clear_error(&out, 1, &[&says]);
    // Once: the error line does not say a cause its message already holds again.
    assert_eq!(out.1.matches(&says).count(), 1, "{}", out.1);
}

/// Asserts that `out`, asked at `asked` with a deadline of 3 s, gave up on
/// the coordinator at `addr` at that deadline (not before: it retried),
/// naming the address and the wait.
fn assert_gave_up_at_the_deadline(out: &(Option<i32>, String), asked: Instant, addr: &str) {
    assert!(asked.elapsed() >= Duration::from_secs(3), "gave up before its deadline:\n{}", out.1);
    let at = format!(" at {addr}");
    assert_clear_error(
        out,
        1,
        &[&at, "cannot reach the coordinator", "still so at the deadline, 3.0 s after"],
    );
}

/// `drove train ner` of the tiny model in `dir` as one member of an elastic
/// run of 1 to 2 at `coordinator`, waiting at most 3 s for its world.
fn elastic_member(dir: &Path, coordinator: &str) -> Command {
    let mut cmd = launch_env_removed(Command::new(DROVE));
    cmd.args(tiny_training(dir, 4, &dir.join("out")))
        .args(["--world", "1:2"])
        .env("DROVE_COORDINATOR", coordinator)
        .env("DROVE_RUN_ID", "nobody-serves")
        .env("DROVE_RENDEZVOUS_TIMEOUT_SECS", "3");
    cmd
}

#[test]
fn an_elastic_member_gives_up_on_an_unreachable_coordinator_at_its_deadline_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then released.
    let addr = format!("127.0.0.1:{}", free_port());
    let asked = Instant::now();
    let out = refused(&mut elastic_member(dir.path(), &addr));
    assert_gave_up_at_the_deadline(&out, asked, &addr);
    assert!(out.1.contains("joining run \"nobody-serves\""), "{}", out.1);
}

#[test]
fn a_torchrun_placed_rank_gives_up_on_rank_0_s_coordinator_at_its_deadline_naming_the_address() {
    // Rank 1 of 2 waits for the coordinator rank 0 would serve at
    // MASTER_ADDR:MASTER_PORT; no rank 0 ever starts.
    let port = free_port().to_string();
    let mut cmd = launch_env_removed(Command::new(DROVE));
    cmd.arg("check")
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .env("DROVE_RENDEZVOUS_TIMEOUT_SECS", "3");
    let asked = Instant::now();
    let out = refused(&mut cmd);
    assert_gave_up_at_the_deadline(&out, asked, &format!("127.0.0.1:{port}"));
}
