//! Helpers shared by the crate's unit tests.

/// Seeded draws below a bound from a linear congruential generator (its high bits): the
/// same sequence on every host, for randomised tests that must be reproducible.
pub(crate) fn draws_below(seed: u32) -> impl FnMut(u32) -> u32 {
    let mut x = seed;
    move |n: u32| {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (x >> 8) % n
    }
}
