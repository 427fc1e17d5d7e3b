//! Reading CoNLL files: one token a line with whitespace-separated columns (word
//! first, entity tag last), blank lines between sentences, `-DOCSTART-` lines
//! between documents. IOB1 is detected and converted to IOB2.

use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// An error reading a CoNLL file; each names the file and, where there is one, the
/// line (1-based).
#[derive(Debug, thiserror::Error)]
pub enum ConllError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line does not have the expected shape.
    #[error("{path}:{line}: expected {expected}, found {found}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What a line must look like.
        expected: String,
        /// What it looked like.
        found: String,
    },
    /// A tag that is not `O`, `B-TYPE` or `I-TYPE`, or not in the given label set.
    #[error("{path}:{line}: unknown tag {tag:?}: {reason}")]
    UnknownTag {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The tag.
        tag: String,
        /// Why it is not accepted.
        reason: String,
    },
    /// The file holds no sentence.
    #[error("{path}: no sentences found (the file is empty or holds only -DOCSTART- and blank lines)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The tagging scheme a file was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TagScheme {
    /// Every chunk starts with `B-`.
    Iob2,
    /// Chunks start with `I-`; `B-` only separates two adjacent chunks of one type.
    Iob1,
}

impl fmt::Display for TagScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TagScheme::Iob2 => "IOB2",
            TagScheme::Iob1 => "IOB1",
        })
    }
}

/// One sentence: words with their entity tags (always IOB2 after reading).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentence {
    /// Words, in order.
    pub words: Vec<String>,
    /// One IOB2 tag per word.
    pub tags: Vec<String>,
    /// 1-based line of the first word in the file.
    pub line: usize,
}

/// The sentences of one file, with the scheme it was written in.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The file read.
    pub path: PathBuf,
    /// Sentences in file order, tags converted to IOB2.
    pub sentences: Vec<Sentence>,
    /// The scheme detected in the file (before conversion).
    pub scheme: TagScheme,
    /// Number of columns per token line.
    pub columns: usize,
}

impl Corpus {
    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.sentences.iter().map(|s| s.words.len()).sum()
    }
}

/// Reads a CoNLL file from disk.
pub fn read_conll(path: impl AsRef<Path>) -> Result<Corpus, ConllError> {
    let path = path.as_ref();
    let file =
        std::fs::File::open(path).map_err(|source| ConllError::Io { path: path.to_path_buf(), source })?;
    parse_conll(std::io::BufReader::new(file), path)
}

/// A parsed tag: `O` or a prefix with an entity type.
enum Tag<'a> {
    Outside,
    Begin(&'a str),
    Inside(&'a str),
}

fn parse_tag(tag: &str) -> Result<Tag<'_>, String> {
    if tag == "O" {
        return Ok(Tag::Outside);
    }
    let (prefix, kind) = match tag.split_once('-') {
        Some(parts) => parts,
        None => return Err("expected O, B-TYPE or I-TYPE".into()),
    };
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("entity type {kind:?} must be non-empty letters, digits or _"));
    }
    match prefix {
        "B" => Ok(Tag::Begin(kind)),
        "I" => Ok(Tag::Inside(kind)),
        other => Err(format!("prefix {other:?} is not B or I (only IOB1 and IOB2 are supported)")),
    }
}

/// Parses CoNLL text; `path` names the source in errors.
pub fn parse_conll(mut reader: impl BufRead, path: impl AsRef<Path>) -> Result<Corpus, ConllError> {
    let path = path.as_ref().to_path_buf();
    let mut sentences = Vec::new();
    let mut current = Sentence { words: Vec::new(), tags: Vec::new(), line: 0 };
    let mut columns: Option<(usize, usize)> = None; // (count, line that set it)
    let mut bytes = Vec::new();
    let mut number = 0;
    while let Some(line) = read_line(&mut reader, &mut bytes, &mut number, &path)? {
        let mut fields = line.split_whitespace();
        let Some(word) = fields.next().filter(|w| *w != "-DOCSTART-") else {
            flush(&mut current, &mut sentences);
            continue;
        };
        check_columns(&mut columns, 1 + fields.clone().count(), number, line, &path)?;
        let tag = fields.last().expect("at least two columns");
        if let Err(reason) = parse_tag(tag) {
            return Err(ConllError::UnknownTag { path, line: number, tag: tag.into(), reason });
        }
        if current.words.is_empty() {
            current.line = number;
        }
        current.words.push(word.to_string());
        current.tags.push(tag.to_string());
    }
    flush(&mut current, &mut sentences);
    if sentences.is_empty() {
        return Err(ConllError::Empty { path });
    }

    let scheme = detect_scheme(&sentences);
    if scheme == TagScheme::Iob1 {
        for s in &mut sentences {
            iob1_to_iob2(&mut s.tags);
        }
    }
    Ok(Corpus { path, sentences, scheme, columns: columns.map_or(0, |c| c.0) })
}

/// Ends the sentence being read, if it has words.
fn flush(current: &mut Sentence, out: &mut Vec<Sentence>) {
    if !current.words.is_empty() {
        out.push(std::mem::replace(current, Sentence { words: Vec::new(), tags: Vec::new(), line: 0 }));
    }
}

