//! A process's host identity: what the mesh's greeting carries, so ranks
//! can tell which of them share a host.

/// The longest host id, in bytes (the greeting's limit).
pub(crate) const MAX_HOST_ID: usize = 256;

/// This process's host identity: `given` if set and not empty, else the kernel's
/// boot id and the network namespace (empty when neither can be read: such a
/// rank shares memory with nobody). Cut to [`MAX_HOST_ID`] bytes here, so
/// that a rank compares its own id exactly as the others receive it.
pub(crate) fn host_id(given: Option<&str>) -> String {
    let id = match given {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            if boot.trim().is_empty() {
                return String::new();
            }
            let net =
                std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
            format!("{}/{net}", boot.trim())
        }
    };
    cut(id, MAX_HOST_ID)
}

/// `id` cut to at most `max` bytes, at a character boundary.
fn cut(mut id: String, max: usize) -> String {
    let mut end = id.len().min(max);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    id.truncate(end);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_host_id_is_cut_at_a_character_boundary() {
        assert_eq!(cut("ab".repeat(200), MAX_HOST_ID).len(), MAX_HOST_ID);
        assert_eq!(cut(format!("{}é", "a".repeat(255)), MAX_HOST_ID), "a".repeat(255));
        assert_eq!(cut("short".into(), MAX_HOST_ID), "short");
    }
}
