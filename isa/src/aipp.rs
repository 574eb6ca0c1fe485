//! The AI core's image pre-processing unit (AIPP) as `load_image_l1` drives it: the parameter
//! block it reads from GM and the arithmetic it applies to each pixel on the way into L1.
//!
//! On the hardware AIPP sits in MTE2: the first convolution loads its input rows from the
//! 8-bit image through it (GE fuses the `Aipp` op into that convolution), so the converted
//! feature map is never written to GM. Its parameters (colour-space conversion, channel swap,
//! mean / min / variance) are one block of [`CONFIG_BYTES`] in GM; the instruction gives the
//! geometry (rows, columns, bytes per pixel, row stride). The output is a fractal feature-map
//! layout: 16 f16 channels per pixel (32 bytes, 5HD's C0), or with atc's small-channel option
//! four (8 bytes, C04); channels past the image's are zero.
//!
//! The arithmetic is defined here once, so the compiler's reference evaluation and the
//! simulator's execution are the same code: widen the bytes, swap R and B, the integer
//! colour-space conversion (`((Σ_k m[c][k] · (x_k − in_k)) >> 8) + out_c`, clamped to 0..=255),
//! then `((y − mean) − min) · var_reci` in f32.

/// Bytes of the parameter block in GM.
pub const CONFIG_BYTES: u64 = 128;
/// Channels per pixel of the C04 output in L1.
pub const C04: u64 = 4;
/// Bytes per pixel of the C04 output (f16 channels).
pub const C04_PIXEL_BYTES: u64 = C04 * 2;

/// Channels of one pixel of one channel block in L1: 4 in the C04 layout, else 5HD's C0.
pub const fn pixel_channels(c04: bool) -> u64 {
    if c04 { C04 } else { crate::units::C0 }
}

/// Bytes of one pixel of one channel block in L1 (f16 channels): what `load_image_l1` writes
/// per pixel and `img2col_l0a` reads, by their `c04` flag.
pub const fn pixel_bytes(c04: bool) -> u64 {
    pixel_channels(c04) * 2
}

/// Colour-space conversion: `y_c = ((Σ_k matrix[c][k] · (x_k − input_bias_k)) >> 8) +
/// output_bias_c`, clamped to 0..=255.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Csc {
    /// `matrix[c][k]`: output channel `c`'s weight of input channel `k`, in 1/256.
    pub matrix: [[i32; 3]; 3],
    /// Subtracted from input channel `k` first.
    pub input_bias: [i32; 3],
    /// Added to output channel `c` last.
    pub output_bias: [i32; 3],
}

/// The parameter block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AippConfig {
    /// Channels the network sees (1 or 3).
    pub channels: u32,
    /// Byte of a source pixel that holds channel 0.
    pub first_byte: u32,
    /// R and B swapped (three channels only).
    pub swap: bool,
    /// Colour-space conversion, if on.
    pub csc: Option<Csc>,
    /// Per output channel, subtracted first (entries past `channels` unused).
    pub mean: [f32; 4],
    /// Per output channel, subtracted second.
    pub min: [f32; 4],
    /// Per output channel, the factor applied last.
    pub var_reci: [f32; 4],
}

/// Byte offsets of the block's fields (little-endian words).
mod at {
    pub const CHANNELS: usize = 0;
    pub const FIRST_BYTE: usize = 4;
    pub const SWAP: usize = 8;
    pub const CSC_ON: usize = 12;
    pub const MATRIX: usize = 16;
    pub const INPUT_BIAS: usize = 52;
    pub const OUTPUT_BIAS: usize = 64;
    pub const MEAN: usize = 76;
    pub const MIN: usize = 92;
    pub const VAR_RECI: usize = 108;
}

