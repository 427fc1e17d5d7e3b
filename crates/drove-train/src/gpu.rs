//! Which device a rank trains on: `cpu`, `cuda` (the GPU of this rank's local
//! rank, Horovod's "pin each GPU"), `cuda:N`, `wgpu` (the adapter of the local
//! rank), `wgpu:N`, or `help` (list the adapters and stop). The choice and its
//! parsing are here for every build; the backends themselves are
//! `drove_train::cuda` (feature `cuda`) and `drove_train::wgpu` (feature `wgpu`).

use std::fmt;
use std::str::FromStr;

use crate::Placement;

/// A `--device` value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU backend (`flex`).
    #[default]
    Cpu,
    /// A GPU through burn-cuda: `Some(n)` for `cuda:n`, `None` for `cuda`
    /// (the GPU of the local rank; see [`gpu_ordinal`]).
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
    /// Where parameters and optimizer state live unless asked otherwise:
    /// flat host buffers on the CPU (its fast path), tensors on the device on
    /// a GPU.
    pub fn placement(self) -> Placement {
        match self {
            DeviceChoice::Cpu | DeviceChoice::List => Placement::Host,
            DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_) => Placement::Backend,
        }
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

/// The GPU a rank uses, named so that ranks can tell whether they share one:
/// this host's name and the GPU's number among all of the host's
/// (`CUDA_VISIBLE_DEVICES` maps `ordinal` back when it lists numbers).
pub fn gpu_identity(ordinal: usize, visible_devices: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let listed: Vec<&str> = visible_devices
        .map(|v| v.split(',').map(str::trim).filter(|d| !d.is_empty()).collect())
        .unwrap_or_default();
    match listed.get(ordinal) {
        Some(physical) => format!("{host}/{physical}"),
        None => format!("{host}/{ordinal}"),
    }
}

/// The groups of ranks (more than one each) whose `identity` is the same, in
/// rank order, from every rank's identity.
pub fn sharing_groups(identities: &[u64]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (rank, id) in identities.iter().enumerate() {
        match groups.iter_mut().find(|g| identities[g[0]] == *id) {
            Some(group) => group.push(rank),
            None => groups.push(vec![rank]),
        }
    }
    groups.retain(|g| g.len() > 1);
    groups
}

/// Which ranks of `comm` share a GPU with another (`identity` from
/// [`gpu_identity`]), gathered over the host collective.
pub fn ranks_sharing_gpus(
    comm: &dyn drove_collective::Collective,
    identity: &str,
) -> Result<Vec<Vec<usize>>, crate::TrainError> {
    use drove_collective::Element;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    identity.hash(&mut hasher);
    let mine = [hasher.finish() as i64];
    let gathered = comm.all_gather("gpu.identity", &[1], i64::tensor_ref(&mine))?;
    let drove_collective::Buffer::I64(all) = gathered.data else {
        return Err(crate::TrainError::Options("gpu.identity: gathered other than i64".into()));
    };
    Ok(sharing_groups(&all.iter().map(|&v| v as u64).collect::<Vec<_>>()))
}

/// The GPU number a rank opens for `cuda[:N]`.
///
/// - `cuda:N`: GPU `N` of those this process sees.
/// - `cuda`: when `CUDA_VISIBLE_DEVICES` shows this process exactly one GPU
///   (a scheduler or the user pinned it), that one (`0`); otherwise the GPU of
///   the local rank, so that the ranks `drove run` starts on one host take one
///   GPU each.
pub fn gpu_ordinal(choice: Option<usize>, local_rank: usize, visible_devices: Option<&str>) -> usize {
    if let Some(n) = choice {
        return n;
    }
    let shown = visible_devices.map(|v| v.split(',').filter(|d| !d.trim().is_empty()).count());
    if shown == Some(1) { 0 } else { local_rank }
}

/// The adapter `--device wgpu` (no number) takes for a rank at `local_rank`
/// of `count` adapters: its own, as with CUDA, or, with fewer adapters than
/// ranks on the host, adapter `local_rank % count` (ranks then share one:
/// Vulkan lets processes share a device, CUDA's one-rank-a-GPU does not apply).
pub fn adapter_for_local_rank(local_rank: usize, count: usize) -> usize {
    if count == 0 { 0 } else { local_rank % count }
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
    fn a_gpu_defaults_to_the_backend_placement_and_one_micro_batch() {
        assert_eq!((DeviceChoice::Cpu.placement(), DeviceChoice::Cpu.micro_batches(0)), (Placement::Host, 0));
        let gpu = DeviceChoice::Cuda(Some(1));
        assert_eq!((gpu.placement(), gpu.micro_batches(0), gpu.micro_batches(4)), (Placement::Backend, 1, 4));
        let wgpu = DeviceChoice::Wgpu(None);
        assert_eq!((wgpu.placement(), wgpu.micro_batches(0)), (Placement::Backend, 1));
    }

    #[test]
    fn ranks_take_their_own_adapter_and_share_when_there_are_fewer() {
        assert_eq!(adapter_for_local_rank(2, 4), 2);
        assert_eq!(adapter_for_local_rank(2, 1), 0);
        assert_eq!(adapter_for_local_rank(3, 2), 1);
        assert_eq!(adapter_for_local_rank(0, 0), 0);
    }

    #[test]
    fn gradient_paths_parse_and_ranks_sharing_a_gpu_are_grouped() {
        for s in ["auto", "nccl", "host"] {
            assert_eq!(s.parse::<GradientPath>().unwrap().to_string(), s);
        }
        assert!("gloo".parse::<GradientPath>().unwrap_err().contains("expected auto, nccl or host"));
        assert_eq!(sharing_groups(&[7, 7, 7, 7]), vec![vec![0, 1, 2, 3]]);
        assert_eq!(sharing_groups(&[1, 2, 1, 3, 2]), vec![vec![0, 2], vec![1, 4]]);
        assert!(sharing_groups(&[1, 2, 3]).is_empty());
        let host = gpu_identity(0, None);
        assert_eq!(gpu_identity(1, Some("4,5")), format!("{}5", &host[..host.len() - 1]));
        assert_eq!(gpu_identity(0, Some("")), host, "an empty list maps nothing");
    }

    #[test]
    fn each_local_rank_takes_its_gpu_unless_one_is_pinned() {
        assert_eq!(gpu_ordinal(None, 3, None), 3);
        assert_eq!(gpu_ordinal(None, 3, Some("0,1,2,3")), 3);
        assert_eq!(gpu_ordinal(None, 3, Some("5")), 0, "one visible GPU is GPU 0 of this process");
        assert_eq!(gpu_ordinal(Some(1), 3, Some("5")), 1, "cuda:N is taken as said");
        assert_eq!(gpu_ordinal(None, 2, Some("")), 2, "an empty list pins nothing");
    }
}
