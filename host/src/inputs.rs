//! Inputs made up for a run without input files, as msame and ais_bench make them: every data
//! input zero-filled (or seeded random) at the shape a chosen gear gives it — `--dymBatch N`,
//! `--dymHW H,W`, `--dymDims name:d,d;name2:...` in ais_bench's spelling.

use anyhow::{Result, bail};
use gearsim_isa::numeric::{self, CastMode, Scalar};
use gearsim_isa::om::ModelDesc;
use gearsim_isa::tensor::{DataType, Tensor};

use crate::runtime::session::{data_inputs, io_type};

/// Which shapes to make the inputs at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GearChoice {
    /// A model without gears: its static shapes.
    #[default]
    Static,
    /// ais_bench's `--dymBatch N`: every `-1` axis is N.
    Batch(i64),
    /// `--dymHW H,W`: the two `-1` axes of each image input are H and W.
    Hw(i64, i64),
    /// `--dymDims name:d0,d1,...;name2:...`: each named input's whole shape.
    Dims(Vec<(String, Vec<i64>)>),
}

impl GearChoice {
    /// Parses ais_bench's `--dymDims` value (`name:1,3,224,224;name2:1,10`).
    pub fn parse_dims(s: &str) -> Result<GearChoice> {
        let mut out = Vec::new();
        for part in s.split(';').filter(|p| !p.trim().is_empty()) {
            let Some((name, dims)) = part.rsplit_once(':') else {
                bail!("--dymDims: expected name:d0,d1,... for each input, got `{part}`");
            };
            let dims =
                dims.split(',')
                    .map(|d| {
                        d.trim().parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                        anyhow::anyhow!(
                            "--dymDims: `{}` of input `{name}` is not a dimension (expected a \
                             non-negative integer)",
                            d.trim()
                        )
                    })
                    })
                    .collect::<Result<Vec<i64>>>()?;
            out.push((name.trim().to_string(), dims));
        }
        if out.is_empty() {
            bail!("--dymDims: no input given (expected name:d0,d1,...;name2:...)");
        }
        Ok(GearChoice::Dims(out))
    }

    /// Parses `--dymHW`'s `H,W`.
    pub fn parse_hw(s: &str) -> Result<GearChoice> {
        let v: Vec<&str> = s.split(',').map(str::trim).collect();
        match v.as_slice() {
            [h, w] => match (h.parse::<i64>(), w.parse::<i64>()) {
                (Ok(h), Ok(w)) if h > 0 && w > 0 => Ok(GearChoice::Hw(h, w)),
                _ => bail!("--dymHW: expected two positive integers H,W, got `{s}`"),
            },
            _ => bail!("--dymHW: expected H,W, got `{s}`"),
        }
    }
}

/// What the made-up inputs hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fill {
    /// Zeros, as ais_bench's pure-inference mode.
    #[default]
    Zeros,
    /// Values from a seeded generator: floats in [-1, 1), integers in [0, 10), booleans.
    Random {
        /// The seed.
        seed: u64,
    },
}

impl Fill {
    /// Parses `zeros` or `random` (with `seed`).
    pub fn parse(s: &str, seed: u64) -> Result<Fill> {
        match s {
            "zeros" | "zero" => Ok(Fill::Zeros),
            "random" | "rand" => Ok(Fill::Random { seed }),
            _ => bail!("--input_gen: expected zeros or random, got `{s}`"),
        }
    }
}

