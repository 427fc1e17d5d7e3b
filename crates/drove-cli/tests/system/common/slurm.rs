//! A Slurm cluster of this machine for the launcher tests: `munged`,
//! `slurmctld` and one `slurmd` per node, with their config, state, spool,
//! logs and socket under a temporary folder and ports of their own; stopped
//! on drop. Its nodes are this host, or network namespaces (one `slurmd` in
//! each, with its own `NodeName` and `NodeAddr`, and a hosts file naming them
//! all, bind-mounted over `/etc/hosts` in a mount namespace of its own so the
//! host's is untouched).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::netns::Net;
use super::{free_port, launch_env_removed, text};

/// Where the nodes run.
pub enum Nodes<'a> {
    /// One node: this host, as `slurmd -C` describes it.
    ThisHost,
    /// One node per namespace of `net`, named `n0`, `n1`, ...
    Namespaces(&'a Net),
}

pub struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    pub fn start(nodes: Nodes<'_>) -> Result<Slurm, String> {
        let dir = tempfile::Builder::new().prefix("drove-slurm-").tempdir().map_err(|e| e.to_string())?;
        let slurm = Slurm { dir };
        let root = slurm.root();
        for sub in ["munge", "state", "log"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| e.to_string())?;
        }
        slurm.start_munge()?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| e.to_string())?;
        let (ctld_addr, node_lines, names) = match &nodes {
            Nodes::ThisHost => {
                ("127.0.0.1".to_string(), vec![format!("{} NodeAddr=127.0.0.1", this_node()?)], 1)
            }
            Nodes::Namespaces(net) => {
                let gateway = net.address_bridge()?;
                let (n, mut hosts) =
                    (net.spaces(), format!("127.0.0.1 localhost\n{gateway} {}\n", host.trim()));
                let mut lines = Vec::new();
                for i in 0..n {
                    lines.push(format!("NodeName=n{i} NodeAddr={} CPUs=1", net.addr(i)));
                    hosts.push_str(&format!("{} n{i}\n", net.addr(i)));
                }
                std::fs::write(root.join("hosts"), hosts).map_err(|e| e.to_string())?;
                (gateway, lines, n)
            }
        };
        std::fs::write(root.join("slurm.conf"), slurm.conf(host.trim(), &ctld_addr, &node_lines))
            .map_err(|e| e.to_string())?;
        daemon(slurm.cmd("slurmctld").args(["-c", "-f"]).arg(root.join("slurm.conf")))?;
        match nodes {
            Nodes::ThisHost => daemon(slurm.cmd("slurmd").arg("-f").arg(root.join("slurm.conf")))?,
            Nodes::Namespaces(net) => {
                for i in 0..names {
                    let script = format!(
                        "mount --bind {hosts} /etc/hosts && exec slurmd -N n{i} -f {conf}",
                        hosts = root.join("hosts").display(),
                        conf = root.join("slurm.conf").display()
                    );
                    let mut cmd = slurm.cmd("nsenter");
                    cmd.arg(format!("--net=/var/run/netns/{}", net.ns(i))).args([
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        &script,
                    ]);
                    daemon(&mut cmd)?;
                }
            }
        }
        slurm.wait_idle(names)?;
        Ok(slurm)
    }

    fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// `munged` on a socket and key of this cluster's own.
    fn start_munge(&self) -> Result<(), String> {
        let root = self.root();
        let mut key = [0u8; 128];
        let mut random = std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?;
        std::io::Read::read_exact(&mut random, &mut key).map_err(|e| e.to_string())?;
        std::fs::write(root.join("munge/munge.key"), key).map_err(|e| e.to_string())?;
        for (mode, p) in
            [(0o755, root.clone()), (0o700, root.join("munge")), (0o600, root.join("munge/munge.key"))]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
        }
        let m = |name: &str| root.join("munge").join(name).display().to_string();
        daemon(Command::new("munged").args([
            "--force".to_string(),
            format!("--socket={}", m("socket")),
            format!("--key-file={}", m("munge.key")),
            format!("--pid-file={}", m("pid")),
            format!("--log-file={}", m("log")),
            format!("--seed-file={}", m("seed")),
        ]))
    }

    fn conf(&self, host: &str, ctld_addr: &str, node_lines: &[String]) -> String {
        let r = |p: &str| self.dir.path().join(p).display().to_string();
        let mut conf = format!(
            "ClusterName=drove\nSlurmctldHost={host}({ctld_addr})\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
             SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
             StateSaveLocation={state}\nSlurmdSpoolDir={spool}\nSlurmctldPidFile={cpid}\nSlurmdPidFile={dpid}\n\
             SlurmctldLogFile={clog}\nSlurmdLogFile={dlog}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\n\
             ReturnToService=2\nJobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n",
            ctld = free_port(),
            slurmd = free_port(),
            sock = r("munge/socket"),
            state = r("state"),
            spool = r("spool-%n"),
            cpid = r("slurmctld.pid"),
            dpid = r("slurmd-%n.pid"),
            clog = r("log/slurmctld.log"),
            dlog = r("log/slurmd-%n.log"),
        );
        for line in node_lines {
            conf.push_str(&format!("{line} State=UNKNOWN\n"));
        }
        conf.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
        conf
    }

    /// Until `n` nodes are idle (every slurmd registered), at most 60 s.
    fn wait_idle(&self, n: usize) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.cmd("sinfo").args(["-h", "-N", "-o", "%T"]).output().map_err(|e| e.to_string())?;
            let idle = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.trim() == "idle").count();
            if idle == n {
                return Ok(());
            }
            if Instant::now() > until {
                let log =
                    std::fs::read_to_string(self.dir.path().join("log/slurmctld.log")).unwrap_or_default();
                return Err(format!("{idle} of {n} nodes idle after 60 s; slurmctld's log:\n{log}"));
            }
        }
    }

    /// `program` with this cluster's config and no launcher variables of the test's own.
    pub fn cmd(&self, program: &str) -> Command {
        let mut cmd = launch_env_removed(Command::new(program));
        cmd.env("SLURM_CONF", self.dir.path().join("slurm.conf"));
        cmd
    }

    /// The daemons' pid files.
    fn pid_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.dir.path().join("slurmctld.pid"), self.dir.path().join("munge/pid")];
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            files.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("slurmd-"))),
            );
        }
        files
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = self.cmd("scancel").args(["--full", "--user", "root"]).output();
        for file in self.pid_files() {
            if let Ok(p) = std::fs::read_to_string(&file)
                && let Ok(p) = p.trim().parse::<i32>()
            {
                // SAFETY: kill(2) on a daemon this test started.
                unsafe { libc::kill(p, libc::SIGTERM) };
            }
        }
    }
}

/// This host's node line, as `slurmd -C` prints it (without its uptime).
fn this_node() -> Result<String, String> {
    let out = Command::new("slurmd").arg("-C").output().map_err(|e| format!("slurmd -C: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_default();
    Ok(line.split(" UpTime").next().unwrap_or_default().to_string())
}

/// Runs a daemon that forks into the background, failing with its output.
fn daemon(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() { Ok(()) } else { Err(format!("{cmd:?}: {}", text(&out))) }
}
