//! How much host memory simulating a model takes, and how much the host has: a run that would
//! not fit is refused before it starts, naming both, instead of being killed by the operating
//! system halfway.
//!
//! The estimate adds what a run keeps in host memory: device memory's pages (the weights, and in
//! full mode every feature-map byte a kernel writes), the model's input and output buffers on
//! the device and their host copies, and in full mode the cores' local buffers. The limit is
//! the memory the host can still give (`MemAvailable`, or the control group's remaining
//! allowance when that is smaller), or a limit the caller sets.

use gearsim_isa::om::ModelDesc;
use gearsim_sim::{ChipConfig, ExecMode};

/// Bytes of host memory a run needs besides the model's data: the program, its allocator and
/// trace buffers (an allowance, measured at about 40 MB for the demo models).
const PROCESS_BYTES: u64 = 64 << 20;

/// A run's host memory, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Weights copied into device memory.
    pub weights: u64,
    /// Feature maps written by the kernels (full mode; a timing-only run computes none).
    pub feature_maps: u64,
    /// The inputs and outputs: their device buffers and host copies.
    pub inputs_outputs: u64,
    /// The AI cores' local buffers (full mode).
    pub core_buffers: u64,
    /// The program itself.
    pub process: u64,
}

impl Estimate {
    /// The whole estimate.
    pub fn total(&self) -> u64 {
        self.weights + self.feature_maps + self.inputs_outputs + self.core_buffers + self.process
    }
}

/// The host memory a run of the model `desc` describes takes on chip `cfg` in `mode`.
pub fn estimate(desc: &ModelDesc, cfg: &ChipConfig, mode: ExecMode) -> Estimate {
    let m = &desc.memory;
    let full = mode == ExecMode::Full;
    Estimate {
        weights: m.weight_bytes,
        feature_maps: if full { m.feature_map_bytes } else { 0 },
        inputs_outputs: 2 * (m.input_bytes + m.output_bytes),
        core_buffers: if full {
            gearsim_sim::local_buffer_bytes(cfg)
        } else {
            0
        },
        process: PROCESS_BYTES,
    }
}

/// The host memory a run may use: `(bytes, where the figure comes from)`, or `None` when the
/// host does not say.
pub fn available() -> Option<(u64, String)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mut best = meminfo
        .as_deref()
        .and_then(mem_available)
        .map(|b| (b, "MemAvailable in /proc/meminfo".to_string()));
    if let Some(room) = cgroup_room()
        && best.as_ref().is_none_or(|(b, _)| room < *b)
    {
        best = Some((
            room,
            "the control group's memory.max less memory.current".into(),
        ));
    }
    best
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the control group (v2) still allows, when it sets a limit.
fn cgroup_room() -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?;
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Parses a size of at least one byte ([`crate::study::advise::parse_bytes`]: a whole number
/// with an optional K, M or G suffix), for a command-line flag.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match crate::study::advise::parse_bytes(s) {
        Some(b) if b > 0 => Ok(b),
        _ => Err(format!(
            "expected a size of at least one byte such as 8G, 512M or 1073741824 (K, M, G: \
             powers of 1024), got `{s}`"
        )),
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Refuses a run whose estimate exceeds `limit` (`(bytes, source)`): the message names the
/// estimate by part, the limit and its source, and what to do (`raise`: how the caller's user
/// sets another limit, if they can).
pub fn check(
    e: &Estimate,
    mode: ExecMode,
    limit: &(u64, String),
    raise: Option<&str>,
) -> Result<(), String> {
    let (bytes, source) = limit;
    if e.total() <= *bytes {
        return Ok(());
    }
    let mode_name = if mode == ExecMode::Full {
        "full mode"
    } else {
        "timing-only mode"
    };
    Err(format!(
        "simulating this model in {mode_name} needs about {} of host memory (weights {}, feature \
         maps {}, inputs and outputs {}, AI core buffers {}, the program {}), more than the {} \
         it may use ({source}); run a smaller batch{}{}",
        gib(e.total()),
        gib(e.weights),
        gib(e.feature_maps),
        gib(e.inputs_outputs),
        gib(e.core_buffers),
        gib(e.process),
        gib(*bytes),
        if mode == ExecMode::Full {
            " or timing-only"
        } else {
            ""
        },
        raise.map_or(String::new(), |r| format!(
            ", or set {r} if the figure is wrong"
        ))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_bad_ones_are_named() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("3 K"), Ok(3072));
        for bad in ["", "G", "12X", "-3M", "0", "1.5k"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }

    #[test]
    fn mem_available_is_read_in_kib() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(mem_available(text), Some(2000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn a_run_over_the_limit_is_refused_naming_the_estimate_and_the_limit() {
        let e = Estimate {
            weights: 1 << 30,
            feature_maps: 40 << 30,
            inputs_outputs: 2 << 30,
            core_buffers: 1 << 26,
            process: PROCESS_BYTES,
        };
        let limit = (16u64 << 30, "MemAvailable in /proc/meminfo".to_string());
        let msg = check(&e, ExecMode::Full, &limit, Some("--host_memory_limit")).unwrap_err();
        for part in [
            "about 43.12 GiB",
            "feature maps 40.00 GiB",
            "16.00 GiB",
            "MemAvailable",
            "timing-only",
            "set --host_memory_limit",
        ] {
            assert!(msg.contains(part), "`{part}` missing from: {msg}");
        }
        assert!(check(&e, ExecMode::Full, &(e.total(), String::new()), None).is_ok());
    }
}
