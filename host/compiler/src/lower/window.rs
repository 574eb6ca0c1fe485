//! The geometry of a window over the spatial axes (pooling): each axis's size, taps, stride,
//! dilation and padding from the node's attributes, as ONNX defines them (`auto_pad`'s pads
//! follow from the output size). Shared by the NCHW pools (`pool.rs`) and the 5HD MaxPool
//! (`pool_5hd.rs`).

use super::{LowerCtx, LowerError};
use crate::ir::TensorDesc;

/// f16 -inf, the identity of max.
pub(super) const F16_NEG_INF: i64 = 0xfc00;

/// One spatial axis of a window pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Axis {
    /// Input size.
    pub(super) size: u64,
    /// Output size.
    pub(super) out: u64,
    /// Window taps.
    pub(super) k: u64,
    /// Stride.
    pub(super) s: u64,
    /// Dilation.
    pub(super) d: u64,
    /// Padding before and after (after `auto_pad`).
    pub(super) pb: u64,
    pub(super) pe: u64,
}

impl Axis {
    /// The axis a 1-D pool does not have.
    pub(super) const UNIT: Axis = Axis {
        size: 1,
        out: 1,
        k: 1,
        s: 1,
        d: 1,
        pb: 0,
        pe: 0,
    };

    /// Dilated window extent.
    pub(super) fn ext(&self) -> u64 {
        (self.k - 1) * self.d + 1
    }

    /// Input positions of the taps of output `o` (negative or past the end in the padding).
    pub(super) fn taps(&self, o: u64) -> impl Iterator<Item = i64> + '_ {
        (0..self.k).map(move |t| (o * self.s + t * self.d) as i64 - self.pb as i64)
    }

    /// Taps of output `o` inside the input.
    pub(super) fn valid(&self, o: u64) -> u64 {
        self.taps(o)
            .filter(|&p| p >= 0 && p < self.size as i64)
            .count() as u64
    }

    /// What AveragePool divides by on this axis: the taps inside the input, or with
    /// `count_include_pad` those inside the explicit padding too (never ceil_mode's overhang).
    pub(super) fn counted(&self, o: u64, include_pad: bool) -> u64 {
        if !include_pad {
            return self.valid(o);
        }
        let (lo, hi) = (-(self.pb as i64), (self.size + self.pe) as i64);
        self.taps(o).filter(|&p| p >= lo && p < hi).count() as u64
    }
}

/// The static dims of a tensor.
pub(super) fn dims(ctx: &LowerCtx<'_>, d: &TensorDesc) -> Result<Vec<u64>, LowerError> {
    d.shape
        .iter()
        .map(|x| x.fixed().and_then(|v| u64::try_from(v).ok()))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| ctx.error(format!("shape {d} is not static")))
}

/// The stride a window axis runs with: one past the padded input (`size + pb + pe`) gives
/// the single window a stride equal to it gives (ONNX allows it), so it is taken as that and
/// no lowering plans for a huge one.
pub(super) fn effective_stride(s: u64, size: u64, pb: u64, pe: u64) -> u64 {
    s.min((size + pb + pe).max(1))
}

/// The spatial axes of a window pool from its attributes, the input dims `x` and the
/// inferred output dims `y` (auto_pad's pads follow from the output size, as in ONNX).
pub(super) fn axes(ctx: &LowerCtx<'_>, x: &[u64], y: &[u64]) -> Result<Vec<Axis>, LowerError> {
    let n = x.len() - 2;
    let list = |name: &str, default: i64, len: usize| -> Vec<i64> {
        ctx.node
            .ints(name)
            .map_or_else(|| vec![default; len], <[i64]>::to_vec)
    };
    let kernel = ctx
        .node
        .ints("kernel_shape")
        .ok_or_else(|| ctx.error("kernel_shape is missing"))?;
    let (strides, dil, pads) = (
        list("strides", 1, n),
        list("dilations", 1, n),
        list("pads", 0, 2 * n),
    );
    let mode = ctx.node.string("auto_pad").unwrap_or("NOTSET");
    let unsigned =
        |v: i64| u64::try_from(v).map_err(|_| ctx.error(format!("negative window value {v}")));
    (0..n)
        .map(|a| {
            let (k, s, d) = (
                unsigned(kernel[a])?,
                unsigned(strides[a])?,
                unsigned(dil[a])?,
            );
            let (size, out) = (x[a + 2], y[a + 2]);
            let ext = (k - 1) * d + 1;
            let (pb, pe) = match mode {
                "SAME_UPPER" | "SAME_LOWER" => {
                    let (b, e) = crate::ops::same_pads(
                        mode == "SAME_UPPER",
                        size as i64,
                        out as i64,
                        s as i64,
                        ext as i64,
                    );
                    (b as u64, e as u64)
                }
                "VALID" => (0, 0),
                _ => (unsigned(pads[a])?, unsigned(pads[a + n])?),
            };
            Ok(Axis {
                size,
                out,
                k,
                s: effective_stride(s, size, pb, pe),
                d,
                pb,
                pe,
            })
        })
        .collect()
}
