//! [`EmbeddingBackend`] under burn's fusion: the lookup is fusion's own
//! `embedding`; the table gradient a custom operation of the fusion stream
//! (as dropout's `fusion.rs`) that runs the inner backend's when the stream
//! executes, so nothing is flushed or read.

use std::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::EmbeddingBackend;

/// The operation the fusion stream executes: the inner backend's gradient.
#[derive(Debug)]
struct WeightGrad<B> {
    desc: CustomOpIr,
    vocab: usize,
    backend: PhantomData<fn() -> B>,
}

impl<B: FusionBackend + EmbeddingBackend> Operation<B::FusionRuntime> for WeightGrad<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let ([grad, ids], [output]) = self.desc.as_fixed();
        let grad = handles.get_float_tensor::<B>(grad);
        let ids = handles.get_int_tensor::<B>(ids);
        handles.register_float_tensor::<B>(&output.id, B::lookup_weight_grad(grad, ids, self.vocab));
    }
}

impl<B: FusionBackend + EmbeddingBackend> EmbeddingBackend for Fusion<B> {
    fn lookup_weight_grad(grad: FloatTensor<Self>, ids: IntTensor<Self>, vocab: usize) -> FloatTensor<Self> {
        let client = grad.client.clone();
        let streams = OperationStreams::with_inputs([&grad, &ids]);
        let hidden = *grad.shape.last().expect("the gradient of a lookup has a hidden dimension");
        let output = TensorIr::uninit(client.create_empty_handle(), [vocab, hidden].into(), grad.dtype);
        let desc =
            CustomOpIr::new("drove_embedding_weight_grad", &[grad.into_ir(), ids.into_ir()], &[output]);
        let operation = WeightGrad::<B> { desc: desc.clone(), vocab, backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation);
        outputs.remove(0)
    }
}
