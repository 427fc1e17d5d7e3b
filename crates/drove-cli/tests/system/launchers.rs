//! Under the launchers people already run: a torchrun-style environment,
//! OpenMPI's `mpirun`, and Slurm's `srun` and `sbatch` on a one-node cluster
//! the test starts itself (`munged`, `slurmctld` and `slurmd` with their own
//! config, folders and ports under a temporary folder, stopped at the end),
//! and `srun -N 3` across three network namespaces as Slurm nodes.
//! The real launchers come from Debian (`scripts/launcher-tools.sh`, run by
//! the test command as root); where one is missing its tests skip, saying why.
//!
//! No process gets a drove variable but where a test says so: each finds its
//! place from its launcher's own variables.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::netns::Net;
use crate::common::slurm::{Nodes, Slurm};
use crate::common::{
    DEADLINE, DROVE, Proc, assets, coordinator, free_port, launch_env_removed, read_latest,
    relative_difference, run, text, under_run,
};
use serde_json::Value;

/// Each stdout line of `out` as JSON (`drove check --json` prints one per rank).
fn reports(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// Asserts that `reports` are ranks 0..world of one check, each summing the
/// ranks, found by `launcher`; returns their run id.
fn assert_check(reports: &[Value], world: usize, launcher: &str, context: &str) -> String {
    let mut ranks: Vec<u64> = reports.iter().map(|r| r["rank"].as_u64().expect("a rank")).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..world as u64).collect::<Vec<_>>(), "{context}");
    let sum = (world * (world - 1) / 2) as u64;
    for r in reports {
        assert_eq!((r["world_size"].as_u64(), r["sum"].as_u64()), (Some(world as u64), Some(sum)), "{r}");
        assert_eq!(r["launcher"], launcher, "{r}");
        assert_eq!(r["run_id"], reports[0]["run_id"], "one run: {r}");
    }
    reports[0]["run_id"].as_str().expect("a run id").to_string()
}

/// The training every launcher runs: MiniLM on 24 sentences, 2 ranks of 4
/// rows for 3 steps, a checkpoint at the end, in `out`.
fn train_args(out: &Path) -> Vec<String> {
    let a = assets();
    let mut args: Vec<String> =
        ["train", "ner", "--max-train-sentences", "24", "--batch-size", "4", "--epochs", "1"]
            .map(String::from)
            .to_vec();
    args.extend(
        ["--dropout", "0", "--eval", "", "--lr", "1e-3", "--warmup", "0", "--workers", "1"].map(String::from),
    );
    args.push(format!("--data={}", a.join("conll2003").display()));
    args.push(format!("--model={}", a.join("minilm").display()));
    args.push(format!("--out={}", out.display()));
    args
}

/// The same training under `drove run --np 2`: the parameters every
/// launcher must end with (run once per test process, its folder removed).
fn under_drove_run() -> &'static Params {
    static BASELINE: std::sync::OnceLock<Params> = std::sync::OnceLock::new();
    BASELINE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("drove-run");
        let mut inner = launch_env_removed(Command::new(DROVE));
        inner.args(train_args(&out));
        let done = run(&mut under_run(2, inner));
        assert!(done.status.success(), "{}", text(&done));
        read_latest(&out.join("checkpoints"))
    })
}

type Params = std::collections::HashMap<String, Vec<f32>>;

/// Whether this machine runs the real launchers' tests; why not, if not.
fn unsupported(program: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (scripts/launcher-tools.sh installs the launchers as root)".into());
    }
    let found = Command::new("sh").args(["-c", &format!("command -v {program}")]).output();
    match found {
        Ok(o) if o.status.success() => None,
        _ => Some(format!("{program} is not installed (bash scripts/launcher-tools.sh installs it)")),
    }
}

#[test]
fn three_processes_with_torchrun_s_variables_meet_at_rank_0_s_coordinator() {
    let port = free_port().to_string();
    // Ranks 2 and 1 start first: they wait for rank 0's coordinator to come up.
    let procs: Vec<Proc> = [2, 1, 0]
        .iter()
        .map(|r| {
            let mut cmd = launch_env_removed(Command::new(DROVE));
            cmd.args(["check", "--json"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "3")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port);
            Proc::spawn(&mut cmd)
        })
        .collect();
    let mut seen = Vec::new();
    for p in procs {
        let (status, out, err) = p.finish(DEADLINE);
        assert!(status.success(), "{err}");
        seen.extend(
            out.iter().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    let run_id = assert_check(&seen, 3, "torchrun", "three torchrun-style processes");
    assert_eq!(run_id, format!("torchrun-127.0.0.1-{port}"));
    assert!(seen.iter().all(|r| r["coordinator"] == "master-addr"), "{seen:?}");
}

/// `mpirun -np N PROGRAM...` meeting at a coordinator the test serves (the
/// returned process; only `DROVE_COORDINATOR` is passed on, with
/// `RAYON_NUM_THREADS`), or `None`, saying why, where there is no mpirun.
fn under_mpirun(np: usize, dir: &Path) -> Option<(Proc, Command)> {
    if let Some(why) = unsupported("mpirun") {
        crate::common::skip(&why);
        return None;
    }
    let port = free_port();
    let served = coordinator(port, &dir.join("store"), &[]);
    let mut cmd = launch_env_removed(Command::new("mpirun"));
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()])
        .args(["-x", "DROVE_COORDINATOR", "-x", "RAYON_NUM_THREADS", DROVE])
        .env("DROVE_COORDINATOR", format!("127.0.0.1:{port}"));
    Some((served, cmd))
}

