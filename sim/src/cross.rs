//! Cross-core flags of a separated chip (`CrossCoreSetFlag` / `CrossCoreWaitFlag`,
//! ascend-hardware.md §7.2): which flags have arrived at which block of a launch, when, and from
//! whom. It knows nothing of cores or time beyond the cycles it is given; the chip wakes the
//! cores whose blocks it names.
//!
//! Blocks are named by launch and kind and their block index, not by core, so a flag can arrive
//! for a block that has not started yet (it waits in the inbox). Every arrival keeps the cycle it
//! happened at; a wait completes at the later of its own start and its arrival, so the timeline
//! does not depend on the order the host happens to advance the cores in. The modes:
//! - `aiv` (mode 1): the set reaches the other vector core of the setter's AI core;
//! - `aic_aiv` (mode 2): a cube core's set reaches each of its AI core's vector cores; the cube
//!   core sees one arrival once every vector core has set, at the last set's cycle;
//! - `all` (mode 0): a barrier of the launch's blocks of one kind: each of them sees one arrival
//!   once every one has set, at the last set's cycle.
//!
//! A core holds at most `core.cross_core_max_pending` arrivals of one flag that no wait consumed:
//! arrival `k + max` must not happen before wait `k` consumed arrival `k`, checked when the
//! later of the two is processed (so whichever order the host sees them in).

use std::collections::BTreeMap;

use gearsim_isa::CrossMode;
use gearsim_traces::LaneId;

use crate::kind::CoreKind;

/// The blocks of one kernel launch, for cross-core synchronisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CrossGroup {
    /// The launch (the firmware's run number); blocks of different launches never meet.
    pub id: u32,
    /// Whether the blocks are MIX blocks: block `b`'s cube core and its vector cores (vector
    /// blocks `v·b` to `v·b + v − 1`) run together.
    pub mix: bool,
    /// Blocks on cube cores.
    pub cube_blocks: u32,
    /// Blocks on vector cores.
    pub vector_blocks: u32,
    /// Vector cores per AI core (`core.vector_cores_per_core`).
    pub vectors_per_core: u32,
}

impl CrossGroup {
    /// A launch on a coupled chip, or of one kind only with no partner: no MIX pairing.
    pub const fn solo(id: u32, kind: CoreKind, blocks: u32) -> CrossGroup {
        let (cube_blocks, vector_blocks) = match kind {
            CoreKind::Vector => (0, blocks),
            CoreKind::Coupled | CoreKind::Cube => (blocks, 0),
        };
        CrossGroup {
            id,
            mix: false,
            cube_blocks,
            vector_blocks,
            vectors_per_core: 0,
        }
    }
}

/// One block of a launch: its kind and its block index among the blocks of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Member {
    pub kind: CoreKind,
    pub index: u32,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} block {}", self.kind.short_name(), self.index)
    }
}

/// One arrival of a flag at a block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    /// Cycle of the set (the last one, for a collected arrival).
    pub at: u64,
    /// Core and pc of that set.
    pub setter: u32,
    pub pc: u32,
    /// The setter's trace lane (for the flow), when tracing.
    pub lane: Option<LaneId>,
}

#[derive(Debug, Default)]
struct Inbox {
    arrivals: Vec<Arrival>,
    /// Cycle at which each consumed arrival was consumed, in order.
    consumed: Vec<u64>,
}

/// Sets waiting for the other members of a barrier (mode `all`) or of an AI core's vector
/// cores (mode `aic_aiv` towards the cube core).
#[derive(Debug)]
struct Collector {
    per_source: Vec<Vec<Arrival>>,
    produced: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Collect {
    /// Mode `all` over the launch's blocks of one kind.
    All(CoreKind),
    /// Mode `aic_aiv` towards cube block `b`.
    Cube(u32),
}

/// A set that breaks the rules, or an overflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CrossError {
    /// The mode cannot be used from this block.
    Mode(String),
    /// A block held more arrivals than it can.
    Overflow(Overflow),
}

/// A block held more arrivals of a flag than it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overflow {
    /// The core and pc of the set that overflowed.
    pub setter: u32,
    pub pc: u32,
    /// The block it was for.
    pub target: Member,
    /// The most a flag holds.
    pub max: u32,
}

