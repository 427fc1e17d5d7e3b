//! The SeedSequence hash of NumPy (`numpy.random.SeedSequence`), bit for bit.
//!
//! Choosing NumPy's algorithm rather than inventing one means a derived state can be
//! reproduced from Python with `SeedSequence(np.array(words, dtype=np.uint32))`
//! `.generate_state(n)`; the tests pin values produced by NumPy.

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
/// Number of 32-bit words in the entropy pool (NumPy's default).
pub const POOL_SIZE: usize = 4;

#[inline]
fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

#[inline]
fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L.wrapping_mul(x).wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// Mixes every entropy word into a pool of [`POOL_SIZE`] words, so that each word of
/// the input affects every word of the pool.
pub fn pool(entropy: &[u32]) -> [u32; POOL_SIZE] {
    let mut mixer = [0u32; POOL_SIZE];
    let mut hash_const = INIT_A;
    for (i, slot) in mixer.iter_mut().enumerate() {
        *slot = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hash_const);
    }
    for i_src in 0..POOL_SIZE {
        for i_dst in 0..POOL_SIZE {
            if i_src != i_dst {
                let h = hashmix(mixer[i_src], &mut hash_const);
                mixer[i_dst] = mix(mixer[i_dst], h);
            }
        }
    }
    for &word in entropy.iter().skip(POOL_SIZE) {
        for slot in mixer.iter_mut() {
            let h = hashmix(word, &mut hash_const);
            *slot = mix(*slot, h);
        }
    }
    mixer
}

/// Expands a pool into `N` words of generator state (NumPy's `generate_state`).
pub fn generate_state<const N: usize>(pool: &[u32; POOL_SIZE]) -> [u32; N] {
    let mut out = [0u32; N];
    let mut hash_const = INIT_B;
    for (i, slot) in out.iter_mut().enumerate() {
        let mut v = pool[i % POOL_SIZE] ^ hash_const;
        hash_const = hash_const.wrapping_mul(MULT_B);
        v = v.wrapping_mul(hash_const);
        *slot = v ^ (v >> XSHIFT);
    }
    out
}
