//! [`convert_floats`]: a safetensors file's float tensors rewritten as one
//! float type (f16 to carry weights in half the bytes, f32 to train from),
//! every other tensor copied as it is.

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::check_header;

/// The float type every float tensor is written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatType {
    /// IEEE half precision.
    F16,
    /// 32-bit float.
    F32,
}

impl std::str::FromStr for FloatType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(FloatType::F16),
            "f32" => Ok(FloatType::F32),
            other => Err(format!("the float type is f16 or f32, found {other:?}")),
        }
    }
}

/// Why a file could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The file is not a well-formed safetensors file.
    #[error("not a safetensors file: {0}")]
    Malformed(String),
    /// The converted tensors could not be written.
    #[error("writing the converted tensors: {0}")]
    Write(String),
}

/// `bytes` (a whole safetensors file) with its f32 and f16 tensors as `to`,
/// in name order, and how many tensors it holds.
pub fn convert_floats(bytes: &[u8], to: FloatType) -> Result<(Vec<u8>, usize), ConvertError> {
    check_header(bytes).map_err(ConvertError::Malformed)?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| ConvertError::Malformed(e.to_string()))?;
    let to = match to {
        FloatType::F16 => Dtype::F16,
        FloatType::F32 => Dtype::F32,
    };
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let converted: Vec<u8> = match (view.dtype(), to) {
                (Dtype::F32, Dtype::F16) => data
                    .chunks_exact(4)
                    .flat_map(|c| {
                        half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
                    })
                    .collect(),
                (Dtype::F16, Dtype::F32) => data
                    .chunks_exact(2)
                    .flat_map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                    .collect(),
                // Already the type asked for, or not a float (ids, masks): as it is.
                _ => data.to_vec(),
            };
            let dtype = if matches!(view.dtype(), Dtype::F32 | Dtype::F16) { to } else { view.dtype() };
            (name, dtype, view.shape().to_vec(), converted)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let views: Vec<(String, TensorView<'_>)> = out
        .iter()
        .map(|(n, d, s, b)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<_, _>>()
        .map_err(|e| ConvertError::Write(e.to_string()))?;
    let written = safetensors::serialize(views, None).map_err(|e| ConvertError::Write(e.to_string()))?;
    Ok((written, out.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_go_to_f16_and_back_and_ids_stay() {
        let w: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let ids: Vec<u8> = [7i64].iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            ("w".to_string(), TensorView::new(Dtype::F32, vec![2], &w).unwrap()),
            ("ids".to_string(), TensorView::new(Dtype::I64, vec![1], &ids).unwrap()),
        ];
        let file = safetensors::serialize(views, None).unwrap();
        let (half, n) = convert_floats(&file, FloatType::F16).unwrap();
        assert_eq!(n, 2);
        let st = SafeTensors::deserialize(&half).unwrap();
        assert_eq!(st.tensor("w").unwrap().dtype(), Dtype::F16);
        assert_eq!(st.tensor("ids").unwrap().data(), &ids[..]);
        let (back, _) = convert_floats(&half, FloatType::F32).unwrap();
        assert_eq!(SafeTensors::deserialize(&back).unwrap().tensor("w").unwrap().data(), &w[..]);
        assert!(matches!(convert_floats(b"nonsense", FloatType::F16), Err(ConvertError::Malformed(_))));
    }
}