impl Overflow {
    pub(crate) fn stop_reason(&self) -> crate::stop::StopReason {
        crate::stop::StopReason::CrossFlagOverflow {
            core: self.setter,
            pc: self.pc,
            target: self.target.to_string(),
            max: self.max,
        }
    }
}

/// Cross-core flag state of the whole chip.
#[derive(Debug, Default)]
pub(crate) struct CrossCore {
    max_pending: u32,
    inbox: BTreeMap<(u32, Member, u8), Inbox>,
    collectors: BTreeMap<(u32, Collect, u8), Collector>,
    /// Blocks that received an arrival since the chip last looked.
    pub woken: Vec<(u32, Member)>,
}

impl CrossCore {
    pub(crate) fn new(max_pending: u32) -> CrossCore {
        CrossCore {
            max_pending,
            ..CrossCore::default()
        }
    }

    /// Block `me` of `group` sets flag `id` in `mode` at cycle `arrival.at`.
    pub(crate) fn set(
        &mut self,
        group: &CrossGroup,
        me: Member,
        mode: CrossMode,
        id: u8,
        arrival: Arrival,
    ) -> Result<(), CrossError> {
        let v = group.vectors_per_core;
        match (mode, me.kind) {
            (_, CoreKind::Coupled) => Err(CrossError::Mode(
                "a coupled core has no cross-core flags".into(),
            )),
            (CrossMode::Aiv, CoreKind::Cube) => Err(CrossError::Mode(
                "mode aiv connects the two vector cores of an AI core; a cube core sets with \
                 mode aic_aiv or all"
                    .into(),
            )),
            (CrossMode::Aiv | CrossMode::AicAiv, _) if !group.mix => {
                Err(CrossError::Mode(format!(
                    "mode {mode} connects the cores of one AI core, which only a MIX kernel runs \
                 together; this kernel runs on {} cores alone",
                    me.kind.short_name()
                )))
            }
            (CrossMode::Aiv, CoreKind::Vector) => {
                if v != 2 {
                    return Err(CrossError::Mode(format!(
                        "mode aiv needs two vector cores per AI core (this chip has {v})"
                    )));
                }
                let sibling = Member {
                    kind: CoreKind::Vector,
                    index: me.index ^ 1,
                };
                self.deliver(group.id, sibling, id, arrival)
            }
            (CrossMode::AicAiv, CoreKind::Cube) => {
                for s in 0..v {
                    let target = Member {
                        kind: CoreKind::Vector,
                        index: me.index * v + s,
                    };
                    self.deliver(group.id, target, id, arrival)?;
                }
                Ok(())
            }
            (CrossMode::AicAiv, CoreKind::Vector) => {
                let (cube, source) = (me.index / v, me.index % v);
                let targets = [Member {
                    kind: CoreKind::Cube,
                    index: cube,
                }];
                self.collect(
                    group.id,
                    Collect::Cube(cube),
                    v,
                    source,
                    id,
                    arrival,
                    &targets,
                )
            }
            (CrossMode::All, kind) => {
                let n = match kind {
                    CoreKind::Vector => group.vector_blocks,
                    CoreKind::Cube | CoreKind::Coupled => group.cube_blocks,
                };
                let targets: Vec<Member> = (0..n).map(|index| Member { kind, index }).collect();
                self.collect(
                    group.id,
                    Collect::All(kind),
                    n,
                    me.index,
                    id,
                    arrival,
                    &targets,
                )
            }
        }
    }