/// splitmix64: a small generator whose sequence is fixed by the seed alone, on every platform.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In [0, 1), 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The shape of each data input of `desc` at `choice`.
pub fn shapes(desc: &ModelDesc, choice: &GearChoice) -> Result<Vec<Vec<i64>>> {
    let n = data_inputs(desc);
    let ios = &desc.inputs[..n];
    let gears = desc
        .dynamic
        .as_ref()
        .map(|d| {
            d.gears
                .iter()
                .map(|g| {
                    format!(
                        "[{}]",
                        g.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let dynamic = ios.iter().any(|io| io.dims.contains(&-1));
    match choice {
        GearChoice::Static if dynamic => bail!(
            "model `{}` has gears {gears}: choose the shapes with --dymBatch, --dymHW or --dymDims \
             (or give --input files)",
            desc.name
        ),
        GearChoice::Static => Ok(ios.iter().map(|io| io.dims.clone()).collect()),
        GearChoice::Batch(b) => {
            if desc.dynamic.as_ref().is_none_or(|d| d.mode != 1) {
                bail!(
                    "--dymBatch: model `{}` has no dynamic batch (gears: {gears})",
                    desc.name
                );
            }
            if *b <= 0 {
                bail!("--dymBatch: expected a positive batch, got {b}");
            }
            Ok(ios
                .iter()
                .map(|io| {
                    io.dims
                        .iter()
                        .map(|d| if *d == -1 { *b } else { *d })
                        .collect()
                })
                .collect())
        }
        GearChoice::Hw(h, w) => {
            if desc.dynamic.as_ref().is_none_or(|d| d.mode != 2) {
                bail!(
                    "--dymHW: model `{}` has no dynamic image size (gears: {gears})",
                    desc.name
                );
            }
            Ok(ios
                .iter()
                .map(|io| {
                    let mut k = 0;
                    io.dims
                        .iter()
                        .map(|d| {
                            if *d == -1 {
                                k += 1;
                                if k == 1 { *h } else { *w }
                            } else {
                                *d
                            }
                        })
                        .collect()
                })
                .collect())
        }
        GearChoice::Dims(given) => {
            if !dynamic {
                bail!("--dymDims: model `{}` has no dynamic dims", desc.name);
            }
            for (name, _) in given {
                if !ios.iter().any(|io| &io.name == name) {
                    bail!(
                        "--dymDims: the model has no input `{name}` (its inputs: {})",
                        ios.iter()
                            .map(|io| io.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
            ios.iter()
                .map(|io| match given.iter().find(|(n, _)| *n == io.name) {
                    Some((_, dims)) => {
                        let fits = dims.len() == io.dims.len()
                            && dims.iter().zip(&io.dims).all(|(g, m)| *m == -1 || g == m);
                        if !fits {
                            bail!(
                                "--dymDims: input `{}` is [{}] in the model, got [{}]",
                                io.name,
                                join(&io.dims),
                                join(dims)
                            );
                        }
                        Ok(dims.clone())
                    }
                    None if io.dims.contains(&-1) => bail!(
                        "--dymDims: input `{}` ([{}]) has gear axes and is not given",
                        io.name,
                        join(&io.dims)
                    ),
                    None => Ok(io.dims.clone()),
                })
                .collect()
        }
    }
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// Every data input of `desc`, made up at `choice`'s shapes and filled as `fill` says.
pub fn generate(desc: &ModelDesc, choice: &GearChoice, fill: Fill) -> Result<Vec<Tensor>> {
    let shapes = shapes(desc, choice)?;
    let mut rng = match fill {
        Fill::Zeros => None,
        Fill::Random { seed } => Some(SplitMix(seed)),
    };
    desc.inputs
        .iter()
        .zip(shapes)
        .map(|(io, dims)| {
            let dtype = io_type(io).map_err(|e| anyhow::anyhow!("{e}"))?;
            let count = dims.iter().product::<i64>().max(0) as usize;
            let data = match rng.as_mut() {
                None => vec![0u8; count * dtype.size()],
                Some(r) => random_bytes(dtype, count, r),
            };
            Tensor::new(dtype, dims, data).map_err(|e| anyhow::anyhow!("input `{}`: {e}", io.name))
        })
        .collect()
}

fn random_bytes(dtype: DataType, count: usize, r: &mut SplitMix) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let v = if dtype == DataType::Bool {
            Scalar::Int((r.next() & 1) as i128)
        } else if dtype.is_float() {
            Scalar::Float(r.unit() * 2.0 - 1.0)
        } else {
            Scalar::Int((r.next() % 10) as i128)
        };
        numeric::encode(dtype, v, CastMode::default(), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_parse_as_ais_bench_writes_them() {
        let c = GearChoice::parse_dims("x:1,3,224,224;y:4").unwrap();
        assert_eq!(
            c,
            GearChoice::Dims(vec![
                ("x".into(), vec![1, 3, 224, 224]),
                ("y".into(), vec![4])
            ])
        );
        assert!(GearChoice::parse_dims("x1,3").is_err());
        assert!(
            GearChoice::parse_dims("x:1,a")
                .unwrap_err()
                .to_string()
                .contains("`a`")
        );
        assert_eq!(
            GearChoice::parse_hw("224, 448").unwrap(),
            GearChoice::Hw(224, 448)
        );
        assert!(GearChoice::parse_hw("224").is_err());
    }

    #[test]
    fn the_generator_is_fixed_by_its_seed() {
        let mut a = SplitMix(7);
        let mut b = SplitMix(7);
        let xs: Vec<u64> = (0..4).map(|_| a.next()).collect();
        assert_eq!(xs, (0..4).map(|_| b.next()).collect::<Vec<_>>());
        assert_ne!(xs[0], SplitMix(8).next());
    }
}
