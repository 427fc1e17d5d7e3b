//! Random inputs for the CoNLL reader: 10,000 seeded mutations of a small valid
//! file written here (bits flipped, bytes set, inserted or cut, lines inserted,
//! duplicated, deleted or swapped, columns deleted, duplicated or replaced, tags
//! replaced by odd ones, Unicode spaces and bytes that are not UTF-8) are parsed
//! with `parse_conll` and checked against the CoNLL-2003 label set.
//!
//! Asserted for every input: no panic; a corpus that is read holds only IOB2 tags
//! and lines that exist; an error starts with the file, and one about a line names
//! it as `FILE:LINE:`, that line exists and is the one at fault (not UTF-8, or it
//! holds the tag or the columns the error quotes); "no sentences" only for a file
//! that holds none.

use drove_collate::conll::parse_conll;
use drove_collate::{ConllError, LabelSet, TagScheme};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Random inputs per target.
const CASES: u32 = 10_000;
/// Fixed, so that every run feeds the same inputs.
const SEED: [u8; 32] = *b"drove conll random inputs seed 1";
const PATH: &str = "data/mutated.conll";

/// A small valid file: documents, IOB1 chunks, a trailing line without newline.
const VALID: &str = "-DOCSTART- -X- -X- O\n\
\n\
EU NNP I-NP I-ORG\n\
rejects VBZ I-VP O\n\
German JJ I-NP I-MISC\n\
lamb NN I-NP O\n\
\n\
Peter NNP I-NP I-PER\n\
Blackburn NNP I-NP I-PER\n\
Berlin NNP I-NP B-LOC\n\
\n\
-DOCSTART- -X- -X- O\n\
\n\
Paris NNP I-NP I-LOC";

/// One edit of the file's bytes or lines; positions are taken modulo the length
/// at the time the edit is applied.
#[derive(Clone, Debug)]
enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    InsertBytes(Index, Vec<u8>),
    InsertLine(Index, String),
    DuplicateLine(Index),
    DeleteLine(Index),
    SwapLines(Index, Index),
    DeleteField(Index, Index),
    DuplicateField(Index, Index),
    ReplaceField(Index, Index, String),
    ReplaceTag(Index, String),
}

/// Tags and fields a real file might hold by mistake.
fn odd_token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("O".to_string()),
        Just("B-".to_string()),
        Just("-".to_string()),
        Just("B-PER-X".to_string()),
        Just("E-PER".to_string()),
        Just("S-LOC".to_string()),
        Just("I-\u{e9}t\u{e9}".to_string()),
        Just("B-FOO".to_string()),
        Just("-DOCSTART-".to_string()),
        Just("\u{a0}".to_string()),
        Just("\u{feff}".to_string()),
        Just("\r".to_string()),
        Just("\0".to_string()),
        Just("x".repeat(300)),
        "[ -~]{0,12}",
        "\\PC{0,6}",
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        (
            any::<Index>(),
            prop_oneof![
                Just(b'\n'),
                Just(b' '),
                Just(b'\t'),
                Just(b'-'),
                Just(0xff),
                Just(0xc3),
                any::<u8>()
            ]
        )
            .prop_map(|(i, b)| Mutation::SetByte(i, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..6))
            .prop_map(|(i, b)| Mutation::InsertBytes(i, b)),
        (
            any::<Index>(),
            prop_oneof![odd_token(), "[A-Za-z]{1,5}( [A-Z]{1,3}){0,5}", Just("a b c d e".into())]
        )
            .prop_map(|(i, l)| Mutation::InsertLine(i, l)),
        any::<Index>().prop_map(Mutation::DuplicateLine),
        any::<Index>().prop_map(Mutation::DeleteLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(l, f)| Mutation::DeleteField(l, f)),
        (any::<Index>(), any::<Index>()).prop_map(|(l, f)| Mutation::DuplicateField(l, f)),
        (any::<Index>(), any::<Index>(), odd_token()).prop_map(|(l, f, s)| Mutation::ReplaceField(l, f, s)),
        (any::<Index>(), odd_token()).prop_map(|(l, s)| Mutation::ReplaceTag(l, s)),
    ]
}

fn split_lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect()
}

fn join_lines(lines: &[Vec<u8>]) -> Vec<u8> {
    lines.join(&b'\n')
}

