//! Builds a BERT token classifier on the CPU (Flex) backend and runs one batch.
//! With a HuggingFace model folder (config.json + model.safetensors, e.g. the
//! fetched `assets/minilm`), loads its weights and prints the load report.
//!
//! `cargo run --release -p drove-bert --example forward [-- assets/minilm]`
use burn::backend::Flex;
use burn::tensor::{Int, Tensor};
use drove_bert::{BertConfig, load_safetensors};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Default::default();
    let (config, dir) = match std::env::args().nth(1) {
        Some(dir) => (BertConfig::from_file(format!("{dir}/config.json"))?, Some(dir)),
        None => (BertConfig::tiny(30_522), None),
    };
    let mut model = config.init_token_classification::<Flex>(9, &device);
    if let Some(dir) = dir {
        let report = load_safetensors(&mut model, format!("{dir}/model.safetensors"), &device)?;
        println!(
            "loaded {} tensors; missing {:?}; unused {:?}",
            report.loaded, report.missing, report.unexpected
        );
    }
    // "[CLS] eu rejects german call [SEP]" in the uncased BERT vocabulary.
    let ids = Tensor::<Flex, 2, Int>::from_ints([[101, 7327, 19164, 2446, 2655, 102]], &device);
    let logits = model.forward(ids.clone(), ids.zeros_like(), Tensor::ones([1, 6], &device));
    println!("logits {:?}: {:?}", logits.dims(), logits.argmax(2).into_data());
    Ok(())
}
