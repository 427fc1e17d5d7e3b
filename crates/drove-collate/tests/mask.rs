//! Statistics and invariants of the masker.
use drove_collate::{MaskAction, MaskConfig, MaskConfigError, Masker};
use drove_seed::{AugmentKey, Purpose, SampleStreams, StreamKey};

const MASK: u32 = 103;
const VOCAB: u32 = 30_522;

fn within_3_sigma(observed: u64, trials: u64, p: f64) -> bool {
    let mean = trials as f64 * p;
    let sigma = (trials as f64 * p * (1.0 - p)).sqrt();
    (observed as f64 - mean).abs() <= 3.0 * sigma
}

#[test]
fn chosen_fraction_and_split_are_within_3_sigma_and_specials_never_chosen() {
    let masker = Masker::new(MaskConfig::default(), MASK, VOCAB).unwrap();
    let width = 128;
    let mut rng = StreamKey::augment(AugmentKey { seed: 42, rank: 0, worker: 0, epoch: 0 }).pcg64();
    let (mut maskable_n, mut chosen, mut masked, mut random, mut kept) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut row = 0u64;
    while maskable_n < 1_000_000 {
        // Rows of varying length: [CLS] tokens [SEP] padding...
        let len = 10 + (row % 100) as usize;
        let original: Vec<u32> = (0..width)
            .map(|i| match i {
                0 => 101,
                i if i == len - 1 => 102,
                i if i >= len => 0,
                i => 2000 + ((row as usize * 31 + i) % 20_000) as u32,
            })
            .collect();
        let maskable: Vec<bool> = (0..width).map(|i| i > 0 && i < len - 1).collect();
        let mut ids = original.clone();
        let mut actions = vec![MaskAction::None; width];
        masker.mask_row(&mut ids, &maskable, None, &mut actions, &mut rng);
        for i in 0..width {
            if !maskable[i] {
                assert_eq!(actions[i], MaskAction::None, "special/padding chosen at {i}");
                assert_eq!(ids[i], original[i]);
                continue;
            }
            maskable_n += 1;
            match actions[i] {
                MaskAction::None => assert_eq!(ids[i], original[i]),
                MaskAction::Mask => {
                    chosen += 1;
                    masked += 1;
                    assert_eq!(ids[i], MASK);
                }
                MaskAction::Random => {
                    chosen += 1;
                    random += 1;
                    assert!(ids[i] < VOCAB);
                }
                MaskAction::Keep => {
                    chosen += 1;
                    kept += 1;
                    assert_eq!(ids[i], original[i]);
                }
            }
        }
        row += 1;
    }
    assert!(within_3_sigma(chosen, maskable_n, 0.15), "chosen {chosen} of {maskable_n}");
    assert!(within_3_sigma(masked, chosen, 0.8), "[MASK] {masked} of {chosen}");
    assert!(within_3_sigma(random, chosen, 0.1), "random {random} of {chosen}");
    assert!(within_3_sigma(kept, chosen, 0.1), "kept {kept} of {chosen}");
}

#[test]
fn random_tokens_cover_the_vocabulary_uniformly() {
    let cfg = MaskConfig {
        probability: 1.0,
        mask_fraction: 0.0,
        random_fraction: 1.0,
        keep_fraction: 0.0,
        whole_word: false,
    };
    let vocab = 10;
    let masker = Masker::new(cfg, 3, vocab).unwrap();
    let mut rng = StreamKey::augment(AugmentKey { seed: 1, rank: 0, worker: 0, epoch: 0 }).pcg64();
    let mut counts = [0u64; 10];
    let n = 200_000;
    let mut ids = vec![0u32; 1000];
    let maskable = vec![true; 1000];
    let mut actions = vec![MaskAction::None; 1000];
    for _ in 0..n / 1000 {
        masker.mask_row(&mut ids, &maskable, None, &mut actions, &mut rng);
        for &t in &ids {
            counts[t as usize] += 1;
        }
    }
    for (t, &c) in counts.iter().enumerate() {
        assert!(within_3_sigma(c, n, 0.1), "token {t} drawn {c} times of {n}");
    }
}

