//! Typed time: the global [`Tick`] (picoseconds) and per-domain [`Cycles`], with explicit,
//! documented conversions through a [`Clock`].

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// Global simulation time in picoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tick(pub u64);

/// A number of cycles of one clock domain (for the AI cores: the core clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cycles(pub u64);

impl Tick {
    /// Time zero.
    pub const ZERO: Tick = Tick(0);
    /// Microseconds, for printing only.
    pub fn as_micros_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06} us", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

impl fmt::Display for Cycles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cycles", self.0)
    }
}

impl Add for Cycles {
    type Output = Cycles;
    fn add(self, rhs: Cycles) -> Cycles {
        Cycles(self.0 + rhs.0)
    }
}

impl AddAssign for Cycles {
    fn add_assign(&mut self, rhs: Cycles) {
        self.0 += rhs.0;
    }
}

impl Sub for Cycles {
    type Output = Cycles;
    /// Saturating: a duration is never negative.
    fn sub(self, rhs: Cycles) -> Cycles {
        Cycles(self.0.saturating_sub(rhs.0))
    }
}

impl Add for Tick {
    type Output = Tick;
    fn add(self, rhs: Tick) -> Tick {
        Tick(self.0 + rhs.0)
    }
}

/// A clock of `khz` kilohertz. Cycle `c` starts at tick `ceil(c * 1e9 / khz)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    khz: u64,
    /// The period in picoseconds when it is a whole number (1 GHz: 1000), which makes both
    /// conversions a single 64-bit multiply or divide.
    period_ps: Option<u64>,
}

const PS_PER_KHZ_CYCLE: u128 = 1_000_000_000; // 1 / 1 kHz = 1e9 ps

impl Clock {
    /// A clock of `mhz` megahertz.
    pub fn from_mhz(mhz: u64) -> Clock {
        let khz = mhz.max(1) * 1000;
        let period_ps = PS_PER_KHZ_CYCLE
            .is_multiple_of(u128::from(khz))
            .then(|| u64::try_from(PS_PER_KHZ_CYCLE / u128::from(khz)).unwrap_or(u64::MAX));
        Clock { khz, period_ps }
    }

    /// Frequency in hertz.
    pub fn hz(self) -> u64 {
        self.khz * 1000
    }

    /// The tick at which cycle `c` starts. Rounds up, so the tick never precedes the edge.
    pub fn tick(self, c: Cycles) -> Tick {
        if let Some(p) = self.period_ps
            && let Some(ps) = c.0.checked_mul(p)
        {
            return Tick(ps);
        }
        let ps = (u128::from(c.0) * PS_PER_KHZ_CYCLE).div_ceil(u128::from(self.khz));
        Tick(u64::try_from(ps).unwrap_or(u64::MAX))
    }

    /// The first cycle whose edge ([`Clock::tick`]) is at or after tick `t` (gem5's
    /// `clockEdge`), so `cycle_at_or_after(tick(c)) == c` for every `c`.
    pub fn cycle_at_or_after(self, t: Tick) -> Cycles {
        if let Some(p) = self.period_ps {
            return Cycles(t.0.div_ceil(p));
        }
        if t.0 == 0 {
            return Cycles(0);
        }
        // The smallest c with ceil(c * 1e9 / khz) >= t, i.e. c * 1e9 / khz > t - 1.
        let c = u128::from(t.0 - 1) * u128::from(self.khz) / PS_PER_KHZ_CYCLE + 1;
        Cycles(u64::try_from(c).unwrap_or(u64::MAX))
    }

    /// Bytes per second of a rate given in bytes per cycle (exact).
    pub fn bytes_per_second(self, bytes_per_cycle: u64) -> u64 {
        bytes_per_cycle * self.hz()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_up_and_invert() {
        for mhz in [1000, 1080, 1800, 3] {
            let clock = Clock::from_mhz(mhz);
            for c in [0u64, 1, 2, 999, 1_000_001, 123_456_789_012] {
                let t = clock.tick(Cycles(c));
                assert_eq!(
                    clock.cycle_at_or_after(t),
                    Cycles(c),
                    "{mhz} MHz, cycle {c}"
                );
                // The tick is the first picosecond at or after the exact edge.
                let exact = u128::from(c) * 1_000_000 / u128::from(mhz);
                assert!(u128::from(t.0) >= exact && u128::from(t.0) <= exact + 1);
            }
        }
        assert_eq!(Clock::from_mhz(1000).tick(Cycles(7)), Tick(7000));
        assert_eq!(Clock::from_mhz(1080).tick(Cycles(1)), Tick(926));
    }
}
