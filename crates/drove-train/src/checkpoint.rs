//! Checkpoints: parameters and optimiser moments as safetensors, the loop's
//! position as JSON, written by one rank into a temporary folder that is renamed
//! into place, then published by atomically replacing a `latest` pointer.
//!
//! ```text
//! OUT/checkpoints/step-00000120/{model.safetensors, optimizer.safetensors, state.json, *.conll}
//! OUT/checkpoints/latest            "step-00000120"
//! ```
//!
//! A crash at any moment leaves `latest` naming a complete checkpoint (or no
//! `latest` at all); a half-written folder keeps its `.tmp` name and is ignored.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};

use crate::flat::{FlatAdamW, FlatParams};

pub use crate::error::CheckpointError;

fn io(path: &Path, what: &str, e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Io { path: path.to_path_buf(), message: format!("{what}: {e}") }
}

/// Where the NER loop stands, saved beside the weights. Reading it from JSON
/// names the field at fault in every error.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoopState {
    /// Epoch of the next batch.
    pub epoch: usize,
    /// Next batch within that epoch.
    pub batch: usize,
    /// Samples of the epoch's order applied so far: an elastic run's
    /// progress, which holds at any world size (absent in older states: 0).
    #[serde(default)]
    pub position: usize,
    /// Optimiser steps taken.
    pub global_step: u64,
    /// Ranks of the run that wrote it.
    pub world_size: usize,
    /// Rows per batch per rank.
    pub batch_size: usize,
    /// Base seed.
    pub seed: u64,
    /// Training sentences used.
    pub train_sentences: usize,
    /// Evaluation results so far, in order.
    pub history: Vec<serde_json::Value>,
}

impl LoopState {
    /// Reads a loop state from `state.json`'s JSON; the error names the field
    /// at fault (serde's own type errors name none).
    pub fn from_json(json: serde_json::Value) -> Result<LoopState, String> {
        serde_path_to_error::deserialize(json).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.into_inner().to_string()
            } else {
                format!("field `{path}`: {}", e.into_inner())
            }
        })
    }
}

/// The checkpoint folder of a step.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

fn write_tensors(path: &Path, tensors: Vec<(String, Vec<usize>, &[f32])>) -> Result<(), CheckpointError> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let view = TensorView::new(Dtype::F32, shape, bytemuck::cast_slice(values))
                .map_err(|e| io(path, &format!("tensor {name}"), e))?;
            Ok((name, view))
        })
        .collect::<Result<_, CheckpointError>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| io(path, "writing", e))
}

/// Tensors by name: shape and values.
type Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

fn read_tensors(path: &Path) -> Result<Tensors, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| io(path, "cannot read", e))?;
    // Before the crate reads it: names the tensor at fault, and offsets that add up
    // to near `usize::MAX` are an error here rather than an overflow there.
    drove_safetensors::check_header(&bytes).map_err(|message| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        message: format!("not a safetensors file ({message})"),
    })?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        message: format!("not a safetensors file ({e})"),
    })?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(CheckpointError::Corrupt {
                path: path.to_path_buf(),
                message: format!("tensor {name} is {:?}, expected F32", view.dtype()),
            });
        }
        let values: Vec<f32> =
            view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