/// Applies `f` to the whitespace-separated fields of one line (lines that are not
/// UTF-8 are left alone).
fn edit_fields(bytes: &mut Vec<u8>, line: Index, f: impl FnOnce(&mut Vec<String>)) {
    let mut lines = split_lines(bytes);
    let n = line.index(lines.len());
    let Ok(text) = std::str::from_utf8(&lines[n]) else { return };
    let mut fields: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    f(&mut fields);
    lines[n] = fields.join(" ").into_bytes();
    *bytes = join_lines(&lines);
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::FlipBit(i, bit) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        Mutation::SetByte(i, b) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] = *b;
        }
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len() + 1)),
        Mutation::InsertBytes(i, b) => {
            let at = i.index(bytes.len() + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        Mutation::InsertLine(i, l) => {
            let mut lines = split_lines(bytes);
            let at = i.index(lines.len() + 1);
            lines.insert(at, l.clone().into_bytes());
            *bytes = join_lines(&lines);
        }
        Mutation::DuplicateLine(i) => {
            let mut lines = split_lines(bytes);
            let at = i.index(lines.len());
            lines.insert(at, lines[at].clone());
            *bytes = join_lines(&lines);
        }
        Mutation::DeleteLine(i) => {
            let mut lines = split_lines(bytes);
            lines.remove(i.index(lines.len()));
            *bytes = join_lines(&lines);
        }
        Mutation::SwapLines(a, b) => {
            let mut lines = split_lines(bytes);
            let (a, b) = (a.index(lines.len()), b.index(lines.len()));
            lines.swap(a, b);
            *bytes = join_lines(&lines);
        }
        Mutation::DeleteField(l, f) => edit_fields(bytes, *l, |fields| {
            if !fields.is_empty() {
                fields.remove(f.index(fields.len()));
            }
        }),
        Mutation::DuplicateField(l, f) => edit_fields(bytes, *l, |fields| {
            if !fields.is_empty() {
                let at = f.index(fields.len());
                fields.insert(at, fields[at].clone());
            }
        }),
        Mutation::ReplaceField(l, f, s) => edit_fields(bytes, *l, |fields| {
            if !fields.is_empty() {
                let at = f.index(fields.len());
                fields[at] = s.clone();
            }
        }),
        Mutation::ReplaceTag(l, s) => edit_fields(bytes, *l, |fields| {
            if let Some(last) = fields.last_mut() {
                *last = s.clone();
            }
        }),
        Mutation::FlipBit(..) | Mutation::SetByte(..) => {}
    }
}

/// The file's lines as the reader numbers them (1-based; `\r\n` ends a line too,
/// a `\r` without `\n` stays).
fn reader_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let line = &rest[..end];
                lines.push(line.strip_suffix(b"\r").unwrap_or(line));
                rest = &rest[end + 1..];
            }
            None => {
                lines.push(rest);
                rest = &[];
            }
        }
    }
    lines
}

