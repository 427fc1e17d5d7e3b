//! The watcher's notes: one JSON datagram each, as `python/drove_watch.py`
//! sends them.

use std::collections::BTreeMap;
use std::fmt;

use drove_diagnostic::RowMasks;
use serde::Deserialize;

use crate::error::WatchError;

/// A random stream a loader can draw from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RandomStream {
    /// Python's `random` module.
    Random,
    /// NumPy's global state (`np.random.*`).
    Numpy,
    /// torch's default generator (`torch.rand`, `torch.randperm`, ...).
    Torch,
}

impl fmt::Display for RandomStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RandomStream::Random => "Python's random",
            RandomStream::Numpy => "NumPy's global state",
            RandomStream::Torch => "torch's default generator",
        })
    }
}

/// Where in a rank a stream was seen: a loader worker, or the main process
/// (a loader without workers fetches there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DrawPlace {
    /// The rank's main process.
    Main,
    /// Loader worker `.0`.
    Worker(u32),
}

impl<'de> Deserialize<'de> for DrawPlace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let id = i64::deserialize(d)?;
        match id {
            -1 => Ok(DrawPlace::Main),
            0.. => u32::try_from(id).map(DrawPlace::Worker).map_err(serde::de::Error::custom),
            _ => Err(serde::de::Error::custom(format!("worker {id} is neither -1 (main) nor an id"))),
        }
    }
}

impl fmt::Display for DrawPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrawPlace::Main => f.write_str("the main process"),
            DrawPlace::Worker(w) => write!(f, "worker {w}"),
        }
    }
}

/// One epoch of one loader (loaders numbered in the order a rank first
/// iterates them, the same on every rank of one program).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoaderEpoch {
    /// The loader.
    pub loader: u32,
    /// Its epoch (its `iter` calls, from 0).
    pub epoch: u32,
}

impl fmt::Display for LoaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loader {}, epoch {}", self.loader, self.epoch)
    }
}

/// A rank's place: who drew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Drawer {
    /// The rank.
    pub rank: usize,
    /// Its worker, or its main process.
    pub place: DrawPlace,
}

/// One note from one process of one rank.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// A worker's (or an epoch's main-process) fingerprint of each stream, at its start.
    Streams {
        /// Who.
        member: Drawer,
        /// When.
        at: LoaderEpoch,
        /// Each stream's fingerprint (a hash of its state, never the state).
        fingerprints: BTreeMap<RandomStream, String>,
    },
    /// The loader drew from these streams while fetching (their state moved).
    Drawn {
        /// Who.
        member: Drawer,
        /// When.
        at: LoaderEpoch,
        /// Which.
        streams: Vec<RandomStream>,
    },
    /// One batch's MLM mask (`labels != -100`).
    Mask {
        /// The rank.
        rank: usize,
        /// When.
        at: LoaderEpoch,
        /// The batch's index in its epoch.
        batch: u64,
        /// Its mask.
        masks: RowMasks,
    },
}

/// The wire form, tagged by `t`.
#[derive(Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
enum Wire {
    Streams {
        rank: usize,
        loader: u32,
        epoch: u32,
        worker: DrawPlace,
        fp: BTreeMap<RandomStream, String>,
    },
    Drawn {
        rank: usize,
        loader: u32,
        epoch: u32,
        worker: DrawPlace,
        streams: Vec<RandomStream>,
    },
    Mask {
        rank: usize,
        loader: u32,
        epoch: u32,
        batch: u64,
        rows: usize,
        width: usize,
        chosen: String,
        maskable: String,
    },
}