#[test]
fn mpirun_places_three_ranks_that_sum_through_the_given_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_coordinator, mut cmd)) = under_mpirun(3, dir.path()) else { return };
    let out = run(cmd.args(["check", "--json"]));
    assert!(out.status.success(), "{}", text(&out));
    let run_id = assert_check(&reports(&out), 3, "openmpi", &text(&out));
    assert!(run_id.starts_with("openmpi-"), "the run id is the OpenMPI job's: {run_id}");
}

#[test]
fn a_2_rank_minilm_run_under_mpirun_ends_with_drove_run_s_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_coordinator, mut cmd)) = under_mpirun(2, dir.path()) else { return };
    let out = dir.path().join("mpirun");
    let done = run(cmd.args(train_args(&out)));
    assert!(done.status.success(), "{}", text(&done));
    let d = relative_difference(&read_latest(&out.join("checkpoints")), under_drove_run());
    assert!(d < 1e-6, "mpirun's run differs from drove run's by {d} (relative)");
}

#[test]
fn under_srun_and_sbatch_ranks_need_no_drove_variable_and_train_as_under_drove_run() {
    if let Some(why) = unsupported("slurmd").or_else(|| unsupported("munged")) {
        crate::common::skip(&why);
        return;
    }
    let slurm =
        Slurm::start(Nodes::ThisHost).unwrap_or_else(|e| panic!("starting a one-node Slurm cluster: {e}"));
    srun_places_three_ranks(&slurm);
    an_sbatch_of_a_2_rank_minilm_run_ends_with_drove_run_s_parameters(&slurm);
}

/// `srun -n 3 drove check`: each rank placed by Slurm's variables, meeting at
/// rank 0's coordinator on the node list's first host.
fn srun_places_three_ranks(slurm: &Slurm) {
    let out = run(slurm.cmd("srun").args(["-n", "3", "--overcommit", DROVE, "check", "--json"]));
    assert!(out.status.success(), "{}", text(&out));
    let reports = reports(&out);
    let run_id = assert_check(&reports, 3, "slurm", &text(&out));
    assert!(run_id.starts_with("slurm-"), "the run id is the Slurm job's: {run_id}");
    assert!(reports.iter().all(|r| r["coordinator"] == "slurm-first-host"), "{reports:?}");
}

/// `sbatch` of a script that `srun`s the 2-rank MiniLM run.
fn an_sbatch_of_a_2_rank_minilm_run_ends_with_drove_run_s_parameters(slurm: &Slurm) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sbatch");
    let script = dir.path().join("train.sbatch");
    let args: Vec<String> = train_args(&out).iter().map(|a| format!("'{a}'")).collect();
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --overcommit\n#SBATCH --output={log}\nexport RAYON_NUM_THREADS=1\nsrun {DROVE} {}\n",
            args.join(" "),
            log = dir.path().join("job.log").display(),
        ),
    )
    .unwrap();
    let done = run(slurm.cmd("sbatch").arg("--wait").arg(&script));
    let log = std::fs::read_to_string(dir.path().join("job.log")).unwrap_or_default();
    assert!(done.status.success(), "{}\njob log:\n{log}", text(&done));
    let d = relative_difference(&read_latest(&out.join("checkpoints")), under_drove_run());
    assert!(d < 1e-6, "the sbatch run differs from drove run's by {d} (relative)\n{log}");
}

#[test]
fn srun_across_three_namespaces_as_nodes_meets_at_the_first_node() {
    let missing = unsupported("slurmd").or_else(|| unsupported("munged")).or_else(|| unsupported("nsenter"));
    if let Some(why) = missing.or_else(crate::common::netns::unsupported) {
        crate::common::skip(&why);
        return;
    }
    let net = Net::new(3).expect("building the namespaces");
    let slurm =
        Slurm::start(Nodes::Namespaces(&net)).unwrap_or_else(|e| panic!("starting 3 Slurm nodes: {e}"));
    // The namespaces share this kernel, so the ranks are told to use TCP, as
    // they would between machines (a transport setting, not a place).
    let mut cmd = slurm.cmd("srun");
    cmd.args([
        "-N",
        "3",
        "--ntasks-per-node",
        "1",
        "env",
        "DROVE_COMM_TRANSPORT=tcp",
        DROVE,
        "check",
        "--json",
    ]);
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out));
    let reports = reports(&out);
    assert_check(&reports, 3, "slurm", &text(&out));
    assert!(
        reports.iter().all(|r| r["transport"] == "tcp" && r["coordinator"] == "slurm-first-host"),
        "{reports:?}"
    );
}