impl AippConfig {
    /// The block's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONFIG_BYTES as usize];
        let mut put = |off: usize, v: [u8; 4]| b[off..off + 4].copy_from_slice(&v);
        put(at::CHANNELS, self.channels.to_le_bytes());
        put(at::FIRST_BYTE, self.first_byte.to_le_bytes());
        put(at::SWAP, u32::from(self.swap).to_le_bytes());
        put(at::CSC_ON, u32::from(self.csc.is_some()).to_le_bytes());
        if let Some(m) = &self.csc {
            for (i, v) in m.matrix.iter().flatten().enumerate() {
                put(at::MATRIX + 4 * i, v.to_le_bytes());
            }
            for k in 0..3 {
                put(at::INPUT_BIAS + 4 * k, m.input_bias[k].to_le_bytes());
                put(at::OUTPUT_BIAS + 4 * k, m.output_bias[k].to_le_bytes());
            }
        }
        for c in 0..4 {
            put(at::MEAN + 4 * c, self.mean[c].to_le_bytes());
            put(at::MIN + 4 * c, self.min[c].to_le_bytes());
            put(at::VAR_RECI + 4 * c, self.var_reci[c].to_le_bytes());
        }
        b
    }

    /// The block read back, or what is wrong with it.
    pub fn from_bytes(b: &[u8]) -> Result<AippConfig, String> {
        if b.len() < CONFIG_BYTES as usize {
            return Err(format!(
                "the AIPP block has {} bytes, expected {CONFIG_BYTES}",
                b.len()
            ));
        }
        let word = |off: usize| [b[off], b[off + 1], b[off + 2], b[off + 3]];
        let u = |off: usize| u32::from_le_bytes(word(off));
        let i = |off: usize| i32::from_le_bytes(word(off));
        let f = |off: usize| f32::from_le_bytes(word(off));
        let channels = u(at::CHANNELS);
        if channels != 1 && channels != 3 {
            return Err(format!("AIPP channels {channels}, expected 1 or 3"));
        }
        let first_byte = u(at::FIRST_BYTE);
        if first_byte > 3 {
            return Err(format!("AIPP first byte {first_byte}, expected 0..=3"));
        }
        let csc = (u(at::CSC_ON) != 0).then(|| Csc {
            matrix: [0, 1, 2].map(|r| [0, 1, 2].map(|k| i(at::MATRIX + 4 * (3 * r + k)))),
            input_bias: [0, 1, 2].map(|k| i(at::INPUT_BIAS + 4 * k)),
            output_bias: [0, 1, 2].map(|k| i(at::OUTPUT_BIAS + 4 * k)),
        });
        Ok(AippConfig {
            channels,
            first_byte,
            swap: u(at::SWAP) != 0,
            csc,
            mean: [0, 1, 2, 3].map(|c| f(at::MEAN + 4 * c)),
            min: [0, 1, 2, 3].map(|c| f(at::MIN + 4 * c)),
            var_reci: [0, 1, 2, 3].map(|c| f(at::VAR_RECI + 4 * c)),
        })
    }

    /// Bytes of a source pixel the block reads (channel 0's byte and the channels after it).
    pub fn bytes_read(&self) -> u32 {
        self.first_byte + self.channels
    }

    /// Output channel `c` of a pixel whose channels (from `first_byte` on) are `x`, in f32.
    pub fn channel(&self, x: &[f32; 3], c: usize) -> f32 {
        let mut x = *x;
        if self.swap && self.channels == 3 {
            x.swap(0, 2);
        }
        let y = match &self.csc {
            None => x[c],
            Some(m) => {
                let t = |k: usize| (x[k] - m.input_bias[k] as f32) * m.matrix[c][k] as f32;
                let acc = (t(0) + t(1)) + t(2);
                ((acc * (1.0 / 256.0)).floor() + m.output_bias[c] as f32).clamp(0.0, 255.0)
            }
        };
        ((y - self.mean[c]) - self.min[c]) * self.var_reci[c]
    }

    /// The C04 output of one source pixel: its channels as f16 bits, zeros past them.
    pub fn pixel_c04(&self, pixel: &[u8]) -> [u16; 4] {
        let first = self.first_byte as usize;
        let mut x = [0f32; 3];
        for (k, v) in x.iter_mut().enumerate().take(self.channels as usize) {
            *v = f32::from(pixel[first + k]);
        }
        let mut out = [0u16; 4];
        for (c, o) in out.iter_mut().enumerate().take(self.channels as usize) {
            *o = half::f16::from_f32(self.channel(&x, c)).to_bits();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AippConfig {
        AippConfig {
            channels: 3,
            first_byte: 1,
            swap: true,
            csc: Some(Csc {
                matrix: [[256, 0, 359], [256, -88, -183], [256, 454, 0]],
                input_bias: [0, 128, 128],
                output_bias: [0, 0, 0],
            }),
            mean: [104.0, 117.0, 123.0, 0.0],
            min: [0.5, 0.25, 0.0, 0.0],
            var_reci: [0.017, 0.0175, 0.0171, 0.0],
        }
    }

    #[test]
    fn the_block_reads_back_as_written() {
        let c = sample();
        assert_eq!(AippConfig::from_bytes(&c.to_bytes()).unwrap(), c);
        let plain = AippConfig { csc: None, ..c };
        assert_eq!(AippConfig::from_bytes(&plain.to_bytes()).unwrap(), plain);
    }

    #[test]
    fn a_bad_block_is_an_error_naming_the_field() {
        let mut b = sample().to_bytes();
        b[0] = 2;
        let e = AippConfig::from_bytes(&b).unwrap_err();
        assert!(e.contains("channels 2"), "{e}");
        assert!(AippConfig::from_bytes(&b[..64]).is_err());
    }

    #[test]
    fn a_pixel_is_normalised_into_four_f16_channels() {
        let c = AippConfig {
            channels: 3,
            first_byte: 0,
            swap: false,
            csc: None,
            mean: [10.0, 20.0, 30.0, 0.0],
            min: [0.0; 4],
            var_reci: [0.5, 0.25, 2.0, 0.0],
        };
        let out = c.pixel_c04(&[20, 40, 31]);
        let f = |b: u16| half::f16::from_bits(b).to_f32();
        assert_eq!([f(out[0]), f(out[1]), f(out[2])], [5.0, 5.0, 2.0]);
        assert_eq!(out[3], 0);
    }
}
