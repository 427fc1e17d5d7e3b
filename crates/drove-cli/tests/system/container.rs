//! The image run for real (Linux, root; skipped with a printed reason where
//! podman cannot run): `scripts/container-tools.sh` installs podman, runc and
//! debootstrap from the Debian archive and makes the base `debian:bookworm-slim`
//! with debootstrap (no container registry is reachable); the test builds
//! `deploy/Dockerfile`'s `prebuilt` target from the binaries this test run
//! built, then on a podman network of its own: the coordinator container
//! (`drove-coordinator`) passes its gRPC health check, two rank containers
//! train through it (each container has its own network namespace, so two
//! hosts: the TCP ring), and the host queries the run's metrics over gRPC.
//! Everything it makes is removed on drop, however the test ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{DROVE, assets, coordinator_binary, run, text};

/// The workspace root (this crate is `crates/drove-cli`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The containers.conf to use, or why podman cannot run here.
fn tools() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (podman with runc, networks)".into());
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/container-tools.sh"))
        .output()
        .map_err(|e| format!("running scripts/container-tools.sh: {e}"))?;
    let conf = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || conf.is_empty() {
        return Err(format!(
            "scripts/container-tools.sh ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let conf = PathBuf::from(conf);
    // Installed is not enough: podman must be able to run a container here.
    let probe = Command::new("podman")
        .env("CONTAINERS_CONF", &conf)
        .args(["--runtime", "runc", "run", "--rm", "--network", "none", "--ulimit", "host"])
        .args(["docker.io/library/debian:bookworm-slim", "true"])
        .output()
        .map_err(|e| format!("running podman: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "podman cannot run a container here ({}): {}",
            probe.status,
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok(conf)
}

/// Copies `from` to `to` without its debug sections (a tenth of the size) where
/// `strip` exists, else as it is.
fn install(from: &Path, to: &Path) {
    let stripped = Command::new("strip").arg("-o").arg(to).arg(from).status().is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    }
}

/// Podman with the project's containers.conf (runc, no default ulimits).
struct Podman {
    conf: PathBuf,
    tag: String,
    image: String,
    network: String,
    containers: Vec<String>,
}

impl Podman {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", &self.conf).arg("--runtime").arg("runc");
        cmd
    }

    /// Runs `podman ARGS`, asserting success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = run(self.cmd().args(args));
        assert!(out.status.success(), "podman {}: {}", args.join(" "), text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn name(&mut self, role: &str) -> String {
        let name = format!("{}-{role}", self.tag);
        self.containers.push(name.clone());
        name
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = self.cmd().args(["rm", "--force", "--time", "0", c]).output();
        }
        let _ = self.cmd().args(["network", "rm", "--force", &self.network]).output();
        let _ = self.cmd().args(["rmi", "--force", &self.image]).output();
    }
}

#[allow(clippy::too_many_lines)] // tests are exempt: one scenario, read top to bottom
#[test]
fn the_image_serves_a_healthy_coordinator_and_two_rank_containers_train_through_it() {
    let conf = match tools() {
        Ok(conf) => conf,
        Err(why) => {
            crate::common::skip(&why);
            return;
        }
    };
    let id = std::process::id() % 100_000;
    let tag = format!("drove-test-{id}");
    let mut podman = Podman {
        conf,
        image: format!("localhost/{tag}:latest"),
        network: format!("{tag}-net"),
        tag,
        containers: Vec::new(),
    };

    // The runtime stage, from the binaries this test run built.
    let context = tempfile::tempdir().unwrap();
    std::fs::create_dir(context.path().join("bin")).unwrap();
    install(Path::new(DROVE), &context.path().join("bin/drove"));
    install(&coordinator_binary(), &context.path().join("bin/drove-coordinator"));
    let dockerfile = root().join("deploy/Dockerfile");
    let image = podman.image.clone();
    podman.ok(&["build", "--quiet", "--format", "docker", "--target", "prebuilt", "--tag", &image, "--file"]
        .into_iter()
        .chain([dockerfile.to_str().unwrap(), context.path().to_str().unwrap()])
        .collect::<Vec<_>>());
    let user = podman.ok(&["image", "inspect", "--format", "{{.Config.User}}", &image]);
    assert_eq!(user.trim(), "drove", "the image runs as a non-root user");

    // A network of its own, with the coordinator at a fixed address on it.
    let subnet = format!("10.{}.{}", 200 + id % 50, (id / 50) % 250);
    let network = podman.network.clone();
    podman.ok(&["network", "create", "--subnet", &format!("{subnet}.0/24"), &network]);
    let coord_ip = format!("{subnet}.2");
    let coord = podman.name("coordinator");
    podman.ok(&[
        "run",
        "--detach",
        "--name",
        &coord,
        "--network",
        &network,
        "--ip",
        &coord_ip,
        "--ulimit",
        "host",
        "--health-interval",
        "disable",
        "--entrypoint",
        "/usr/local/bin/drove-coordinator",
        &image,
        "--listen",
        "0.0.0.0:50051",
        "--store",
        "/var/lib/drove",
    ]);
    // Ready when it says so (the log stream ends if it exits instead).
    let mut follow = podman
        .cmd()
        .args(["logs", "--follow", &coord])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("following the coordinator's log");
    let stdout = follow.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.contains("listening on"));
        let _ = tx.send(ready);
    });
    let ready = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(ready, "the coordinator did not say it was listening: {}", podman.ok(&["logs", &coord]));
    podman.ok(&["healthcheck", "run", &coord]);
    let health = podman.ok(&["inspect", "--format", "{{.State.Health.Status}}", &coord]);
    assert_eq!(health.trim(), "healthy");
    let addr = format!("{coord_ip}:50051");
    let out = run(Command::new(DROVE).args(["health", "--coordinator", &addr]));
    assert!(out.status.success(), "health from the host: {}", text(&out));

    // Two rank containers, the assets mounted read-only, the output on the host.
    let out_dir = tempfile::tempdir().unwrap();
    // SAFETY: chown(2) on a folder this test made; the image's user is uid 10001.
    let path = std::ffi::CString::new(out_dir.path().to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 10001, 10001) }, 0, "chown of the output folder");
    let assets = assets().clone();
    let run_id = format!("container-{id}");
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let name = podman.name(&format!("rank{r}"));
            let mut cmd = podman.cmd();
            cmd.args(["run", "--name", &name, "--network", &network, "--ulimit", "host", "--no-healthcheck"])
                .arg("--volume")
                .arg(format!("{}:/opt/drove/assets:ro", assets.display()))
                .arg("--volume")
                .arg(format!("{}:/out", out_dir.path().display()))
                .args(["--env", &format!("DROVE_COORDINATOR=http://{addr}")])
                .args(["--env", &format!("DROVE_RUN_ID={run_id}"), "--env", "DROVE_WORLD_SIZE=2"])
                .args([
                    "--env",
                    &format!("DROVE_RANK={r}"),
                    "--env",
                    "RUST_LOG=info",
                    "--env",
                    "RAYON_NUM_THREADS=1",
                ])
                .arg(&image)
                .args(["train", "ner", "--max-train-sentences", "16", "--batch-size", "4", "--epochs", "1"])
                .args(["--eval", "", "--workers", "1", "--data", "/opt/drove/assets/conll2003"])
                .args(["--model", "/opt/drove/assets/minilm", "--out", "/out/run"]);
            std::thread::spawn(move || run(&mut cmd))
        })
        .collect();
    for (r, rank) in ranks.into_iter().enumerate() {
        let out = rank.join().expect("a rank's thread");
        let log = text(&out);
        assert!(out.status.success(), "rank {r}: {log}");
        // Each container has its own network namespace: two hosts, so the ring.
        assert!(log.contains("data moves over tcp"), "rank {r} should use the TCP ring: {log}");
        if r == 0 {
            assert!(log.contains("trained 2 steps on 2 rank(s)"), "{log}");
        }
    }
    let checkpoint = out_dir.path().join("run/checkpoints/latest");
    assert!(checkpoint.exists(), "no checkpoint at {} from the containers", checkpoint.display());

    // The run's metrics, from the host over gRPC.
    let out = run(Command::new(DROVE).args([
        "metrics",
        "--coordinator",
        &addr,
        "--run",
        &run_id,
        "--name",
        "loss",
        "--json",
    ]));
    assert!(out.status.success(), "metrics: {}", text(&out));
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metrics JSON");
    let points = metrics["points"].as_array().expect("points");
    let steps: Vec<f64> = points.iter().map(|p| p["step"].as_f64().unwrap()).collect();
    assert_eq!(steps, [1.0, 2.0], "{metrics}");
    for p in points {
        assert_eq!(p["count"], 2, "both ranks' losses at each step: {metrics}");
        assert!(p["value"].as_f64().unwrap().is_finite(), "{metrics}");
    }
}
