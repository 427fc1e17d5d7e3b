//! The diagnostic reproduces the story: naive seeding agrees everywhere, derived
//! seeding agrees as independent masks do.
use drove_collate::MaskSeeding;
use drove_collate::diag::{Simulation, simulate};
use drove_diagnostic::{AgreementAccumulator, RowMasks, Verdict, expected_agreement};

#[test]
fn naive_seeding_gives_identical_masks_across_ranks() {
    for workers in [1, 4] {
        let r =
            simulate(&Simulation { seeding: MaskSeeding::Naive, workers, ..Simulation::default() }).unwrap();
        assert_eq!(r.mean_agreement, 1.0, "{workers} workers");
        assert_eq!(r.verdict, Verdict::Identical);
        assert!((r.normalised - 1.0).abs() < 1e-12);
        assert!(r.pairs.iter().all(|p| p.compared > 10_000));
    }
}

#[test]
fn derived_seeding_agrees_like_independent_masks() {
    for seeding in [MaskSeeding::PerSample, MaskSeeding::PerWorker] {
        let r = simulate(&Simulation { seeding, ..Simulation::default() }).unwrap();
        assert!((r.expected - 0.745).abs() < 1e-12);
        assert!(r.within_3_sigma, "{seeding}: {} vs {} +- 3*{}", r.mean_agreement, r.expected, r.sigma);
        assert_eq!(r.verdict, Verdict::Diverse);
        assert!(r.normalised.abs() < 0.05);
        assert_eq!(r.matrix.len(), 4);
        assert_eq!(r.pairs.len(), 6);
    }
}

#[test]
fn accumulator_compares_only_positions_maskable_on_both() {
    let a = RowMasks {
        width: 4,
        chosen: vec![false, true, true, false],
        maskable: vec![false, true, true, true],
    };
    let b = RowMasks {
        width: 4,
        chosen: vec![true, true, false, false],
        maskable: vec![true, true, true, false],
    };
    assert_eq!(a.compare(&b), (1, 2));
    let mut acc = AgreementAccumulator::new(2, 0.5);
    acc.add_step(&[a.clone(), b]);
    acc.add_step(&[a.clone(), a]);
    let r = acc.report();
    assert_eq!(r.steps, 2);
    assert!((r.mean_agreement - 4.0 / 5.0).abs() < 1e-12);
    assert_eq!(r.expected, expected_agreement(0.5));
    assert!(simulate(&Simulation { world_size: 1, ..Simulation::default() }).is_err());
}
