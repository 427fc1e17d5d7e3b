//! WordPiece tokenization and label alignment, on a vocabulary written here.
use std::io::Write;

use drove_collate::{IGNORE_LABEL, LabelSet, Sentence, TokenizeError, WordPieceTokenizer};

const VOCAB: &[&str] = &[
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "rejects", "german", "un", "##bel", "##iev",
    "##able", "call", "##s", ".", "paris",
];

fn vocab(tokens: &[&str]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for t in tokens {
        writeln!(f, "{t}").unwrap();
    }
    f
}

fn sentence(words: &[&str], tags: &[&str]) -> Sentence {
    Sentence {
        words: words.iter().map(|w| w.to_string()).collect(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        line: 10,
    }
}

#[test]
fn first_subword_keeps_the_label_the_rest_are_ignored() {
    let v = vocab(VOCAB);
    let tok = WordPieceTokenizer::from_vocab(v.path(), true, 128).unwrap();
    let sp = tok.special();
    assert_eq!((sp.pad, sp.unk, sp.cls, sp.sep, sp.mask, sp.vocab_size), (0, 1, 2, 3, 4, 16));
    let labels = LabelSet::conll2003();
    let s = sentence(
        &["EU", "rejects", "Unbelievable", "calls", "Xyz", "."],
        &["B-ORG", "O", "B-MISC", "O", "B-PER", "O"],
    );
    let e = tok.encode(&s, &labels).unwrap();
    //          [CLS] eu rejects un ##bel ##iev ##able call ##s [UNK] . [SEP]
    assert_eq!(e.input_ids, [2, 5, 6, 8, 9, 10, 11, 12, 13, 1, 14, 3]);
    let (o, b_org, b_misc, b_per) = (0, 3, 7, 1);
    let x = IGNORE_LABEL;
    assert_eq!(e.labels, [x, b_org, o, b_misc, x, x, x, o, x, b_per, o, x]);
    assert_eq!(e.special, [true, false, false, false, false, false, false, false, false, false, false, true]);
    assert_eq!(e.word_ids[0], None);
    assert_eq!(e.word_ids[3..7], [Some(2); 4]);
    assert_eq!(e.word_ids[11], None);
}

#[test]
fn long_sentences_are_truncated_with_specials_kept() {
    let v = vocab(VOCAB);
    let tok = WordPieceTokenizer::from_vocab(v.path(), true, 6).unwrap();
    let s = sentence(&["eu", "rejects", "unbelievable", "paris"], &["B-ORG", "O", "O", "B-LOC"]);
    let e = tok.encode(&s, &LabelSet::conll2003()).unwrap();
    assert_eq!(e.input_ids, [2, 5, 6, 8, 9, 3]);
    assert_eq!(e.labels.len(), 6);
    assert_eq!(e.labels[5], IGNORE_LABEL);
}

#[test]
fn bad_vocabularies_and_labels_are_named() {
    let err = WordPieceTokenizer::from_vocab("/nonexistent/vocab.txt", true, 128).err().unwrap();
    assert!(err.to_string().contains("/nonexistent/vocab.txt"), "{err}");
    let v = vocab(&["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"]);
    let err = WordPieceTokenizer::from_vocab(v.path(), true, 128).err().unwrap();
    assert!(matches!(err, TokenizeError::MissingToken { token: "[MASK]", .. }), "{err}");

    let v = vocab(VOCAB);
    let tok = WordPieceTokenizer::from_vocab(v.path(), true, 128).unwrap();
    let err = tok.encode(&sentence(&["eu", "paris"], &["O", "B-FOOD"]), &LabelSet::conll2003()).unwrap_err();
    assert!(matches!(err, TokenizeError::UnknownLabel { line: 11, .. }), "{err}");
    assert!(err.to_string().contains("B-FOOD"));
}
