use burn::backend::{Autodiff, Flex};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use drove_bert::BertConfig;
use std::time::Instant;
type B = Autodiff<Flex>;
fn main() {
    let device = Default::default();
    let cfg = BertConfig::from_file("assets/minilm/config.json").unwrap();
    let mut model = cfg.init_token_classification::<B>(9, &device);
    let mut optim = AdamWConfig::new().init::<B, _>();
    for &(bs, seq) in &[(32usize, 24usize), (32, 24), (32, 40)] {
        let ids: Vec<i64> = (0..bs * seq).map(|i| (i as i64 * 7919) % 29000 + 1000).collect();
        let n = 3;
        let (mut tf, mut tb, mut to) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let t = Instant::now();
            let x = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [bs, seq]), &device);
            let logits = model.forward(x.clone(), x.zeros_like(), Tensor::ones([bs, seq], &device));
            let loss = logits.powi_scalar(2).mean();
            let _ = loss.clone().into_scalar();
            tf += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            tb += t.elapsed().as_secs_f64();
            let t = Instant::now();
            model = optim.step(1e-5, model, grads);
            let _ = model.classifier.weight.val().into_data();
            to += t.elapsed().as_secs_f64();
        }
        let k = n as f64;
        println!("bs {bs} seq {seq}: fwd {:.3} bwd {:.3} opt {:.3}", tf / k, tb / k, to / k);
    }
}