fn fsync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Writes a checkpoint of step `optim.step` under `root`: everything goes
/// into `step-N.tmp`, which is renamed to `step-N`; then `latest` is replaced.
/// `extra` files (predictions) are written into the same folder. Older
/// checkpoints beyond the newest `keep` are removed.
pub fn save<S: serde::Serialize + ?Sized>(
    root: &Path,
    params: &FlatParams,
    optim: &FlatAdamW,
    state: &S,
    extra: &[(String, Vec<u8>)],
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(root).map_err(|e| io(root, "cannot create", e))?;
    let dir = step_dir(root, optim.step);
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, "cannot create", e))?;
    let model: Vec<_> = params
        .names
        .iter()
        .zip(&params.shapes)
        .zip(&params.values)
        .map(|((n, s), v)| (n.clone(), s.clone(), v.as_slice()))
        .collect();
    write_tensors(&tmp.join("model.safetensors"), model)?;
    let mut moments = Vec::with_capacity(2 * params.names.len());
    for (i, (n, s)) in params.names.iter().zip(&params.shapes).enumerate() {
        moments.push((format!("m.{n}"), s.clone(), optim.m[i].as_slice()));
        moments.push((format!("v.{n}"), s.clone(), optim.v[i].as_slice()));
    }
    write_tensors(&tmp.join("optimizer.safetensors"), moments)?;
    let mut json = serde_json::to_value(state).map_err(|e| io(&tmp, "serialising the state", e))?;
    if !json.is_object() {
        json = serde_json::json!({ "state": json });
    }
    json["optimizer_step"] = optim.step.into();
    let text = serde_json::to_vec_pretty(&json).expect("state serialises");
    std::fs::write(tmp.join("state.json"), text).map_err(|e| io(&tmp, "writing state.json", e))?;
    for (name, bytes) in extra {
        std::fs::write(tmp.join(name), bytes).map_err(|e| io(&tmp, &format!("writing {name}"), e))?;
    }
    for f in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        if let Ok(file) = std::fs::File::open(tmp.join(f)) {
            let _ = file.sync_all();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| io(&dir, "cannot rename into place", e))?;
    let name = dir.file_name().expect("a step folder has a name").to_string_lossy().into_owned();
    let pointer = root.join("latest");
    let pointer_tmp = root.join("latest.tmp");
    {
        let mut f = std::fs::File::create(&pointer_tmp).map_err(|e| io(&pointer_tmp, "cannot create", e))?;
        f.write_all(name.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| io(&pointer_tmp, "writing", e))?;
    }
    std::fs::rename(&pointer_tmp, &pointer).map_err(|e| io(&pointer, "cannot replace", e))?;
    fsync_dir(root);
    prune(root, keep.max(1), &name);
    Ok(dir)
}

fn prune(root: &Path, keep: usize, newest: &str) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    let mut steps: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-") && !n.ends_with(".tmp"))
        .collect();
    steps.sort();
    let old = steps.len().saturating_sub(keep);
    for name in &steps[..old] {
        if name != newest {
            let _ = std::fs::remove_dir_all(root.join(name));
        }
    }
}

