//! A data-parallel training step assembled from drove-train's parts, on a
//! small token classifier of its own and made-up data, in a world of one (`SingleProcess`); under a launcher,
//! swap in `drove_launch::connect_from_env()` and nothing else changes.
//!
//! ```text
//! cargo run -p drove-train --example flat_step
//! ```
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use drove_collective::fusion::{FusionOptions, all_reduce_fused};
use drove_collective::{ReduceOptions, SingleProcess};
use drove_train::broadcast_parameters;
use drove_train::flat::{AdamWSettings, FlatAdamW, FlatParams, clip_global_norm, take_gradients};
use drove_train::schedule::Schedule;

type B = Autodiff<Flex>;

#[path = "support/tagger.rs"]
mod tagger;
use tagger::Tagger;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Default::default();
    let comm = SingleProcess;
    let (batch, seq, labels) = (8, 12, 5);
    let model = Tagger::<B>::new(50, 16, labels, &device);
    // Every rank starts from rank 0's weights.
    let mut model = broadcast_parameters(model, &comm, 0, &device)?;
    let mut params = FlatParams::read(&model)?;
    let mut optim = FlatAdamW::new(AdamWSettings::default(), &params);
    let (peak, schedule) = (1e-3, Schedule::warmup_linear(0.1, 30));
    let ids: Vec<i64> = (0..batch * seq).map(|i| 1 + (i as i64 * 7) % 49).collect();
    let targets: Vec<i64> = ids.iter().map(|&t| t % labels as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [batch * seq]), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for step in 0..30 {
        let logits = model.forward(ids.clone());
        let loss = loss_fn.forward(logits.reshape([batch * seq, labels]), targets.clone());
        let value: f32 = loss.clone().into_scalar().elem();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        let mut flat = take_gradients(&model, &mut grads)?;
        // Average across ranks (fused into buckets), clip, update, write back.
        let mut refs: Vec<&mut [f32]> = flat.iter_mut().map(|g| g.as_mut_slice()).collect();
        all_reduce_fused(&comm, "gradients", &mut refs, ReduceOptions::average(), FusionOptions::default())?;
        let norm = clip_global_norm(&mut flat, 1.0);
        optim.update(&mut params, &flat, schedule.lr(peak, step));
        model = params.write(model, &device);
        if step % 5 == 0 || step == 29 {
            println!("step {step:2}: loss {value:.4}, gradient norm {norm:.3}");
        }
    }
    Ok(())
}
