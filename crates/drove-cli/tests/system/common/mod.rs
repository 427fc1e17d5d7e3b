//! Helpers the process-level tests share: runs with a deadline, `drove run`
//! wrappers, and checkpoints read back for comparison.
#![allow(dead_code)] // each test file uses its own part

pub mod netns;
pub mod slurm;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;
use std::time::Instant;

pub const DROVE: &str = env!("CARGO_BIN_EXE_drove");
pub const DEADLINE: Duration = Duration::from_secs(600);

/// Whether the test command asked that every tool be present
/// (`DROVE_REQUIRE_TOOLS=1`, which `scripts/test.sh` and so CI set).
pub fn tools_required() -> bool {
    std::env::var("DROVE_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// A test that cannot run here for want of a tool: says why and returns, or,
/// where tools are required, fails naming what is missing, so that a missing
/// install step cannot turn a test into a pass.
pub fn skip(why: &str) {
    if tools_required() {
        panic!(
            "this test cannot run: {why}; tools are required (DROVE_REQUIRE_TOOLS=1, as scripts/test.sh sets; 0 lets it skip)"
        );
    }
    eprintln!("skipped: {why}");
}

/// Runs `cmd` to completion, killing it if it outlives the deadline.
pub fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => out.unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on a child we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what} did not finish within {DEADLINE:?}");
        }
    }
}

/// Both streams of a finished command, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `inner` as the program of `drove run --np N`, with its environment.
pub fn under_run(np: usize, inner: Command) -> Command {
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", &np.to_string(), "--"]).arg(inner.get_program()).args(inner.get_args());
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd
}

/// The parameters of the checkpoint `root/latest` names, by tensor name.
pub fn read_latest(root: &Path) -> HashMap<String, Vec<f32>> {
    let latest = std::fs::read_to_string(root.join("latest")).expect("a latest checkpoint");
    let bytes = std::fs::read(root.join(latest.trim()).join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            let values =
                v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (name, values)
        })
        .collect()
}

/// Each applied step's (global loss, gradient norm before clipping) as a
/// JSON object with those two fields (`summary.json`'s `step_scales`, the
/// example's `--scales` lines): they see a gradient's scale, which the
/// parameters after clipping and AdamW do not (g and 2g give one update).
pub fn step_scales<'a>(steps: impl IntoIterator<Item = &'a serde_json::Value>) -> Vec<(f64, f64)> {
    let value = |s: &serde_json::Value, k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} in {s}"));
    steps.into_iter().map(|s| (value(s, "global_loss"), value(s, "grad_norm"))).collect()
}

/// `step_scales` of the run whose output folder is `out` (its `summary.json`).
pub fn summary_scales(out: &Path) -> Vec<(f64, f64)> {
    let path = out.join("summary.json");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .unwrap();
    step_scales(summary["step_scales"].as_array().expect("step_scales in summary.json"))
}

/// The largest relative difference between two runs' losses and gradient
/// norms, step by step (0.5 for a gradient doubled or halved); both must
/// have as many steps, each loss and norm above 0.
pub fn scale_difference(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    assert_eq!(a.len(), b.len(), "as many steps: {a:?} vs {b:?}");
    assert!(a.iter().chain(b).all(|&(l, n)| l > 0.0 && n > 0.0), "{a:?} vs {b:?}");
    let rel = |x: f64, y: f64| (x - y).abs() / x.max(y);
    a.iter().zip(b).map(|(p, q)| rel(p.0, q.0).max(rel(p.1, q.1))).fold(0.0, f64::max)
}

/// Largest absolute difference over the largest absolute value, over every tensor.
pub fn relative_difference(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f32 {
    assert_eq!(a.len(), b.len());
    let (mut diff, mut scale) = (0f32, 0f32);
    for (name, x) in a {
        let y = &b[name];
        for (p, q) in x.iter().zip(y) {
            diff = diff.max((p - q).abs());
            scale = scale.max(p.abs());
        }
    }
    diff / scale
}

/// The real assets (CoNLL-2003, MiniLM), fetched once per test process by
/// `scripts/fetch-assets.sh` into `DROVE_ASSETS` (default `assets/`).
pub fn assets() -> &'static PathBuf {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::var_os("DROVE_ASSETS").map(PathBuf::from).unwrap_or_else(|| root.join("assets"));
        let status = Command::new("bash")
            .arg(root.join("scripts/fetch-assets.sh"))
            .env("DROVE_ASSETS", &dir)
            .stdout(Stdio::null())
            .status()
            .expect("running scripts/fetch-assets.sh");
        assert!(
            status.success(),
            "scripts/fetch-assets.sh failed ({status}); the tests need the real assets"
        );
        dir
    })
}

