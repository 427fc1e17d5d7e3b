//! drove's matmul on `Fusion<B>`: a custom operation of burn's fusion stream
//! (`CustomOpIr`, as burn-vision-0.21.0's `src/backends/cube/ops.rs:98-127`)
//! that runs `B`'s when the stream executes. The matmul is not fused with
//! the element-wise operations around it, as burn's own fused matmul is.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, MatmulOpIr, OperationIr, OperationOutput};

use super::{MatmulOps, Precision};

/// The queued operation: the IR of its tensors and the precision.
#[derive(Debug)]
struct DroveMatmul<B> {
    desc: CustomOpIr,
    precision: Precision,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + MatmulOps> Operation<B::FusionRuntime> for DroveMatmul<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let ([lhs, rhs], [out]) = self.desc.as_fixed();
        let lhs = handles.get_float_tensor::<B>(lhs);
        let rhs = handles.get_float_tensor::<B>(rhs);
        let product = B::drove_matmul(lhs, rhs, self.precision);
        handles.register_float_tensor::<B>(&out.id, product);
    }
}

impl<B: FusionBackend + MatmulOps> MatmulOps for Fusion<B> {
    fn drove_matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        precision: Precision,
    ) -> FloatTensor<Self> {
        let streams = OperationStreams::with_inputs([&lhs, &rhs]);
        let client = lhs.client.clone();
        // burn's own matmul IR gives the output's shape (batch broadcast) and type.
        let ir = MatmulOpIr::create(lhs.into_ir(), rhs.into_ir(), || client.create_empty_handle());
        let desc = CustomOpIr::new("drove_matmul", &[ir.lhs, ir.rhs], &[ir.out]);
        let operation = DroveMatmul::<B> { desc: desc.clone(), precision, _backend: PhantomData };
        client.register(streams, OperationIr::Custom(desc), operation).output()
    }
}
