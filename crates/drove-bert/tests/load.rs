//! Weight loading on tiny safetensors files written here.
mod common;

use std::collections::BTreeMap;

use burn::backend::Flex;
use drove_bert::{BertConfig, BertError, load_safetensors};
use safetensors::tensor::TensorView;

/// A HuggingFace-layout checkpoint of `config`'s shapes, every value `fill`.
fn checkpoint(
    config: &BertConfig,
    prefix: &str,
    fill: f32,
    labels: Option<usize>,
) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    common::hf_tensors(config, prefix, labels)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let bytes = (0..n).flat_map(|_| fill.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect()
}

fn write(tensors: &[(String, Vec<usize>, Vec<u8>)]) -> tempfile::NamedTempFile {
    let views: BTreeMap<String, TensorView<'_>> = tensors
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    f
}

#[test]
fn loads_with_or_without_the_bert_prefix_and_reports_what_it_skipped() {
    let config = BertConfig::tiny(50);
    let device = Default::default();
    for (prefix, labels) in [("", None), ("bert.", Some(9))] {
        let file = write(&checkpoint(&config, prefix, 0.5, labels));
        let mut model = config.init_token_classification::<Flex>(9, &device);
        let report = load_safetensors(&mut model, file.path(), &device).unwrap();
        let expected_loaded = 5 + config.num_hidden_layers * 16 + if labels.is_some() { 2 } else { 0 };
        assert_eq!(report.loaded, expected_loaded, "{prefix:?}");
        if labels.is_some() {
            assert!(report.missing.is_empty(), "{report:?}");
        } else {
            assert_eq!(report.missing, ["classifier.weight", "classifier.bias"]);
        }
        assert_eq!(report.unexpected, [format!("{prefix}pooler.dense.weight")]);
        let w: Vec<f32> = model.bert.layers[1].intermediate.weight.val().into_data().to_vec().unwrap();
        assert!(w.iter().all(|&x| x == 0.5));
        assert_eq!(
            model.bert.layers[1].intermediate.weight.dims(),
            [config.hidden_size, config.intermediate_size]
        );
    }
}

#[test]
fn a_shape_that_disagrees_with_the_config_names_the_tensor_and_both_shapes() {
    let device = Default::default();
    let written = BertConfig { intermediate_size: 48, ..BertConfig::tiny(50) };
    let file = write(&checkpoint(&written, "", 0.1, None));
    let mut model = BertConfig::tiny(50).init_token_classification::<Flex>(3, &device);
    let err = load_safetensors(&mut model, file.path(), &device).unwrap_err();
    assert!(matches!(err, BertError::Shape { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("encoder.layer.0.intermediate.dense.weight"), "{msg}");
    assert!(msg.contains("[48, 32]") && msg.contains("[64, 32]"), "{msg}");
}

#[test]
fn unreadable_files_and_bad_configs_are_named() {
    let device = Default::default();
    let mut model = BertConfig::tiny(10).init_token_classification::<Flex>(3, &device);
    let err =
        load_safetensors(&mut model, "/nonexistent/model.safetensors", &device).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/model.safetensors") && err.contains("cannot read"), "{err}");
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"not safetensors").unwrap();
    let err = load_safetensors(&mut model, junk.path(), &device).unwrap_err().to_string();
    assert!(err.contains("not a safetensors file"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"vocab_size":10,"hidden_size":30,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":8,"max_position_embeddings":16}"#).unwrap();
    let err = BertConfig::from_file(&cfg).unwrap_err().to_string();
    assert!(err.contains("config.json") && err.contains("not a multiple of num_attention_heads 4"), "{err}");
    std::fs::write(&cfg, r#"{"vocab_size":10}"#).unwrap();
    let err = BertConfig::from_file(&cfg).unwrap_err().to_string();
    assert!(err.contains("missing field `hidden_size`"), "{err}");
    let err = BertConfig::from_file(dir.path().join("absent.json")).unwrap_err().to_string();
    assert!(err.contains("absent.json: cannot read"), "{err}");
}

#[test]
fn loaded_weights_stay_trainable() {
    // A tensor made from data does not track gradients: loading must keep every
    // parameter trainable, or fine-tuning silently trains the classifier alone.
    use burn::backend::Autodiff;
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    struct Frozen(Vec<usize>, usize);
    impl ModuleVisitor<Autodiff<Flex>> for Frozen {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Autodiff<Flex>, D>>) {
            if !p.val().is_require_grad() {
                self.0.push(self.1);
            }
            self.1 += 1;
        }
    }
    let config = BertConfig::tiny(50);
    let device = Default::default();
    let file = write(&checkpoint(&config, "bert.", 0.5, None));
    let mut model = config.init_token_classification::<Autodiff<Flex>>(9, &device);
    load_safetensors(&mut model, file.path(), &device).unwrap();
    let mut frozen = Frozen(Vec::new(), 0);
    model.visit(&mut frozen);
    assert!(frozen.1 > 10);
    assert!(frozen.0.is_empty(), "parameters {:?} of {} no longer require gradients", frozen.0, frozen.1);
}