/// A process with its stdout and stderr read line by line; killed on drop
/// unless it was seen to exit.
pub struct Proc {
    what: String,
    /// The process id.
    pub pid: i32,
    status: Receiver<ExitStatus>,
    stdout: Receiver<String>,
    /// Its stderr, line by line, as it comes.
    pub stderr: Receiver<String>,
    out: Vec<String>,
    /// The stderr lines taken so far.
    pub err: Vec<String>,
    exited: bool,
}

pub fn lines_of(source: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let stdout = lines_of(child.stdout.take().unwrap());
        let stderr = lines_of(child.stderr.take().unwrap());
        let pid = child.id() as i32;
        let (tx, status) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(s) = child.wait() {
                let _ = tx.send(s);
            }
        });
        Proc { what, pid, status, stdout, stderr, out: Vec::new(), err: Vec::new(), exited: false }
    }

    /// `drove args`, logging at the default level.
    pub fn drove(args: &[&str]) -> Proc {
        Proc::spawn(Command::new(DROVE).args(args).env_remove("RUST_LOG"))
    }

    /// Reads stderr lines (kept in `err`) until one satisfies `pred`, for at
    /// most `within`; whether one did.
    pub fn stderr_until(&mut self, within: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let until = Instant::now() + within;
        loop {
            match self.stderr.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    let hit = pred(&line);
                    self.err.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    pub fn stderr_now(&mut self) -> String {
        self.err.extend(self.stderr.try_iter());
        self.err.join("\n")
    }

    /// Waits for a stdout line that satisfies `pred`, and returns it.
    pub fn line(&mut self, within: Duration, pred: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + within;
        loop {
            match self.stdout.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.out.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(e) => {
                    let err = self.stderr_now();
                    panic!(
                        "{}: no expected line on stdout ({e:?}); stdout:\n{}\nstderr:\n{err}",
                        self.what,
                        self.out.join("\n"),
                    )
                }
            }
        }
    }

    /// Waits for the exit; returns the status, every stdout line and all of stderr.
    pub fn finish(mut self, within: Duration) -> (ExitStatus, Vec<String>, String) {
        let until = Instant::now() + within;
        let status = match self.status.recv_timeout(within) {
            Ok(s) => s,
            Err(_) => {
                let err = self.stderr_now();
                panic!(
                    "{} did not exit within {within:?}; stdout:\n{}\nstderr:\n{err}",
                    self.what,
                    self.out.join("\n"),
                )
            }
        };
        self.exited = true;
        let drain = |rx: &Receiver<String>, into: &mut Vec<String>| {
            loop {
                match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(line) => into.push(line),
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => panic!("its output stayed open after it exited"),
                }
            }
        };
        let (mut out, mut err) = (std::mem::take(&mut self.out), std::mem::take(&mut self.err));
        drain(&self.stdout, &mut out);
        drain(&self.stderr, &mut err);
        (status, out, err.join("\n"))
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child, which has not been seen to exit.
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0, "signalling {}", self.what);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited && self.status.try_recv().is_err() {
            // SAFETY: killing our own child (a test failed before it ended).
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}

/// Builds `target` (`["--bin", NAME]`, `["--example", NAME]`) with the cargo
/// that runs the tests, in this test's profile and target folder, with the
/// features this test was built with, resolved over the whole workspace as
/// the test build resolved them: so cargo finds everything built and at most
/// links the one target (with other features it would build burn and the rest
/// again, for minutes). Returns the profile folder (`target/debug`).
pub fn build_like_this_test(target: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps").to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("no profile folder above {}", exe.display()),
    };
    let features: Vec<&str> = [
        ("cuda", cfg!(feature = "cuda")),
        ("nccl", cfg!(feature = "nccl")),
        ("wgpu", cfg!(feature = "wgpu")),
        ("autotune", cfg!(feature = "autotune")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--workspace", "--profile", profile]).args(target);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    let out = run(cmd
        .arg("--target-dir")
        .arg(profile_dir.parent().expect("a target folder"))
        .current_dir(env!("CARGO_MANIFEST_DIR")));
    assert!(out.status.success(), "building {target:?}: {}", text(&out));
    profile_dir
}