/// The next line without its line ending, counted in `number`; `None` at the
/// end. Lines are read as bytes, so that text that is not UTF-8 is an error
/// naming its line.
fn read_line<'b>(
    reader: &mut impl BufRead,
    bytes: &'b mut Vec<u8>,
    number: &mut usize,
    path: &Path,
) -> Result<Option<&'b str>, ConllError> {
    bytes.clear();
    let read = reader.read_until(b'\n', bytes).map_err(|e| ConllError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(e.kind(), format!("line {}: {e}", *number + 1)),
    })?;
    if read == 0 {
        return Ok(None);
    }
    *number += 1;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    match std::str::from_utf8(bytes) {
        Ok(line) => Ok(Some(line)),
        Err(e) => Err(ConllError::Malformed {
            path: path.to_path_buf(),
            line: *number,
            expected: "UTF-8 text".into(),
            found: format!(
                "a byte that is not UTF-8 at byte {} of the line: {:?}",
                e.valid_up_to() + 1,
                String::from_utf8_lossy(bytes)
            ),
        }),
    }
}

/// Checks that line `number` has `count` columns: at least 2 on the first
/// line of words (which sets `columns`), as many as it on every other.
fn check_columns(
    columns: &mut Option<(usize, usize)>,
    count: usize,
    number: usize,
    line: &str,
    path: &Path,
) -> Result<(), ConllError> {
    match *columns {
        None if count < 2 => Err(ConllError::Malformed {
            path: path.to_path_buf(),
            line: number,
            expected: "at least 2 whitespace-separated columns (word ... tag)".into(),
            found: format!("1 column: {line:?}"),
        }),
        None => {
            *columns = Some((count, number));
            Ok(())
        }
        Some((expected, first)) if expected != count => Err(ConllError::Malformed {
            path: path.to_path_buf(),
            line: number,
            expected: format!("{expected} columns (word ... tag), as on line {first}"),
            found: format!("{count}: {line:?}"),
        }),
        Some(_) => Ok(()),
    }
}

/// IOB2 if every chunk starts with `B-`; IOB1 if some chunk starts with `I-`.
pub fn detect_scheme(sentences: &[Sentence]) -> TagScheme {
    for s in sentences {
        let mut previous: Option<&str> = None; // type of the previous tag, None for O/start
        for tag in &s.tags {
            match parse_tag(tag) {
                Ok(Tag::Inside(kind)) if previous != Some(kind) => return TagScheme::Iob1,
                Ok(Tag::Inside(kind)) | Ok(Tag::Begin(kind)) => previous = Some(kind),
                _ => previous = None,
            }
        }
    }
    TagScheme::Iob2
}

/// Rewrites IOB1 tags as IOB2: an `I-X` that starts a chunk becomes `B-X`.
pub fn iob1_to_iob2(tags: &mut [String]) {
    let mut previous: Option<String> = None;
    for tag in tags.iter_mut() {
        let kind = match parse_tag(tag) {
            Ok(Tag::Inside(kind)) => {
                let kind = kind.to_string();
                if previous.as_deref() != Some(kind.as_str()) {
                    *tag = format!("B-{kind}");
                }
                Some(kind)
            }
            Ok(Tag::Begin(kind)) => Some(kind.to_string()),
            _ => None,
        };
        previous = kind;
    }
}

/// The ordered set of tags a model predicts; `O` is always id 0.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LabelSet {
    tags: Vec<String>,
}

impl LabelSet {
    /// The 9 tags of CoNLL-2003 in the usual order.
    pub fn conll2003() -> Self {
        let tags = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"];
        LabelSet { tags: tags.iter().map(|t| t.to_string()).collect() }
    }

    /// `O`, then `B-X`, `I-X` for every entity type seen, types sorted by name.
    pub fn from_corpus(corpus: &Corpus) -> Self {
        let mut kinds: Vec<String> = corpus
            .sentences
            .iter()
            .flat_map(|s| s.tags.iter())
            .filter_map(|t| t.split_once('-').map(|(_, k)| k.to_string()))
            .collect();
        kinds.sort();
        kinds.dedup();
        let mut tags = vec!["O".to_string()];
        for k in kinds {
            tags.push(format!("B-{k}"));
            tags.push(format!("I-{k}"));
        }
        LabelSet { tags }
    }

    /// The tags, by id.
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// Number of tags.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    /// Whether the set is empty (never, for a set built here).
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Id of a tag.
    pub fn id(&self, tag: &str) -> Option<usize> {
        self.tags.iter().position(|t| t == tag)
    }

    /// Checks that every tag of `corpus` is in the set; the error names the line.
    pub fn check(&self, corpus: &Corpus) -> Result<(), ConllError> {
        for s in &corpus.sentences {
            for (i, tag) in s.tags.iter().enumerate() {
                if self.id(tag).is_none() {
                    return Err(ConllError::UnknownTag {
                        path: corpus.path.clone(),
                        line: s.line + i,
                        tag: tag.clone(),
                        reason: format!("not one of the {} labels {:?}", self.len(), self.tags),
                    });
                }
            }
        }
        Ok(())
    }
}
