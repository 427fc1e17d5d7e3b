//! Which GPU a rank opens, and which ranks share one: the GPU of each local
//! rank (Horovod's "pin each GPU"), the adapter a wgpu rank takes, and the
//! groups of ranks that found the same physical GPU (gathered over the host
//! collective), which NCCL before 2.30 refuses.

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
) -> Result<Vec<Vec<usize>>, crate::DeviceError> {
    use drove_collective::Element;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    identity.hash(&mut hasher);
    let mine = [hasher.finish() as i64];
    let gathered = comm.all_gather("gpu.identity", &[1], i64::tensor_ref(&mine))?;
    let drove_collective::Buffer::I64(all) = gathered.data else {
        return Err(crate::DeviceError::Gpu("gpu.identity: gathered other than i64".into()));
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
    use crate::GradientPath;

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
