//! drove-train's behaviour tests, one test binary: `Replica` and its two
//! placements (`replica`), gradient averaging against one rank over the whole
//! batch (`equivalence`), the all-reduce overlapped with backward (`overlap`)
//! and a rank lost in the middle of a step (`faults`), all on the small token
//! classifier in `support`.
//!
//! One binary, not four: each instantiates burn's autodiff and the tagger at
//! the dev profile's opt-level 3 (this crate's override in the root
//! Cargo.toml), about 70 s of one CI core a binary; once is enough.
//! `random_inputs.rs` (no model) stays a binary of its own.

mod equivalence;
mod faults;
mod overlap;
mod replica;
mod support;
