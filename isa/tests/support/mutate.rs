//! Byte-level damage for the fuzz targets of every reader: truncation, bit flips, overwritten
//! bytes, little-endian words set to boundary values (huge lengths and counts), insertions,
//! removals and duplicated runs, applied to a valid file. Written once and included by the test
//! binaries of `isa`, `traces` and `host` with `#[path]`, together with the proptest
//! configuration every fuzz target uses (`PROPTEST_CASES` raises the case count) and a
//! wall-clock guard per case.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;

/// The proptest configuration of a fuzz target: `default_cases` cases (kept small so
/// `cargo test` stays fast) unless the `PROPTEST_CASES` environment variable asks for more, no
/// regression files written into the source tree, and a bounded shrink.
pub fn fuzz_config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default_cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

/// The longest one fuzz case may take: far above what any reader needs for the small inputs
/// the targets generate, so only a hang or a blow-up (of time, or of memory being filled)
/// trips it.
pub const CASE_LIMIT: Duration = Duration::from_secs(10);

/// Runs `f` and fails the case if it took longer than [`CASE_LIMIT`]. The check comes after
/// the call (a true hang is caught by the test harness's own timeout), which costs nothing.
pub fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(
        took <= CASE_LIMIT,
        "{what} took {took:?}, more than the {CASE_LIMIT:?} a case may take"
    );
    out
}

/// Fails unless `again` (a decoded value encoded again) is exactly `original`, naming the
/// first byte that differs instead of printing both buffers.
pub fn assert_same_bytes(again: &[u8], original: &[u8], what: &str) {
    if again != original {
        let at = again
            .iter()
            .zip(original)
            .position(|(a, b)| a != b)
            .unwrap_or(again.len().min(original.len()));
        panic!(
            "{what} decoded, but encodes to different bytes: first difference at byte {at} \
             (encoded {:02x?}, read {:02x?}); lengths {} and {}",
            again.get(at..(at + 8).min(again.len())).unwrap_or(&[]),
            original
                .get(at..(at + 8).min(original.len()))
                .unwrap_or(&[]),
            again.len(),
            original.len()
        );
    }
}

/// Values that break length and count fields: zero, one, the edges of every integer width and
/// anything at all.
pub fn boundary_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(u64::from(u32::MAX)),
        Just(1 << 40),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

/// One change to a file's bytes. Positions are [`Index`]es, scaled to the length of the bytes
/// the mutation meets.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Cut the file at this point.
    Truncate(Index),
    /// Flip one bit.
    FlipBit(Index, u8),
    /// Overwrite one byte.
    SetByte(Index, u8),
    /// Overwrite a little-endian word of 1, 2, 4 or 8 bytes (clipped at the end).
    SetWord(Index, u8, u64),
    /// Insert bytes.
    Insert(Index, Vec<u8>),
    /// Remove up to this many bytes.
    Remove(Index, usize),
    /// Repeat a run of up to this many bytes right after itself.
    Duplicate(Index, usize),
}

impl Mutation {
    /// Applies the change.
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        let at = |i: &Index| if len == 0 { 0 } else { i.index(len) };
        match self {
            Mutation::Truncate(i) => bytes.truncate(at(i)),
            Mutation::FlipBit(i, bit) => {
                if len > 0 {
                    bytes[at(i)] ^= 1 << (bit % 8);
                }
            }
            Mutation::SetByte(i, v) => {
                if len > 0 {
                    bytes[at(i)] = *v;
                }
            }
            Mutation::SetWord(i, width, v) => {
                let start = at(i);
                let width = [1usize, 2, 4, 8][usize::from(*width % 4)];
                let end = (start + width).min(len);
                bytes[start..end].copy_from_slice(&v.to_le_bytes()[..end - start]);
            }
            Mutation::Insert(i, new) => {
                let start = if len == 0 { 0 } else { i.index(len + 1) };
                bytes.splice(start..start, new.iter().copied());
            }
            Mutation::Remove(i, n) => {
                let start = at(i);
                let end = (start + n).min(len);
                bytes.drain(start..end);
            }
            Mutation::Duplicate(i, n) => {
                let start = at(i);
                let end = (start + n).min(len);
                let run = bytes[start..end].to_vec();
                bytes.splice(end..end, run);
            }
        }
    }
}

/// Any one [`Mutation`], word overwrites with [`boundary_value`]s.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::Truncate),
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
        3 => (any::<Index>(), any::<u8>(), boundary_value())
            .prop_map(|(i, w, v)| Mutation::SetWord(i, w, v)),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1..64usize).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => (any::<Index>(), 1..64usize).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

/// One to four mutations.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..5)
}

/// `seed` with `mutations` applied in order.
pub fn mutated(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for m in mutations {
        m.apply(&mut bytes);
    }
    bytes
}
