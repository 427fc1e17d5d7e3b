//! Ranks and world sizes as types: a [`WorldSize`] is at least 1, and a
//! [`Place`] is a [`Rank`] inside its world, checked once where it is made, so
//! that code given one need not check `rank < world` again.

use std::fmt;
use std::num::NonZeroUsize;

/// The number of ranks of a world: at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorldSize(NonZeroUsize);

impl WorldSize {
    /// A world of one rank.
    pub const ONE: WorldSize = WorldSize(NonZeroUsize::MIN);

    /// A world of `ranks` ranks; an error for 0.
    pub fn new(ranks: usize) -> Result<WorldSize, PlaceError> {
        NonZeroUsize::new(ranks).map(WorldSize).ok_or(PlaceError::EmptyWorld)
    }

    /// The number of ranks.
    pub fn get(self) -> usize {
        self.0.get()
    }

    /// Every rank of the world, in order.
    pub fn ranks(self) -> impl Iterator<Item = Rank> {
        (0..self.get()).map(Rank)
    }
}

impl fmt::Display for WorldSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A rank number. Alone it is only a number (a rank asked for); inside a
/// [`Place`] it is known to be below its world's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank(usize);

impl Rank {
    /// Rank 0, the root of broadcasts and the writer of checkpoints.
    pub const ZERO: Rank = Rank(0);

    /// Rank `rank`.
    pub fn new(rank: usize) -> Rank {
        Rank(rank)
    }

    /// The rank's number.
    pub fn get(self) -> usize {
        self.0
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A rank in its world: `rank < world`, checked by the constructors.
///
/// ```
/// use drove_collective::{Place, Rank, WorldSize};
///
/// let place = Place::new(2, 4)?;
/// assert_eq!((place.rank(), place.world()), (Rank::new(2), WorldSize::new(4)?));
/// assert_eq!(Place::new(4, 4).unwrap_err().to_string(), "rank 4 is out of range for world size 4");
/// assert_eq!(Place::new(0, 0).unwrap_err().to_string(), "world size must be at least 1, found 0");
/// # Ok::<(), drove_collective::PlaceError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    rank: Rank,
    world: WorldSize,
}

impl Place {
    /// Rank 0 of a world of one.
    pub const SINGLE: Place = Place { rank: Rank::ZERO, world: WorldSize::ONE };

    /// Rank `rank` of a world of `world` ranks; an error naming both if the
    /// world is empty or the rank is not below it.
    pub fn new(rank: usize, world: usize) -> Result<Place, PlaceError> {
        Place::of(Rank(rank), WorldSize::new(world)?)
    }

    /// `rank` in `world`; an error naming both if the rank is not below it.
    pub fn of(rank: Rank, world: WorldSize) -> Result<Place, PlaceError> {
        if rank.get() >= world.get() {
            return Err(PlaceError::OutOfRange { rank: rank.get(), world: world.get() });
        }
        Ok(Place { rank, world })
    }

    /// The rank.
    pub fn rank(self) -> Rank {
        self.rank
    }

    /// The world it is a rank of.
    pub fn world(self) -> WorldSize {
        self.world
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.world)
    }
}

/// A world size or a rank that cannot be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// A world of no ranks.
    #[error("world size must be at least 1, found 0")]
    EmptyWorld,
    /// A rank not below its world's size.
    #[error("rank {rank} is out of range for world size {world}")]
    OutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_a_rank_below_its_world() {
        let place = Place::new(3, 4).unwrap();
        assert_eq!((place.rank().get(), place.world().get()), (3, 4));
        assert_eq!(place.to_string(), "rank 3 of 4");
        assert_eq!(Place::new(4, 4), Err(PlaceError::OutOfRange { rank: 4, world: 4 }));
        assert_eq!(Place::new(0, 0), Err(PlaceError::EmptyWorld));
        assert_eq!(Place::SINGLE, Place::new(0, 1).unwrap());
        assert_eq!(WorldSize::new(3).unwrap().ranks().map(Rank::get).collect::<Vec<_>>(), [0, 1, 2]);
    }
}