fn is_iob2(tag: &str) -> bool {
    tag == "O"
        || tag.split_once('-').is_some_and(|(prefix, kind)| {
            matches!(prefix, "B" | "I")
                && !kind.is_empty()
                && kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Whether line `line` (1-based) exists and could be at fault: it is not UTF-8,
/// or it holds a token (not blank, not `-DOCSTART-`) and `quoted` appears in it.
fn line_at_fault(lines: &[&[u8]], line: usize, quoted: &str) -> Result<(), String> {
    let Some(bytes) = line.checked_sub(1).and_then(|i| lines.get(i)) else {
        return Err(format!("line {line} does not exist: the file has {} lines", lines.len()));
    };
    let Ok(text) = std::str::from_utf8(bytes) else { return Ok(()) };
    let first = text.split_whitespace().next();
    if first.is_none() || first == Some("-DOCSTART-") {
        return Err(format!("line {line} ({text:?}) holds no token"));
    }
    if !text.contains(quoted) {
        return Err(format!("line {line} ({text:?}) does not hold {quoted:?}"));
    }
    Ok(())
}

#[allow(clippy::too_many_lines)] // tests are exempt: one scenario, read top to bottom
fn check(bytes: &[u8]) -> Result<(), String> {
    let lines = reader_lines(bytes);
    match parse_conll(bytes, PATH) {
        Ok(corpus) => {
            if corpus.sentences.is_empty() || corpus.columns < 2 {
                return Err(format!("a corpus without sentences or with {} columns", corpus.columns));
            }
            for s in &corpus.sentences {
                if s.words.is_empty() || s.words.len() != s.tags.len() {
                    return Err(format!(
                        "sentence at line {}: {} words, {} tags",
                        s.line,
                        s.words.len(),
                        s.tags.len()
                    ));
                }
                if s.line == 0 || s.line + s.words.len() - 1 > lines.len() {
                    return Err(format!("sentence at line {} runs past the {} lines", s.line, lines.len()));
                }
                if let Some(t) = s.tags.iter().find(|t| !is_iob2(t)) {
                    return Err(format!("tag {t:?} (line {}) is not IOB2", s.line));
                }
            }
            if corpus.scheme == TagScheme::Iob2
                && drove_collate::conll::detect_scheme(&corpus.sentences) != TagScheme::Iob2
            {
                return Err("converted tags are not IOB2".into());
            }
            LabelSet::from_corpus(&corpus).check(&corpus).map_err(|e| format!("own labels refused: {e}"))?;
            let Err(e) = LabelSet::conll2003().check(&corpus) else { return Ok(()) };
            let msg = e.to_string();
            let ConllError::UnknownTag { line, tag, .. } = &e else {
                return Err(format!("label check failed with something other than an unknown tag: {msg}"));
            };
            if !msg.starts_with(&format!("{PATH}:{line}: ")) {
                return Err(format!("label error does not name {PATH}:{line}: {msg}"));
            }
            // The tag as converted to IOB2: its entity type is on the line.
            let kind = tag.split_once('-').map_or(tag.as_str(), |(_, k)| k);
            line_at_fault(&lines, *line, kind).map_err(|why| format!("{msg}: {why}"))
        }
        Err(e) => {
            let msg = e.to_string();
            if !msg.starts_with(PATH) {
                return Err(format!("error does not name the file: {msg}"));
            }
            match &e {
                ConllError::Malformed { line, expected, found, .. } => {
                    if !msg.starts_with(&format!("{PATH}:{line}: ")) {
                        return Err(format!("error does not name {PATH}:{line}: {msg}"));
                    }
                    if expected == "UTF-8 text" {
                        let bad = line
                            .checked_sub(1)
                            .and_then(|i| lines.get(i))
                            .is_some_and(|l| std::str::from_utf8(l).is_err());
                        return if bad { Ok(()) } else { Err(format!("line {line} is UTF-8: {msg}")) };
                    }
                    line_at_fault(&lines, *line, "").map_err(|why| format!("{msg}: {why}"))?;
                    // `found` quotes the line.
                    let text = String::from_utf8_lossy(lines[line - 1]);
                    if !found.ends_with(&format!("{text:?}")) {
                        return Err(format!("{msg}: does not quote line {line}"));
                    }
                    Ok(())
                }
                ConllError::UnknownTag { line, tag, .. } => {
                    if !msg.starts_with(&format!("{PATH}:{line}: ")) {
                        return Err(format!("error does not name {PATH}:{line}: {msg}"));
                    }
                    line_at_fault(&lines, *line, tag).map_err(|why| format!("{msg}: {why}"))
                }
                ConllError::Empty { .. } => {
                    let token = lines.iter().find(|l| {
                        std::str::from_utf8(l)
                            .map(|t| t.split_whitespace().next().is_some_and(|w| w != "-DOCSTART-"))
                            .unwrap_or(true)
                    });
                    match token {
                        None => Ok(()),
                        Some(l) => Err(format!("{msg}, but it holds {:?}", String::from_utf8_lossy(l))),
                    }
                }
                ConllError::Io { .. } => Err(format!("an I/O error from memory: {msg}")),
            }
        }
    }
}

#[test]
fn mutated_conll_files_never_panic_and_errors_name_the_line() {
    check(VALID.as_bytes()).expect("the fixture itself reads");
    assert!(parse_conll(VALID.as_bytes(), PATH).is_ok());
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        fork: false,
        timeout: 0,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let strategy = prop::collection::vec(mutation(), 1..5);
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |mutations| {
        let mut bytes = VALID.as_bytes().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check(&bytes).map_err(|why| {
            TestCaseError::fail(format!("{why}\ninput: {:?}", String::from_utf8_lossy(&bytes)))
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} mutated CoNLL files in {:.2?}", started.elapsed());
}

/// A byte that is not UTF-8 used to be an I/O error naming no line.
#[test]
fn a_byte_that_is_not_utf8_names_its_line() {
    let mut bytes = VALID.as_bytes().to_vec();
    let at = VALID.find("German").unwrap();
    bytes[at + 1] = 0xff;
    let err = parse_conll(bytes.as_slice(), PATH).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{PATH}:5: expected UTF-8 text")), "{err}");
}
