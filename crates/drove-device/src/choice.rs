//! Which device a rank trains on ([`DeviceChoice`], `--device`): `cpu`, `cuda`
//! (the GPU of this rank's local rank, Horovod's "pin each GPU"), `cuda:N`,
//! `wgpu` (the adapter of the local rank), `wgpu:N`, or `help` (list the
//! devices and stop); and how a GPU run's gradients are averaged
//! ([`GradientPath`], `--gradient-path`). The choice and its parsing are here
//! for every build; the backends themselves are [`crate::cuda`] (feature
//! `cuda`) and [`crate::wgpu`] (feature `wgpu`).

use std::fmt;
use std::str::FromStr;

/// A `--device` value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU backend (`flex`).
    #[default]
    Cpu,
    /// A GPU through burn-cuda: `Some(n)` for `cuda:n`, `None` for `cuda`
    /// (the GPU of the local rank; see [`gpu_ordinal`](crate::gpu_ordinal)).
    Cuda(Option<usize>),
    /// A GPU through burn's wgpu (Vulkan, Metal, DX12): `Some(n)` for
    /// `wgpu:n`, the n-th adapter wgpu lists; `None` for `wgpu` (the adapter
    /// of the local rank).
    Wgpu(Option<usize>),
    /// `help`: list the devices this drove can train on, and stop.
    List,
}

const EXPECTED: &str = "expected cpu, cuda, cuda:N, wgpu, wgpu:N (N a GPU or adapter number) or help";

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(None)),
            "wgpu" => Ok(DeviceChoice::Wgpu(None)),
            "help" | "list" => Ok(DeviceChoice::List),
            other => {
                let number = |prefix: &str| other.strip_prefix(prefix).and_then(|n| n.parse::<usize>().ok());
                match (number("cuda:"), number("wgpu:")) {
                    (Some(n), _) => Ok(DeviceChoice::Cuda(Some(n))),
                    (_, Some(n)) => Ok(DeviceChoice::Wgpu(Some(n))),
                    _ => Err(format!("unknown device {other:?}: {EXPECTED}")),
                }
            }
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(None) => f.write_str("cuda"),
            DeviceChoice::Cuda(Some(n)) => write!(f, "cuda:{n}"),
            DeviceChoice::Wgpu(None) => f.write_str("wgpu"),
            DeviceChoice::Wgpu(Some(n)) => write!(f, "wgpu:{n}"),
            DeviceChoice::List => f.write_str("help"),
        }
    }
}

impl DeviceChoice {
    /// Whether this is a GPU (`cuda[:N]` or `wgpu[:N]`): a trainer then keeps
    /// parameters and optimizer state on the device unless asked otherwise.
    pub fn is_gpu(self) -> bool {
        matches!(self, DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_))
    }

    /// What a batch's length is padded up to a multiple of, unless asked: 16
    /// on a GPU (a run then compiles kernels for at most 8 lengths of 128
    /// tokens, instead of up to 128), 1 on the CPU (its kernels are not
    /// compiled per shape; padding would only add work).
    pub fn pad_multiple(self, asked: Option<usize>) -> usize {
        match (asked, self) {
            (Some(n), _) => n.max(1),
            (None, DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_)) => 16,
            (None, _) => 1,
        }
    }

    /// The micro-batches to run for `asked` on this device: as asked, except
    /// that on a GPU "one per thread" (0) means one, since the GPU runs the
    /// whole batch and splitting it across CPU threads would only cut the
    /// kernels.
    pub fn micro_batches(self, asked: usize) -> usize {
        match (asked, self) {
            (0, DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_)) => 1,
            (n, _) => n,
        }
    }
}

/// How a GPU run's gradient buckets are averaged across ranks:
/// `--gradient-path`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradientPath {
    /// NCCL in device memory, unless ranks share a GPU (NCCL before 2.30
    /// refuses two ranks on one device): then staged through the host, as
    /// Horovod falls back to host collectives.
    #[default]
    Auto,
    /// NCCL in device memory (CUDA with feature `nccl`).
    Nccl,
    /// Copied to the host, averaged by the `Collective`, copied back.
    Host,
}

impl FromStr for GradientPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GradientPath::Auto),
            "nccl" => Ok(GradientPath::Nccl),
            "host" => Ok(GradientPath::Host),
            other => Err(format!("unknown gradient path {other:?}: expected auto, nccl or host")),
        }
    }
}

impl fmt::Display for GradientPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GradientPath::Auto => "auto",
            GradientPath::Nccl => "nccl",
            GradientPath::Host => "host",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        for s in ["cpu", "cuda", "cuda:0", "cuda:3", "wgpu", "wgpu:0", "wgpu:2", "help"] {
            assert_eq!(s.parse::<DeviceChoice>().unwrap().to_string(), s);
        }
        assert_eq!("gpu".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(None)));
        assert_eq!("list".parse::<DeviceChoice>(), Ok(DeviceChoice::List));
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", "wgpu:", "wgpu:one", "vulkan", ""] {
            let e = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(e.contains("expected cpu, cuda, cuda:N, wgpu, wgpu:N"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_gpu_runs_one_micro_batch_and_pads_to_16() {
        assert_eq!((DeviceChoice::Cpu.is_gpu(), DeviceChoice::Cpu.micro_batches(0)), (false, 0));
        assert_eq!(DeviceChoice::Cpu.pad_multiple(None), 1);
        let gpu = DeviceChoice::Cuda(Some(1));
        assert_eq!((gpu.is_gpu(), gpu.micro_batches(0), gpu.micro_batches(4)), (true, 1, 4));
        let wgpu = DeviceChoice::Wgpu(None);
        assert_eq!((wgpu.is_gpu(), wgpu.micro_batches(0), wgpu.pad_multiple(None)), (true, 1, 16));
        assert_eq!(wgpu.pad_multiple(Some(0)), 1);
    }
}