    /// Adds a set from `source` (of `n`) to a collector; once every source has set as often as
    /// the arrivals produced so far plus one, one arrival goes to each target.
    #[allow(clippy::too_many_arguments)]
    fn collect(
        &mut self,
        group: u32,
        what: Collect,
        n: u32,
        source: u32,
        id: u8,
        arrival: Arrival,
        targets: &[Member],
    ) -> Result<(), CrossError> {
        let c = self
            .collectors
            .entry((group, what, id))
            .or_insert_with(|| Collector {
                per_source: vec![Vec::new(); n as usize],
                produced: 0,
            });
        let Some(list) = c.per_source.get_mut(source as usize) else {
            return Err(CrossError::Mode(format!(
                "block {source} is outside the launch's {n} blocks of its kind"
            )));
        };
        list.push(arrival);
        let mut ready = Vec::new();
        while c.per_source.iter().all(|l| l.len() > c.produced) {
            let k = c.produced;
            let last = c
                .per_source
                .iter()
                .map(|l| l[k])
                .max_by_key(|a| (a.at, a.setter))
                .unwrap_or(arrival);
            ready.push(last);
            c.produced += 1;
        }
        for a in ready {
            for &t in targets {
                self.deliver(group, t, id, a)?;
            }
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        group: u32,
        target: Member,
        id: u8,
        arrival: Arrival,
    ) -> Result<(), CrossError> {
        let max = self.max_pending as usize;
        let inbox = self.inbox.entry((group, target, id)).or_default();
        let k = inbox.arrivals.len();
        // Arrival k overflows if arrival k - max was still unconsumed when it came.
        if k >= max
            && let Some(&c) = inbox.consumed.get(k - max)
            && c > arrival.at
        {
            return Err(CrossError::Overflow(Overflow {
                setter: arrival.setter,
                pc: arrival.pc,
                target,
                max: self.max_pending,
            }));
        }
        inbox.arrivals.push(arrival);
        self.woken.push((group, target));
        Ok(())
    }

    /// Block `me` of launch `group` waits for flag `id` from cycle `since`: the next arrival and
    /// the cycle the wait completes at, or `None` if none has arrived yet.
    pub(crate) fn take(
        &mut self,
        group: u32,
        me: Member,
        id: u8,
        since: u64,
    ) -> Result<Option<(u64, Arrival)>, CrossError> {
        let max = self.max_pending as usize;
        let Some(inbox) = self.inbox.get_mut(&(group, me, id)) else {
            return Ok(None);
        };
        let c = inbox.consumed.len();
        let Some(&arrival) = inbox.arrivals.get(c) else {
            return Ok(None);
        };
        let at = since.max(arrival.at);
        // An arrival already recorded max places later came before this consumption.
        if let Some(late) = inbox.arrivals.get(c + max)
            && late.at < at
        {
            return Err(CrossError::Overflow(Overflow {
                setter: late.setter,
                pc: late.pc,
                target: me,
                max: self.max_pending,
            }));
        }
        inbox.consumed.push(at);
        Ok(Some((at, arrival)))
    }

    /// Forgets a finished launch; an arrival that came while `max` earlier ones were never
    /// consumed is an overflow the waits could not see.
    pub(crate) fn release(&mut self, group: u32) -> Result<(), Overflow> {
        let max = self.max_pending as usize;
        let overflow = self
            .inbox
            .iter()
            .filter(|(k, _)| k.0 == group)
            .find_map(|(k, inbox)| {
                let late = inbox.arrivals.get(inbox.consumed.len() + max)?;
                Some(Overflow {
                    setter: late.setter,
                    pc: late.pc,
                    target: k.1,
                    max: self.max_pending,
                })
            });
        self.inbox.retain(|k, _| k.0 != group);
        self.collectors.retain(|k, _| k.0 != group);
        self.woken.retain(|w| w.0 != group);
        overflow.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(n: u32) -> CrossGroup {
        CrossGroup {
            id: 7,
            mix: true,
            cube_blocks: n,
            vector_blocks: 2 * n,
            vectors_per_core: 2,
        }
    }

    fn at(cycle: u64, setter: u32) -> Arrival {
        Arrival {
            at: cycle,
            setter,
            pc: 0,
            lane: None,
        }
    }

    const AIC0: Member = Member {
        kind: CoreKind::Cube,
        index: 0,
    };

    fn aiv(index: u32) -> Member {
        Member {
            kind: CoreKind::Vector,
            index,
        }
    }

    #[test]
    fn a_cube_core_sees_its_vector_cores_flag_once_both_have_set_it() {
        let g = mix(1);
        let mut x = CrossCore::new(15);
        x.set(&g, aiv(1), CrossMode::AicAiv, 3, at(500, 2)).unwrap();
        assert_eq!(x.take(7, AIC0, 3, 0).unwrap().map(|t| t.0), None);
        x.set(&g, aiv(0), CrossMode::AicAiv, 3, at(200, 1)).unwrap();
        // The arrival is the later set's, whatever order they were processed in.
        let (when, from) = x.take(7, AIC0, 3, 100).unwrap().unwrap();
        assert_eq!((when, from.setter), (500, 2));
        // The cube core's set reaches both vector cores.
        x.set(&g, AIC0, CrossMode::AicAiv, 4, at(900, 0)).unwrap();
        assert_eq!(x.take(7, aiv(0), 4, 1000).unwrap().unwrap().0, 1000);
        assert_eq!(x.take(7, aiv(1), 4, 10).unwrap().unwrap().0, 900);
        assert_eq!(x.take(7, aiv(1), 4, 10).unwrap().map(|t| t.0), None);
    }

    #[test]
    fn a_barrier_releases_every_member_at_the_last_set() {
        let g = CrossGroup::solo(1, CoreKind::Vector, 3);
        let mut x = CrossCore::new(15);
        for (i, c) in [(0, 30), (2, 10)] {
            x.set(&g, aiv(i), CrossMode::All, 0, at(c, i)).unwrap();
        }
        assert!(x.take(1, aiv(0), 0, 0).unwrap().is_none());
        x.set(&g, aiv(1), CrossMode::All, 0, at(20, 1)).unwrap();
        for i in 0..3 {
            assert_eq!(x.take(1, aiv(i), 0, 0).unwrap().unwrap().0, 30);
        }
    }

    #[test]
    fn the_sixteenth_pending_arrival_overflows_in_either_processing_order() {
        let g = mix(1);
        // Sets first: the waiter consumes arrival 0 at cycle 100, after arrival 15 came at 16.
        let mut x = CrossCore::new(15);
        for k in 0..16 {
            x.set(&g, aiv(0), CrossMode::Aiv, 1, at(k + 1, 1)).unwrap();
        }
        assert!(matches!(
            x.take(7, aiv(1), 1, 100),
            Err(CrossError::Overflow(Overflow { max: 15, .. }))
        ));
        // Wait first: consumed at cycle 1, so later sets find room.
        let mut x = CrossCore::new(15);
        x.set(&g, aiv(0), CrossMode::Aiv, 1, at(1, 1)).unwrap();
        x.take(7, aiv(1), 1, 0).unwrap().unwrap();
        for k in 1..16 {
            x.set(&g, aiv(0), CrossMode::Aiv, 1, at(k + 1, 1)).unwrap();
        }
        // Sixteen sets and no wait: the launch's end finds the overflow.
        let mut x = CrossCore::new(15);
        for k in 0..16 {
            x.set(&g, aiv(0), CrossMode::Aiv, 1, at(k + 1, 1)).unwrap();
        }
        assert!(matches!(x.release(7), Err(Overflow { .. })));
        // The same sixteen sets with the consumption late, seen in this order.
        let mut x = CrossCore::new(15);
        x.set(&g, aiv(0), CrossMode::Aiv, 1, at(1, 1)).unwrap();
        x.take(7, aiv(1), 1, 100).unwrap().unwrap();
        for k in 1..15 {
            x.set(&g, aiv(0), CrossMode::Aiv, 1, at(k + 1, 1)).unwrap();
        }
        assert!(matches!(
            x.set(&g, aiv(0), CrossMode::Aiv, 1, at(16, 1)),
            Err(CrossError::Overflow(_))
        ));
    }

    #[test]
    fn modes_that_need_a_mix_kernel_or_a_vector_core_are_refused_elsewhere() {
        let mut x = CrossCore::new(15);
        let solo = CrossGroup::solo(1, CoreKind::Vector, 2);
        assert!(matches!(
            x.set(&solo, aiv(0), CrossMode::Aiv, 0, at(1, 0)),
            Err(CrossError::Mode(_))
        ));
        assert!(matches!(
            x.set(&mix(1), AIC0, CrossMode::Aiv, 0, at(1, 0)),
            Err(CrossError::Mode(_))
        ));
    }
}
