//! [`ElasticDevice`]: a device communicator that follows an elastic run's
//! worlds. NCCL cannot change a communicator's members, so each generation
//! of the run (drove-comm's `Elastic` worlds) gets a new one: the old one is
//! aborted (never finalized: its peers may be gone), the new world's rank 0
//! creates a new unique id, and every member joins with a fresh device.

use drove_collective::{Collective, Place};

use crate::comm::{DeviceComm, DeviceOptions, Error};
use crate::device::{Device, GpuLibraryError};

/// Makes the device of one world: given this member's place in it (NCCL:
/// `|_| Nccl::new(local_rank)`, the same GPU in every world).
pub type MakeDevice<D> = Box<dyn FnMut(Place) -> Result<D, GpuLibraryError> + Send>;

/// The device communicator of an elastic member: one [`DeviceComm`] per
/// generation, made when the member first asks for that generation's.
///
/// ```no_run
/// # use drove_collective::Collective;
/// # use drove_nccl::{DeviceOptions, ElasticDevice, LoopbackWorld};
/// # fn run(mesh: &dyn Collective, generation: u64) -> Result<(), drove_nccl::Error> {
/// # let mut devices = LoopbackWorld::new(1).1;
/// let mut device = ElasticDevice::new(Box::new(move |_| Ok(devices.pop().unwrap())), DeviceOptions::default());
/// // every step: the communicator of the world the mesh is in now
/// let comm = device.comm_for(mesh, generation)?;
/// # let _ = comm; Ok(()) }
/// ```
pub struct ElasticDevice<D: Device> {
    make: MakeDevice<D>,
    opts: DeviceOptions,
    current: Option<(u64, DeviceComm<D>)>,
}

impl<D: Device> ElasticDevice<D> {
    /// No communicator yet: the first [`ElasticDevice::comm_for`] makes one.
    pub fn new(make: MakeDevice<D>, opts: DeviceOptions) -> Self {
        ElasticDevice { make, opts, current: None }
    }

    /// The generation the current communicator was made for.
    pub fn generation(&self) -> Option<u64> {
        self.current.as_ref().map(|(g, _)| *g)
    }

    /// The device communicator of world `generation`, whose CPU mesh is
    /// `mesh`: the current one if it was made for that generation; else the
    /// old one is aborted and every member of `mesh` joins a new one (a
    /// collective call: every member of the world makes it at the same
    /// point). A communicator that failed to form is not kept.
    pub fn comm_for(&mut self, mesh: &dyn Collective, generation: u64) -> Result<&DeviceComm<D>, Error> {
        if self.generation() != Some(generation) {
            self.end_world();
            let place = Place::new(mesh.rank(), mesh.world_size()).map_err(|e| Error::Comm(e.into()))?;
            let device = (self.make)(place).map_err(|source| Error::Device {
                op: "device communicator: making the device".into(),
                source,
            })?;
            let comm = DeviceComm::connect(mesh, device, self.opts.clone())?;
            tracing::info!(
                generation,
                rank = place.rank().get(),
                world = place.world().get(),
                "device communicator of a new world"
            );
            self.current = Some((generation, comm));
        }
        Ok(&self.current.as_ref().expect("made above").1)
    }

    /// Aborts the current world's communicator (when the world ended: its
    /// members may be gone, so it is not finalized, which would wait for them).
    pub fn end_world(&mut self) {
        if let Some((_, comm)) = self.current.take() {
            comm.abort();
        }
    }
}
