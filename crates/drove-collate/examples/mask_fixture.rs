//! Writes masks the Rust masker makes, as JSON, for other implementations to
//! match bit for bit (the Python package's tests read it): for a few
//! configurations, rows of token ids with special tokens and padding, each
//! masked from its own per-sample stream `(seed, Purpose::Augment, epoch,
//! sample)`; and the orders drove-collate's distributed sampler gives a few
//! worlds, for the Python package's `DistributedSampler` to match.
//!
//! `cargo run -p drove-collate --example mask_fixture > masks.json`
use drove_collate::{DistributedSampler, MaskAction, MaskConfig, Masker, Remainder, SamplerOptions};
use drove_seed::{Purpose, SampleStreams};

/// One row: `[CLS] tokens [SEP] [PAD]...`, its maskable positions and, for
/// whole words, which positions continue the previous one's word.
fn row(sample: u64, width: usize) -> (Vec<u32>, Vec<bool>, Vec<bool>) {
    let len = 4 + (sample as usize * 7) % (width - 4);
    let mut ids = vec![0u32; width];
    let mut maskable = vec![false; width];
    let mut continues = vec![false; width];
    ids[0] = 101;
    for i in 1..len - 1 {
        ids[i] = 1000 + ((sample as u32 + 1) * 37 + i as u32 * 11) % 20_000;
        maskable[i] = true;
        continues[i] = i > 1 && (i + sample as usize).is_multiple_of(3);
    }
    ids[len - 1] = 102;
    (ids, maskable, continues)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let configs = [
        ("default", MaskConfig::default()),
        ("whole_word", MaskConfig { whole_word: true, ..MaskConfig::default() }),
        (
            "half",
            MaskConfig {
                probability: 0.5,
                mask_fraction: 0.5,
                random_fraction: 0.3,
                keep_fraction: 0.2,
                whole_word: false,
            },
        ),
    ];
    let (seed, epoch, width, vocab, mask_token) = (42u64, 3u64, 24usize, 30_522u32, 103u32);
    let samples: Vec<u64> = vec![0, 1, 2, 7, 100, 12_345];
    let mut cases = Vec::new();
    for (name, config) in configs {
        let masker = Masker::new(config, mask_token, vocab)?;
        let streams = SampleStreams::new(seed, Purpose::Augment, epoch);
        let (mut inputs, mut outputs, mut actions, mut maskables, mut continuing) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &sample in &samples {
            let (ids, maskable, continues) = row(sample, width);
            let mut masked = ids.clone();
            let mut done = vec![MaskAction::None; width];
            masker.mask_row(&mut masked, &maskable, Some(&continues), &mut done, &mut streams.stream(sample));
            inputs.push(ids);
            outputs.push(masked);
            actions.push(done.iter().map(|a| *a as u8).collect::<Vec<_>>());
            maskables.push(maskable);
            continuing.push(continues);
        }
        cases.push(format!(
            "{{\"name\":\"{name}\",\"probability\":{},\"mask_fraction\":{},\"random_fraction\":{},\
             \"keep_fraction\":{},\"whole_word\":{},\"ids\":{inputs:?},\"maskable\":{maskables:?},\
             \"continues_word\":{continuing:?},\"masked\":{outputs:?},\"actions\":{actions:?}}}",
            config.probability,
            config.mask_fraction,
            config.random_fraction,
            config.keep_fraction,
            config.whole_word
        ));
    }
    println!(
        "{{\"seed\":{seed},\"epoch\":{epoch},\"vocab_size\":{vocab},\"mask_token\":{mask_token},\
         \"samples\":{samples:?},\"cases\":[{}],\"samplers\":[{}]}}",
        cases.join(","),
        samplers()?.join(",")
    );
    Ok(())
}

/// Every rank's indices for a few (length, world, seed, epoch, shuffle,
/// remainder) settings.
fn samplers() -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for (len, world, seed, epoch, shuffle, drop_last) in
        [(10usize, 3usize, 42u64, 0u64, true, false), (10, 3, 42, 1, true, true), (17, 4, 7, 5, false, false)]
    {
        for rank in 0..world {
            let remainder = if drop_last { Remainder::Drop } else { Remainder::Pad };
            let mut sampler = DistributedSampler::new(
                len,
                SamplerOptions { world_size: world, rank, seed, shuffle, remainder },
            )?;
            sampler.set_epoch(epoch);
            out.push(format!(
                "{{\"len\":{len},\"world_size\":{world},\"rank\":{rank},\"seed\":{seed},\"epoch\":{epoch},\
                 \"shuffle\":{shuffle},\"drop_last\":{drop_last},\"indices\":{:?}}}",
                sampler.indices()
            ));
        }
    }
    Ok(out)
}
