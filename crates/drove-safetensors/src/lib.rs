//! # drove-safetensors: a safetensors header checked before the crate reads it
//!
//! drove reads safetensors files it did not write (HuggingFace weights) and
//! files a crash may have cut short (its own checkpoints). The `safetensors`
//! crate validates a header too, but with unchecked arithmetic: offsets that
//! add up to near `usize::MAX` make its final sum overflow, which panics in a
//! debug build, and its errors do not say which tensor is at fault.
//! [`check_header`] runs first, with checked arithmetic throughout, and names
//! the tensor (or the header) in its error; after it passes,
//! `SafeTensors::deserialize` cannot overflow.
//!
//! One job, shared by `drove-bert` (weights) and `drove-train` (checkpoints),
//! so that neither depends on the other for it; and [`convert_floats`], the
//! f16/f32 rewrite behind `drove weights`, which the check guards too.
//!
//! ```
//! let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut file = (header.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(header);
//! file.extend_from_slice(&[0u8; 8]);
//! assert!(drove_safetensors::check_header(&file).is_ok());
//! file.truncate(file.len() - 4);
//! let e = drove_safetensors::check_header(&file).unwrap_err();
//! assert!(e.starts_with("tensor w:"), "{e}");
//! ```
#![deny(missing_docs)]

mod convert;

pub use convert::{ConvertError, FloatType, convert_floats};

/// Checks the layout the header of a safetensors file (`bytes`, the whole file)
/// declares, as `SafeTensors::deserialize` does, but naming the tensor at fault
/// (or `header`) in the error, and with checked arithmetic throughout: offsets
/// that add up to near `usize::MAX` make the crate's own final sum overflow,
/// which panics in debug builds. Call it before `SafeTensors::deserialize`.
pub fn check_header(bytes: &[u8]) -> Result<(), String> {
    let Some((length, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(format!(
            "header: the file is {} bytes, shorter than the 8-byte header length",
            bytes.len()
        ));
    };
    let length = u64::from_le_bytes(*length);
    if length > rest.len() as u64 {
        return Err(format!("header: its length field says {length} bytes, but only {} follow", rest.len()));
    }
    let (header, data) = rest.split_at(length as usize);
    let header = std::str::from_utf8(header).map_err(|e| format!("header: not UTF-8 ({e})"))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(header).map_err(|e| format!("header: not a JSON object of tensors ({e})"))?;
    let mut spans = Vec::with_capacity(header.len());
    for (name, entry) in &header {
        if name == "__metadata__" {
            continue;
        }
        let info: safetensors::tensor::TensorInfo =
            serde_json::from_value(entry.clone()).map_err(|e| format!("tensor {name}: {e}"))?;
        let (dtype, shape, (start, end)) = (info.dtype, &info.shape, info.data_offsets);
        let bits = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bitsize()))
            .ok_or_else(|| format!("tensor {name}: {dtype:?} of shape {shape:?} is too large to address"))?;
        if bits % 8 != 0 {
            return Err(format!("tensor {name}: {dtype:?} of shape {shape:?} does not fill whole bytes"));
        }
        if end < start {
            return Err(format!("tensor {name}: data_offsets [{start}, {end}] end before they start"));
        }
        if end - start != bits / 8 {
            return Err(format!(
                "tensor {name}: {dtype:?} of shape {shape:?} needs {} bytes, but data_offsets [{start}, {end}] hold {}",
                bits / 8,
                end - start
            ));
        }
        if end > data.len() {
            return Err(format!(
                "tensor {name}: data_offsets [{start}, {end}] reach past the {} bytes after the header",
                data.len()
            ));
        }
        spans.push((start, end, name));
    }
    spans.sort();
    let mut covered = 0;
    for (start, end, name) in spans {
        if start != covered {
            let what = if start < covered {
                "overlap the tensor before"
            } else {
                "leave a gap after the tensor before"
            };
            return Err(format!(
                "tensor {name}: data_offsets [{start}, {end}] {what} (which ends at {covered})"
            ));
        }
        covered = end;
    }
    if covered != data.len() {
        return Err(format!(
            "header: the tensors cover {covered} bytes, but {} bytes follow the header",
            data.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_header;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data));
        out
    }

    #[test]
    fn a_well_formed_file_passes_and_each_fault_is_named() {
        let two = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}}"#;
        assert_eq!(check_header(&file(two, 12)), Ok(()));
        assert!(check_header(&[1, 2, 3]).unwrap_err().starts_with("header: the file is 3 bytes"));
        assert!(check_header(&file(two, 10)).unwrap_err().starts_with("tensor b:"));
        assert!(check_header(&file(two, 14)).unwrap_err().contains("cover 12 bytes"));
        let huge = format!(
            r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":[{},{}]}}}}"#,
            u64::MAX - 3,
            u64::MAX
        );
        assert!(
            check_header(&file(&huge, 8)).is_err(),
            "offsets near the top of the range are an error, not an overflow"
        );
        let gap = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(check_header(&file(gap, 8)).unwrap_err().contains("leave a gap"));
    }
}
