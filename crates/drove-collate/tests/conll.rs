//! The CoNLL reader on small fixtures written here.
use std::io::Write;

use drove_collate::{ConllError, LabelSet, TagScheme, read_conll};

fn write(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

const IOB1: &str = "-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
to TO I-VP O
boycott VB I-VP O
British JJ I-NP I-MISC
lamb NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
Paris NNP I-NP I-LOC
Berlin NNP I-NP B-LOC
";

#[test]
fn iob1_is_detected_and_converted_to_iob2() {
    let f = write(IOB1);
    let corpus = read_conll(f.path()).unwrap();
    assert_eq!(corpus.scheme, TagScheme::Iob1);
    assert_eq!(corpus.columns, 4);
    assert_eq!(corpus.sentences.len(), 2);
    assert_eq!(corpus.tokens(), 13);
    let s0 = &corpus.sentences[0];
    assert_eq!(s0.line, 3);
    assert_eq!(s0.words[0], "EU");
    assert_eq!(s0.tags, ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]);
    // I-PER I-PER is one chunk; I-LOC then B-LOC are two adjacent chunks.
    assert_eq!(corpus.sentences[1].tags, ["B-PER", "I-PER", "B-LOC", "B-LOC"]);
    assert_eq!(corpus.sentences[1].line, 13);
}

#[test]
fn iob2_is_left_alone_and_tabs_work() {
    let f = write("John\tB-PER\nSmith\tI-PER\nran\tO\n\n\nParis\tB-LOC\n");
    let corpus = read_conll(f.path()).unwrap();
    assert_eq!(corpus.scheme, TagScheme::Iob2);
    assert_eq!(corpus.columns, 2);
    assert_eq!(corpus.sentences.len(), 2);
    assert_eq!(corpus.sentences[0].tags, ["B-PER", "I-PER", "O"]);
    assert_eq!(LabelSet::from_corpus(&corpus).tags(), ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]);
}

fn error_of(text: &str) -> (ConllError, String) {
    let f = write(text);
    let err = read_conll(f.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&f.path().display().to_string()), "error must name the file: {msg}");
    (err, msg)
}

#[test]
fn a_missing_column_names_the_line_and_what_was_expected() {
    let (err, msg) = error_of("EU NNP B-NP B-ORG\nrejects VBZ O\n");
    assert!(matches!(err, ConllError::Malformed { line: 2, .. }), "{err:?}");
    assert!(msg.contains(":2:") && msg.contains("expected 4 columns") && msg.contains("found 3"), "{msg}");
}

#[test]
fn a_one_column_line_is_malformed() {
    let (err, msg) = error_of("\n\nlonely\n");
    assert!(matches!(err, ConllError::Malformed { line: 3, .. }), "{err:?}");
    assert!(msg.contains("at least 2"), "{msg}");
}

#[test]
fn an_empty_file_is_an_error() {
    let (err, msg) = error_of("");
    assert!(matches!(err, ConllError::Empty { .. }));
    assert!(msg.contains("no sentences"), "{msg}");
    let (err, _) = error_of("-DOCSTART- -X- -X- O\n\n\n");
    assert!(matches!(err, ConllError::Empty { .. }));
}

#[test]
fn unknown_tags_name_the_line() {
    for (text, line, needle) in [
        ("a B-PER\nb X-PER\n", 2, "prefix \"X\""),
        ("a B-\n", 1, "must be non-empty"),
        ("a O\nb S-LOC\n", 2, "IOB1 and IOB2"),
        ("a PER\n", 1, "expected O, B-TYPE or I-TYPE"),
    ] {
        let (err, msg) = error_of(text);
        assert!(matches!(err, ConllError::UnknownTag { line: l, .. } if l == line), "{text:?}: {err:?}");
        assert!(msg.contains(needle), "{text:?}: {msg}");
    }
}

#[test]
fn a_tag_outside_the_label_set_names_the_line() {
    let f = write("a B-PER\n\nb O\nc B-FOOD\n");
    let corpus = read_conll(f.path()).unwrap();
    let err = LabelSet::conll2003().check(&corpus).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConllError::UnknownTag { line: 4, .. }), "{err:?}");
    assert!(msg.contains("B-FOOD") && msg.contains("9 labels"), "{msg}");
}

#[test]
fn a_missing_file_names_the_path() {
    let err = read_conll("/nonexistent/drove/train.txt").unwrap_err();
    assert!(err.to_string().starts_with("/nonexistent/drove/train.txt: cannot read"), "{err}");
}