impl Note {
    /// Reads one datagram.
    pub fn parse(bytes: &[u8]) -> Result<Note, WatchError> {
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| WatchError::Note(e.to_string()))?;
        Ok(match wire {
            Wire::Streams { rank, loader, epoch, worker, fp } => Note::Streams {
                member: Drawer { rank, place: worker },
                at: LoaderEpoch { loader, epoch },
                fingerprints: fp,
            },
            Wire::Drawn { rank, loader, epoch, worker, streams } => Note::Drawn {
                member: Drawer { rank, place: worker },
                at: LoaderEpoch { loader, epoch },
                streams,
            },
            Wire::Mask { rank, loader, epoch, batch, rows, width, chosen, maskable } => {
                let positions = rows.checked_mul(width).ok_or_else(|| {
                    WatchError::Note(format!("a mask of {rows} x {width} positions is too large"))
                })?;
                let masks = RowMasks {
                    width,
                    chosen: bits("chosen", &chosen, positions)?,
                    maskable: bits("maskable", &maskable, positions)?,
                };
                Note::Mask { rank, at: LoaderEpoch { loader, epoch }, batch, masks }
            }
        })
    }
}

/// `positions` flags from hex, 8 to a byte, most significant bit first.
fn bits(field: &str, hex: &str, positions: usize) -> Result<Vec<bool>, WatchError> {
    let bytes = positions.div_ceil(8);
    if hex.len() != 2 * bytes {
        return Err(WatchError::Note(format!(
            "{field} holds {} hex digits, not the {} of {positions} positions",
            hex.len(),
            2 * bytes
        )));
    }
    let mut out = Vec::with_capacity(positions);
    for i in 0..bytes {
        let byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| WatchError::Note(format!("{field} is not hex at digit {}", 2 * i)))?;
        for bit in 0..8 {
            if out.len() < positions {
                out.push(byte & (0x80 >> bit) != 0);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_note_reads_as_the_watcher_writes_it() {
        let n = Note::parse(
            br#"{"t":"streams","loader":0,"epoch":2,"worker":3,"fp":{"torch":"ab","random":"cd"},"rank":1}"#,
        )
        .unwrap();
        let Note::Streams { member, at, fingerprints } = n else { panic!("{n:?}") };
        assert_eq!(member, Drawer { rank: 1, place: DrawPlace::Worker(3) });
        assert_eq!(at, LoaderEpoch { loader: 0, epoch: 2 });
        assert_eq!(fingerprints[&RandomStream::Torch], "ab");
        let n =
            Note::parse(br#"{"t":"drawn","loader":1,"epoch":0,"worker":-1,"streams":["numpy"],"rank":0}"#)
                .unwrap();
        assert_eq!(
            n,
            Note::Drawn {
                member: Drawer { rank: 0, place: DrawPlace::Main },
                at: LoaderEpoch { loader: 1, epoch: 0 },
                streams: vec![RandomStream::Numpy]
            }
        );
        // 2 x 5 positions: 10 bits in 2 bytes, most significant first.
        let n = Note::parse(
            br#"{"t":"mask","loader":0,"epoch":0,"batch":10,"rows":2,"width":5,"chosen":"8840","maskable":"ffc0","rank":2}"#,
        )
        .unwrap();
        let Note::Mask { rank, batch, masks, .. } = n else { panic!("{n:?}") };
        assert_eq!((rank, batch, masks.rows()), (2, 10, 2));
        let chosen: Vec<usize> =
            masks.chosen.iter().enumerate().filter(|(_, c)| **c).map(|(i, _)| i).collect();
        assert_eq!(chosen, [0, 4, 9]);
        assert!(masks.maskable.iter().all(|m| *m));
    }

    #[test]
    fn a_bad_note_is_an_error_naming_what_is_wrong() {
        let e = Note::parse(br#"{"t":"mask","loader":0,"epoch":0,"batch":0,"rows":2,"width":5,"chosen":"88","maskable":"ffc0","rank":0}"#)
            .unwrap_err();
        assert!(e.to_string().contains("chosen holds 2 hex digits, not the 4 of 10 positions"), "{e}");
        let e =
            Note::parse(br#"{"t":"streams","loader":0,"epoch":0,"worker":-2,"fp":{},"rank":0}"#).unwrap_err();
        assert!(e.to_string().contains("worker -2"), "{e}");
        assert!(Note::parse(b"not json").is_err());
    }
}
