//! The matmul suite (`drove bench matmul`): every cubek kernel of
//! [`drove_kernels::matmul::Kernel::ALL`] timed on the GEMMs of a MiniLM
//! training step (dense layers' forward, data and weight gradients, and
//! attention's batched products, at batch 32 and 256 and sequence lengths
//! 32, 64 and 128), each result checked against a reference, beside cuBLAS
//! through cudarc where the build has CUDA and libcublas loads
//! ([`cublas`]). The sweep that sets drove's strategy table (issue 49).
//!
//! A row's time is the mean of `repeats` launches between two device
//! syncs, after one untimed launch (which compiles the kernel) whose result
//! is compared with the reference: the f64 product on the host for small
//! problems (every `--quick` one), else cubek's unit kernel (f32) on the
//! device. A kernel the device cannot run (tensor cores, TMA) is a row with
//! its `error`, not a failure of the suite. A time budget bounds the sweep:
//! shapes not started within it are counted in `skipped`.

use serde::Serialize;

#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod sweep;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub use sweep::run;

/// Settings of the matmul suite.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct MatmulOptions {
    /// Tiny shapes and 2 repetitions (a check that every kernel that
    /// launches multiplies right, for CI on a software GPU).
    #[cfg_attr(feature = "clap", arg(long))]
    pub quick: bool,
    /// Timed launches per shape and kernel, after one untimed.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 10,
        value_parser = |s: &str| crate::flags::at_least(s, 1, "--repeats", "")))]
    pub repeats: usize,
    /// Seconds after which no new shape is started (the rows so far are
    /// reported, the shapes left counted in `skipped`).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 240.0, value_parser = crate::flags::seconds))]
    pub budget_s: f64,
    /// The kernels to time, comma-separated (default: all; see the
    /// strategies in the JSON for their names).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub kernels: Vec<drove_kernels::matmul::Kernel>,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        MatmulOptions { quick: false, repeats: 10, budget_s: 240.0, kernels: Vec::new() }
    }
}

/// What the matmul suite reports (the JSON of `drove bench matmul`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MatmulReport {
    /// `matmul`.
    pub benchmark: &'static str,
    /// The device, in words.
    pub device: String,
    /// Whether the tiny shapes of `--quick` were run.
    pub quick: bool,
    /// Timed launches per row.
    pub repeats: usize,
    /// One row per shape and kernel (and cuBLAS).
    pub rows: Vec<MatmulRow>,
    /// Shapes not started within the time budget.
    pub skipped: usize,
    /// cuBLAS: whether it ran, else why not.
    pub cublas: CublasStatus,
}

/// One kernel on one GEMM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MatmulRow {
    /// The GEMM's role in a step (`ffn_up/weight_grad`, `attention/scores`).
    pub class: String,
    /// Sentences a step.
    pub sentences: usize,
    /// Tokens a sentence.
    pub seq: usize,
    /// Output rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// Products in the batch.
    pub batch: usize,
    /// Which operand is a transposed view (`lhs`, `rhs` or `none`).
    pub transposed: &'static str,
    /// The kernel (drove's name of a cubek strategy, or `cublas_sgemm`,
    /// `cublas_tf32`).
    pub strategy: String,
    /// Its inner products: `tf32` (tensor cores, where the device has TF32)
    /// or `f32`.
    pub precision: &'static str,
    /// Mean time a launch, microseconds (absent when it did not launch).
    pub mean_us: Option<f64>,
    /// `2 m n k batch / mean`, in TFLOP/s.
    pub tflops: Option<f64>,
    /// Largest difference from the reference over its largest magnitude.
    pub max_rel_diff: Option<f64>,
    /// Whether that is within the kernel's precision (1e-4 for f32, 5e-3
    /// for TF32).
    pub matched: bool,
    /// Why the kernel did not run (cubek's or cuBLAS's words).
    pub error: Option<String>,
}

/// Whether cuBLAS ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CublasStatus {
    /// It was timed.
    pub available: bool,
    /// Why not, when not (a build without CUDA, no libcublas, ...).
    pub reason: Option<String>,
}

/// The largest relative error a result of `precision` may show.
pub fn tolerance(precision: &str) -> f64 {
    if precision == "tf32" { 5e-3 } else { 1e-4 }
}