/// The folder `latest` names, if there is one.
pub fn latest(root: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let pointer = root.join("latest");
    match std::fs::read_to_string(&pointer) {
        Ok(name) => {
            let name = name.trim();
            if !name.starts_with("step-") || name.contains('/') {
                return Err(CheckpointError::Corrupt {
                    path: pointer,
                    message: format!("names {name:?}, not a step folder"),
                });
            }
            Ok(Some(root.join(name)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&pointer, "cannot read", e)),
    }
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Loaded {
    /// The folder.
    pub dir: PathBuf,
    /// The caller's state saved with it (`state.json`, with the optimizer's
    /// step as `optimizer_step`).
    pub state: serde_json::Value,
}

/// Loads the checkpoint in `dir` into `params` and `optim` (which must already
/// have the model's names and shapes): every tensor must be there with its shape.
pub fn load(dir: &Path, params: &mut FlatParams, optim: &mut FlatAdamW) -> Result<Loaded, CheckpointError> {
    let state_path = dir.join("state.json");
    let text = std::fs::read(&state_path).map_err(|e| io(&state_path, "cannot read", e))?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| CheckpointError::Corrupt {
        path: state_path.clone(),
        message: format!("not JSON ({e})"),
    })?;
    if !json.is_object() {
        return Err(CheckpointError::Corrupt {
            path: state_path,
            message: "not a JSON object of the loop's state and optimizer_step".into(),
        });
    }
    let model_path = dir.join("model.safetensors");
    let mut model = read_tensors(&model_path)?;
    let optim_path = dir.join("optimizer.safetensors");
    let mut moments = read_tensors(&optim_path)?;
    let take =
        |map: &mut Tensors, path: &Path, name: &str, shape: &[usize]| -> Result<Vec<f32>, CheckpointError> {
            let (found, values) = map.remove(name).ok_or_else(|| CheckpointError::Corrupt {
                path: path.to_path_buf(),
                message: format!("tensor {name} is missing"),
            })?;
            if found != shape {
                return Err(CheckpointError::Mismatch {
                    path: path.to_path_buf(),
                    message: format!("tensor {name} has shape {found:?}, the model needs {shape:?}"),
                });
            }
            Ok(values)
        };
    for (i, (name, shape)) in params.names.iter().zip(&params.shapes).enumerate() {
        params.values[i] = take(&mut model, &model_path, name, shape)?;
        optim.m[i] = take(&mut moments, &optim_path, &format!("m.{name}"), shape)?;
        optim.v[i] = take(&mut moments, &optim_path, &format!("v.{name}"), shape)?;
    }
    optim.step = json["optimizer_step"].as_u64().ok_or_else(|| CheckpointError::Corrupt {
        path: state_path,
        message: match json.get("optimizer_step") {
            None => "optimizer_step is missing".into(),
            Some(v) => format!("optimizer_step must be a whole number >= 0, found {v}"),
        },
    })?;
    Ok(Loaded { dir: dir.to_path_buf(), state: json })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::AdamWSettings;

    fn params() -> FlatParams {
        FlatParams {
            names: vec!["a.weight".into(), "a.bias".into()],
            shapes: vec![vec![2, 2], vec![2]],
            values: vec![vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0]],
        }
    }

    fn state(step: u64) -> LoopState {
        LoopState {
            position: 0,
            epoch: 1,
            batch: 3,
            global_step: step,
            world_size: 2,
            batch_size: 8,
            seed: 42,
            train_sentences: 100,
            history: vec![],
        }
    }

    #[test]
    fn round_trip_and_latest_pointer() {
        let dir = tempfile::tempdir().unwrap();
        let p = params();
        let mut o = FlatAdamW::new(AdamWSettings::default(), &p);
        o.m[0][1] = 0.5;
        o.v[1][0] = 0.25;
        for step in [10, 20, 30] {
            // Folders are named by the optimizer's step.
            o.step = step;
            let extra = if step == 10 { vec![("x.conll".to_string(), b"w O O\n".to_vec())] } else { vec![] };
            save(dir.path(), &p, &o, &state(step), &extra, 2).unwrap();
        }
        let newest = latest(dir.path()).unwrap().unwrap();
        assert_eq!(newest, step_dir(dir.path(), 30));
        assert!(!step_dir(dir.path(), 10).exists(), "only the newest two are kept");
        assert!(step_dir(dir.path(), 20).exists());
        let mut q = FlatParams { values: vec![vec![0.0; 4], vec![0.0; 2]], ..params() };
        let mut o2 = FlatAdamW::new(AdamWSettings::default(), &q);
        let loaded = load(&newest, &mut q, &mut o2).unwrap();
        assert_eq!(q, p);
        assert_eq!(o2, o);
        assert_eq!(loaded.state["optimizer_step"], 30);
        assert_eq!(serde_json::from_value::<LoopState>(loaded.state).unwrap(), state(30));
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = params();
        let o = FlatAdamW::new(AdamWSettings::default(), &p);
        let saved = save(dir.path(), &p, &o, &state(1), &[], 1).unwrap();
        std::fs::write(saved.join("model.safetensors"), b"garbage").unwrap();
        let mut q = params();
        let mut o2 = o.clone();
        let err = load(&saved, &mut q, &mut o2).unwrap_err().to_string();
        assert!(err.contains("model.safetensors") && err.contains("unreadable"), "{err}");
    }

    #[test]
    fn a_shape_from_another_model_is_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let p = params();
        let o = FlatAdamW::new(AdamWSettings::default(), &p);
        let saved = save(dir.path(), &p, &o, &state(1), &[], 1).unwrap();
        let mut q = FlatParams { shapes: vec![vec![4], vec![2]], ..params() };
        let mut o2 = o.clone();
        let err = load(&saved, &mut q, &mut o2).unwrap_err().to_string();
        assert!(err.contains("a.weight") && err.contains("[2, 2]") && err.contains("[4]"), "{err}");
    }
}
