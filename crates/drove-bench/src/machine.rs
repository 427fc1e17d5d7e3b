//! The machine a report was measured on.

use serde::Serialize;

/// What every report says of the machine: its CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// Threads this process may run at once, if known.
    pub nproc: Option<usize>,
    /// The CPU's model name from `/proc/cpuinfo`, if there is one.
    pub cpu_model: Option<String>,
}

impl Machine {
    /// This machine.
    pub fn detect() -> Self {
        let nproc = std::thread::available_parallelism().ok().map(|n| n.get());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_string())
        });
        Machine { nproc, cpu_model }
    }
}
