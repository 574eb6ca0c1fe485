//! The 64-bit checksum shared by gearsim's binary formats (`.gtrace`, `.om`): fast (one
//! multiply per 8 bytes), incremental, and sensitive to every single-bit change.
//!
//! The bytes are read as little-endian 64-bit words, the last one zero-padded;
//! `h = CHECKSUM_SEED`, then for every word `h = (h ^ w).wrapping_mul(CHECKSUM_PRIME)
//! .rotate_left(29)`, and finally `h ^= total byte count`.

/// The checksum's starting value (the 64-bit FNV offset basis).
pub const CHECKSUM_SEED: u64 = 0xcbf2_9ce4_8422_2325;
/// The checksum's multiplier (the 64-bit FNV prime).
pub const CHECKSUM_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut c = Checksum::new();
    c.update(bytes);
    c.finish()
}

/// The checksum computed incrementally over bytes that arrive in pieces of any size.
#[derive(Debug, Clone)]
pub struct Checksum {
    h: u64,
    pending: [u8; 8],
    pending_len: usize,
    total: u64,
}

impl Checksum {
    /// A checksum over no bytes yet.
    pub fn new() -> Checksum {
        Checksum {
            h: CHECKSUM_SEED,
            pending: [0; 8],
            pending_len: 0,
            total: 0,
        }
    }

    #[inline]
    fn step(h: u64, word: u64) -> u64 {
        (h ^ word).wrapping_mul(CHECKSUM_PRIME).rotate_left(29)
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.total = self.total.wrapping_add(bytes.len() as u64);
        if self.pending_len > 0 {
            let take = (8 - self.pending_len).min(bytes.len());
            let (head, tail) = bytes.split_at(take);
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(head);
            self.pending_len += take;
            bytes = tail;
            if self.pending_len < 8 {
                return;
            }
            self.h = Self::step(self.h, u64::from_le_bytes(self.pending));
            self.pending_len = 0;
        }
        let mut h = self.h;
        let mut words = bytes.chunks_exact(8);
        for chunk in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            h = Self::step(h, u64::from_le_bytes(word));
        }
        self.h = h;
        let rest = words.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// The checksum of everything fed so far.
    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        if self.pending_len > 0 {
            let mut word = [0u8; 8];
            word[..self.pending_len].copy_from_slice(&self.pending[..self.pending_len]);
            h = Self::step(h, u64::from_le_bytes(word));
        }
        h ^ self.total
    }
}

impl Default for Checksum {
    fn default() -> Checksum {
        Checksum::new()
    }
}
