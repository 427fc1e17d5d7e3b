//! The NER fine-tune end to end on files it writes itself: a small CoNLL
//! training and evaluation set, a WordPiece vocabulary and a tiny BERT
//! `config.json` (random weights), trained for a few epochs in a world of one
//! (`SingleProcess`). Under a launcher, pass `drove_launch::connect_from_env()?`
//! instead: each rank then trains on its shard and the F1 is reduced as counts.
//!
//! ```text
//! cargo run --release -p drove-ner --example tiny
//! ```
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use drove_bert::BertConfig;
use drove_collective::SingleProcess;
use drove_ner::{NerOptions, Quiet, train_ner};

const WORDS: [&str; 8] = ["john", "lives", "in", "paris", "mary", "visits", "london", "today"];

fn write_files(data: &Path, model: &Path) -> std::io::Result<()> {
    let sentence = |a: &str, verb: &str, b: &str| {
        format!("{a} NNP B-NP B-PER\n{verb} VBZ B-VP O\nin IN B-PP O\n{b} NNP B-NP B-LOC\n\n")
    };
    let mut train = String::from("-DOCSTART- -X- -X- O\n\n");
    for i in 0..24 {
        let (a, b) = if i % 2 == 0 { ("john", "paris") } else { ("mary", "london") };
        train += &sentence(a, if i % 3 == 0 { "visits" } else { "lives" }, b);
    }
    std::fs::write(data.join("train.txt"), &train)?;
    std::fs::write(
        data.join("valid.txt"),
        sentence("mary", "lives", "paris") + &sentence("john", "visits", "london"),
    )?;
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let vocab: Vec<&str> = specials.iter().chain(WORDS.iter()).copied().collect();
    std::fs::write(model.join("vocab.txt"), vocab.join("\n") + "\n")?;
    let config = serde_json::to_string(&BertConfig::tiny(vocab.len())).map_err(std::io::Error::other)?;
    std::fs::write(model.join("config.json"), config)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("drove-ner-tiny-{}", std::process::id()));
    let (data, model, out) = (dir.join("data"), dir.join("model"), dir.join("out"));
    for d in [&data, &model] {
        std::fs::create_dir_all(d)?;
    }
    write_files(&data, &model)?;
    let opts = NerOptions {
        data,
        model,
        out,
        epochs: 4,
        batch_size: 8,
        lr: 3e-3,
        eval_sets: vec!["valid".into()],
        random_init: true,
        ..NerOptions::default()
    };
    let summary = train_ner::<Autodiff<Flex>>(&opts, &SingleProcess, &mut Quiet, &Default::default())?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