/// `drove-coordinator`, built as the tests were (see [`build_like_this_test`]).
pub fn coordinator_binary() -> PathBuf {
    build_like_this_test(&["--bin", "drove-coordinator"]).join("drove-coordinator")
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The `drove-coordinator` binary on `port` and `store`, once it says it listens.
pub fn coordinator(port: u16, store: &Path, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut proc = Proc::spawn(
        Command::new(coordinator_binary())
            .args(["--listen", &listen, "--store", store.to_str().unwrap()])
            .args(extra)
            .env("RUST_LOG", "warn"),
    );
    proc.line(Duration::from_secs(60), |l| l.contains("listening on"));
    proc
}

/// Asserts that `drove runs --store STORE` lists one run, `run_id`, in `state`
/// after `restarts` restarts.
#[allow(dead_code)]
pub fn assert_listed_run(store: &Path, run_id: &str, state: &str, restarts: u64) {
    let out = run(Command::new(DROVE).args(["runs", "--json", "--store"]).arg(store));
    assert!(out.status.success(), "{}", text(&out));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &runs["runs"][0];
    assert_eq!(
        (r["run_id"].as_str(), r["state"].as_str(), r["restarts"].as_u64()),
        (Some(run_id), Some(state), Some(restarts)),
        "{runs}"
    );
}

/// A BERT of MiniLM's vocabulary but 2 layers of width 32, to start from
/// random weights (`--random-init`): the tests of membership need the loop's
/// mechanics, not a model worth evaluating.
///
/// Made once per `dir`: later calls find it (a member started later must not
/// rewrite files another one is reading).
pub fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-model");
    if model.join("config.json").exists() {
        return model;
    }
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(assets().join("minilm/vocab.txt"), model.join("vocab.txt")).unwrap();
    let config = serde_json::json!({
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
        "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "pad_token_id": 0, "model_type": "bert"
    });
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    model
}

/// The arguments of the membership tests' run: `train ner` of the tiny model
/// (made in `dir`) from random weights on `sentences` sentences in batches of
/// 2, without evaluation, every step logged, writing to `out` and tracing its
/// samples to `dir/trace.jsonl` (shared by all its members); the flags a user
/// types, no `--bucket-window` (an elastic run buckets nothing by default).
pub fn tiny_training(dir: &Path, sentences: usize, out: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> =
        ["train", "ner", "--batch-size", "2", "--epochs", "1", "--eval", ""].iter().map(Into::into).collect();
    args.extend(["--max-train-sentences".into(), sentences.to_string().into()]);
    args.extend(["--workers", "1", "--log-every", "1", "--dropout", "0", "--random-init"].map(Into::into));
    args.extend(["--data".into(), assets().join("conll2003").into()]);
    args.extend(["--model".into(), tiny_model(dir).into()]);
    args.extend(["--out".into(), out.as_os_str().to_owned()]);
    args.extend(["--trace-samples".into(), dir.join("trace.jsonl").into()]);
    args
}

/// The trace's (generation, world) pairs, and how often each sample was applied.
pub fn traced(dir: &Path) -> (Vec<(u64, usize)>, BTreeMap<usize, usize>) {
    let (mut worlds, mut applied) = (Vec::new(), BTreeMap::new());
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).expect("the trace was written");
    for line in trace.lines() {
        let line: drove_ner::TraceLine = serde_json::from_str(line).expect("a trace line");
        worlds.push((line.generation, line.world));
        for (sample, _) in line.samples {
            *applied.entry(sample).or_insert(0) += 1;
        }
    }
    worlds.sort_unstable();
    worlds.dedup();
    (worlds, applied)
}

/// Every sample of `0..n` applied exactly once.
pub fn assert_each_once(applied: &BTreeMap<usize, usize>, n: usize) {
    assert_eq!(applied.keys().copied().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>(), "a sample missing");
    assert!(applied.values().all(|&k| k == 1), "a sample applied twice: {applied:?}");
}

/// Prefixes and names of every launcher's variables (drove's, Slurm's, MPI's, torchrun's).
const LAUNCHER_PREFIXES: [&str; 6] = ["DROVE_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_"];
const LAUNCHER_VARS: [&str; 7] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JOB_COMPLETION_INDEX",
];

/// `cmd` without any launcher's variables of this process's own (it sees
/// only those a test sets), one compute thread, and warnings only.
pub fn launch_env_removed(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars() {
        if LAUNCHER_PREFIXES.iter().any(|p| k.starts_with(p)) || LAUNCHER_VARS.contains(&k.as_str()) {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "warn").env("RAYON_NUM_THREADS", "1");
    cmd
}