/// One GEMM of the sweep, and how its operands lie in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// Its role in a step.
    pub class: String,
    /// Sentences a step.
    pub sentences: usize,
    /// Tokens a sentence.
    pub seq: usize,
    /// Its shape.
    pub gemm: drove_kernels::matmul::Gemm,
    /// The left operand is stored `[batch, k, m]` and transposed (a view).
    pub lhs_transposed: bool,
    /// The right operand is stored `[batch, n, k]` and transposed (a view).
    pub rhs_transposed: bool,
}

impl Case {
    /// `lhs`, `rhs` or `none`.
    pub fn transposed(&self) -> &'static str {
        match (self.lhs_transposed, self.rhs_transposed) {
            (true, _) => "lhs",
            (false, true) => "rhs",
            (false, false) => "none",
        }
    }
}

/// MiniLM's dense layers: (name, in, out).
const DENSE: [(&str, usize, usize); 3] =
    [("attention_dense", 384, 384), ("ffn_up", 384, 1536), ("ffn_down", 1536, 384)];
/// MiniLM's attention: heads and their width.
const HEADS: (usize, usize) = (12, 32);

/// The GEMMs of one step at `sentences x seq` for a model of the given
/// dense layers and heads.
fn step_cases(
    sentences: usize,
    seq: usize,
    dense: &[(&str, usize, usize)],
    (heads, width): (usize, usize),
) -> Vec<Case> {
    use drove_kernels::matmul::Gemm;
    let tokens = sentences * seq;
    let case = |class: String, (m, n, k, batch), lhs_t, rhs_t| Case {
        class,
        sentences,
        seq,
        gemm: Gemm { m, n, k, batch },
        lhs_transposed: lhs_t,
        rhs_transposed: rhs_t,
    };
    let mut cases = Vec::new();
    for &(name, d_in, d_out) in dense {
        cases.push(case(format!("{name}/forward"), (tokens, d_out, d_in, 1), false, false));
        cases.push(case(format!("{name}/data_grad"), (tokens, d_in, d_out, 1), false, true));
        cases.push(case(format!("{name}/weight_grad"), (d_in, d_out, tokens, 1), true, false));
    }
    let batch = sentences * heads;
    // q k^T; and the probabilities' gradient g v^T has the same shape.
    cases.push(case("attention/scores".into(), (seq, seq, width, batch), false, true));
    // p v; and the queries' gradient g_s k has the same shape.
    cases.push(case("attention/context".into(), (seq, width, seq, batch), false, false));
    // p^T g: the values' (and keys') gradient.
    cases.push(case("attention/value_grad".into(), (seq, width, seq, batch), true, false));
    cases
}

/// The sweep's GEMMs, the largest step first: MiniLM at batch 256 and 32,
/// lengths 128, 64, 32; with `quick`, one tiny step (dense 16 -> 24, two
/// heads of 8, two sentences of 8 tokens).
pub fn cases(quick: bool) -> Vec<Case> {
    if quick {
        return step_cases(2, 8, &[("dense", 16, 24)], (2, 8));
    }
    let mut cases = Vec::new();
    for seq in [128, 64, 32] {
        for sentences in [256, 32] {
            cases.extend(step_cases(sentences, seq, &DENSE, HEADS));
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_covers_every_gemm_of_a_minilm_step() {
        let all = cases(false);
        assert_eq!(all.len(), 6 * 12);
        let b256 = &all[..12];
        assert!(b256.iter().all(|c| c.sentences == 256 && c.seq == 128));
        let wgrad = b256.iter().find(|c| c.class == "ffn_up/weight_grad").unwrap();
        assert_eq!((wgrad.gemm.m, wgrad.gemm.n, wgrad.gemm.k, wgrad.gemm.batch), (384, 1536, 256 * 128, 1));
        assert_eq!(wgrad.transposed(), "lhs");
        let scores = b256.iter().find(|c| c.class == "attention/scores").unwrap();
        assert_eq!(
            (scores.gemm.m, scores.gemm.n, scores.gemm.k, scores.gemm.batch),
            (128, 128, 32, 256 * 12)
        );
        assert_eq!(scores.transposed(), "rhs");
        assert!(cases(true).iter().all(|c| c.gemm.flops() < 1e6));
    }

    #[test]
    fn tf32_is_allowed_more_than_f32() {
        assert!(tolerance("tf32") > tolerance("f32"));
    }

    #[cfg(feature = "clap")]
    #[test]
    fn defaults_are_the_flags_defaults() {
        assert_eq!(crate::flags::parsed_from_no_flags::<MatmulOptions>(), MatmulOptions::default());
    }
}
