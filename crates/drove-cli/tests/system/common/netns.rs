//! Network namespaces as hosts for the process-level tests: a bridge, and
//! namespaces on it each with its own address, named uniquely per test
//! process and removed on drop (Linux, root).

use std::path::Path;
use std::process::Command;

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A bridge and `n` namespaces, namespace `i` at `10.X.Y.(10 + i)`. Everything
/// is removed on drop (deleting a namespace deletes its veth pair).
pub struct Net {
    tag: String,
    subnet: String,
    spaces: usize,
}

impl Net {
    pub fn new(spaces: usize) -> Result<Net, String> {
        // Interface names have at most 15 characters: "dv" + 5 digits + role + index.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let id = std::process::id() % 100_000;
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let tag = format!("dv{id:05}{k}");
        let subnet = format!("10.{}.{}", 100 + id % 100, (id as usize / 100) % 25 * 10 + k);
        let net = Net { tag, subnet, spaces: 0 };
        net.build(spaces)
    }

    fn build(mut self, spaces: usize) -> Result<Net, String> {
        let bridge = format!("{}b", self.tag);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..spaces {
            let (ns, host, inner) = (self.ns(i), format!("{}h{i}", self.tag), format!("{}c{i}", self.tag));
            ip(&["netns", "add", &ns])?;
            self.spaces = i + 1;
            ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &host, "master", &bridge, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", self.addr(i)), "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(self)
    }

    /// The bridge's own address, `10.X.Y.1`, given to it on the host side
    /// (for a daemon the namespaces reach, such as `slurmctld`).
    pub fn address_bridge(&self) -> Result<String, String> {
        let gateway = format!("{}.1", self.subnet);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &format!("{}b", self.tag)])?;
        Ok(gateway)
    }

    /// How many namespaces it has.
    pub fn spaces(&self) -> usize {
        self.spaces
    }

    /// Namespace `i`'s name.
    pub fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    pub fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, 10 + i)
    }

    /// Sets namespace `i`'s link down: its host is gone from the network while
    /// its processes live on.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.ns(i), "link", "set", &format!("{}c{i}", self.tag), "down"])
    }

    /// `program args` inside namespace `i`.
    pub fn exec(&self, i: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i)]).arg(program);
        cmd
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.spaces {
            // Deleting the host end removes the pair at once; a namespace
            // itself outlives its name while a process is still in it.
            let _ = ip(&["link", "delete", &format!("{}h{i}", self.tag)]);
            let _ = ip(&["netns", "delete", &self.ns(i)]);
        }
        let _ = ip(&["link", "delete", &format!("{}b", self.tag)]);
    }
}

/// Why the test cannot run here, if it cannot.
pub fn unsupported() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces)".into());
    }
    let probe = format!("dvprobe{}", std::process::id() % 100_000);
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "delete", &probe]);
            None
        }
        Err(e) => Some(format!("network namespaces are not available: {e}")),
    }
}