#[test]
fn identical_streams_give_identical_patterns_on_different_data() {
    let masker = Masker::new(MaskConfig::default(), MASK, VOCAB).unwrap();
    let width = 64;
    let mut a_ids: Vec<u32> = (0..width as u32).map(|i| 1000 + i).collect();
    let mut b_ids: Vec<u32> = (0..width as u32).map(|i| 5000 + 3 * i).collect();
    // Different sentence lengths: a has 40 real tokens, b has 60.
    let a_mask: Vec<bool> = (0..width).map(|i| i > 0 && i < 39).collect();
    let b_mask: Vec<bool> = (0..width).map(|i| i > 0 && i < 59).collect();
    let (mut a_act, mut b_act) = (vec![MaskAction::None; width], vec![MaskAction::None; width]);
    let mut a_rng = StreamKey::naive(42).pcg64();
    let mut b_rng = StreamKey::naive(42).pcg64();
    for _ in 0..50 {
        masker.mask_row(&mut a_ids, &a_mask, None, &mut a_act, &mut a_rng);
        masker.mask_row(&mut b_ids, &b_mask, None, &mut b_act, &mut b_rng);
        for i in 0..width {
            if a_mask[i] && b_mask[i] {
                assert_eq!(a_act[i], b_act[i], "position {i}");
            }
        }
    }
    // Different streams do differ.
    let mut c_rng = StreamKey::augment(AugmentKey { seed: 42, rank: 1, worker: 0, epoch: 0 }).pcg64();
    let mut c_act = vec![MaskAction::None; width];
    let mut c_ids = a_ids.clone();
    let mut differ = 0;
    for _ in 0..50 {
        masker.mask_row(&mut a_ids, &a_mask, None, &mut a_act, &mut a_rng);
        masker.mask_row(&mut c_ids, &a_mask, None, &mut c_act, &mut c_rng);
        differ += a_act.iter().zip(&c_act).filter(|(x, y)| x.is_chosen() != y.is_chosen()).count();
    }
    assert!(differ > 0);
}

#[test]
fn whole_word_masking_chooses_every_subword_of_a_word_together() {
    let cfg = MaskConfig { whole_word: true, ..MaskConfig::default() };
    let masker = Masker::new(cfg, MASK, VOCAB).unwrap();
    let width = 96;
    // Words of 3 subwords each after [CLS]; last position [SEP].
    let maskable: Vec<bool> = (0..width).map(|i| i > 0 && i < width - 1).collect();
    let continues: Vec<bool> = (0..width).map(|i| i > 0 && i < width - 1 && (i - 1) % 3 != 0).collect();
    let streams = SampleStreams::new(42, Purpose::Augment, 0);
    let (mut words, mut chosen_words) = (0u64, 0u64);
    for sample in 0..5000u64 {
        let mut ids = vec![2000u32; width];
        let mut actions = vec![MaskAction::None; width];
        masker.mask_row(&mut ids, &maskable, Some(&continues), &mut actions, &mut streams.stream(sample));
        for i in 1..width - 1 {
            if continues[i] {
                assert_eq!(
                    actions[i].is_chosen(),
                    actions[i - 1].is_chosen(),
                    "sample {sample} position {i}"
                );
            } else {
                words += 1;
                chosen_words += u64::from(actions[i].is_chosen());
            }
        }
        assert!(!actions[0].is_chosen() && !actions[width - 1].is_chosen());
    }
    assert!(within_3_sigma(chosen_words, words, 0.15), "{chosen_words} of {words} words");
}

#[test]
fn extreme_probabilities() {
    let maskable = vec![false, true, true, true, false];
    let mut actions = vec![MaskAction::None; 5];
    let mut rng = StreamKey::augment(AugmentKey { seed: 3, rank: 0, worker: 0, epoch: 0 }).pcg64();
    let all = Masker::new(MaskConfig { probability: 1.0, ..MaskConfig::default() }, MASK, VOCAB).unwrap();
    let none = Masker::new(MaskConfig { probability: 0.0, ..MaskConfig::default() }, MASK, VOCAB).unwrap();
    for _ in 0..100 {
        all.mask_row(&mut [7; 5], &maskable, None, &mut actions, &mut rng);
        assert_eq!(actions.iter().map(|a| a.is_chosen()).collect::<Vec<_>>(), maskable);
        none.mask_row(&mut [7; 5], &maskable, None, &mut actions, &mut rng);
        assert!(actions.iter().all(|a| !a.is_chosen()));
    }
}

#[test]
fn invalid_configurations_are_refused_with_the_field_named() {
    let bad_sum =
        MaskConfig { mask_fraction: 0.8, random_fraction: 0.1, keep_fraction: 0.2, ..MaskConfig::default() };
    let err = Masker::new(bad_sum, MASK, VOCAB).unwrap_err();
    assert!(matches!(err, MaskConfigError::BadSum { .. }));
    assert!(err.to_string().contains("sum to 1"), "{err}");
    for (cfg, field) in [
        (MaskConfig { probability: 1.5, ..MaskConfig::default() }, "probability"),
        (MaskConfig { probability: f64::NAN, ..MaskConfig::default() }, "probability"),
        (MaskConfig { keep_fraction: -0.1, mask_fraction: 1.0, ..MaskConfig::default() }, "keep_fraction"),
    ] {
        let err = Masker::new(cfg, MASK, VOCAB).unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
    let err = Masker::new(MaskConfig::default(), VOCAB, VOCAB).unwrap_err();
    assert!(matches!(err, MaskConfigError::BadVocab { .. }), "{err}");
}
