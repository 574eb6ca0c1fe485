//! Parameter studies: sweeps of independent simulations, run in parallel on the host's cores,
//! shardable over a cluster, written as CSV and an SVG figure.
//!
//! ```text
//!  sweep points ──shard I/N (every N-th from I)──▶ parallel_map (all cores, scoped threads)
//!      ──▶ rows in point order ──▶ NAME.csv (atomic) + NAME.svg (atomic) + summary on stdout
//! ```
//!
//! Every point is its own simulated device, so the rows do not depend on the thread count or
//! on which shard ran them; concatenating the shards' CSVs (one header) gives the rows of the
//! whole sweep, and sorting them by their `point` column gives its CSV exactly (host timings
//! aside). [`gears`] is the gear study (`gearsim study gears`); [`svg`] draws its figure.
//! [`advise`] is the gear-set advisor (`gearsim study advise`), which measures its candidates
//! the same way, in parallel; [`batch`] times networks over batch sizes (`gearsim study
//! batch`).

pub mod advise;
pub mod batch;
pub mod gears;
pub mod svg;
mod timeline;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why a study could not run or write its results.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The sweep as asked for is not valid (a bad `--shard`, an empty axis, a gear count past
    /// the chip's MapIndex limit).
    #[error("{0}")]
    Options(String),
    /// A point's model did not compile.
    #[error("point {point} ({what}): compile: {message}")]
    Compile {
        /// The point.
        point: usize,
        /// Its parameters.
        what: String,
        /// The compiler's error.
        message: String,
    },
    /// A point's model could not be loaded or run.
    #[error("point {point} ({what}): run: {message}")]
    Run {
        /// The point.
        point: usize,
        /// Its parameters.
        what: String,
        /// The runtime's error.
        message: String,
    },
    /// A point ran but its result is wrong or its trace lacks a task the study measures.
    #[error("point {point} ({what}): {message}")]
    Check {
        /// The point.
        point: usize,
        /// Its parameters.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// The output files could not be written.
    #[error("{0}")]
    Io(String),
}

/// Which part of a sweep this process runs: the points `p` with `p % count == index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, `0 <= index < count`.
    pub index: usize,
    /// Shards in all.
    pub count: usize,
}

impl Shard {
    /// The whole sweep.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` (`--shard 3/16`; a Slurm array passes `$SLURM_ARRAY_TASK_ID/16`).
    pub fn parse(text: &str) -> Result<Shard, StudyError> {
        let bad = || {
            StudyError::Options(format!(
                "--shard `{text}`: expected I/N with 0 <= I < N, e.g. 3/16"
            ))
        };
        let (i, n) = text.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether point `point` of the sweep belongs to this shard.
    pub fn takes(&self, point: usize) -> bool {
        point % self.count == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The host's core count (1 when it cannot be told).
pub fn host_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `f` applied to every item on `threads` scoped threads; the results come back in item order
/// whatever the thread count, and `done` sees each result as it is finished (for progress).
/// Threads take the next unstarted item, so long and short items balance themselves.
pub fn parallel_map<T, R, F, D>(items: &[T], threads: usize, f: F, done: D) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
    D: Fn(usize, &R) + Sync,
{
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let worker = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return;
            };
            let r = f(item);
            done(i, &r);
            // A poisoned lock means another worker panicked; its panic is re-raised when the
            // scope joins it, so this worker's result may as well be stored.
            let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
            slots[i] = Some(r);
        }
    };
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(worker);
        }
    });
    slots
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect()
}
