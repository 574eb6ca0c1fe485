//! A trace sink that keeps only what a study measures: every task's span on its stream, with
//! the extent of the AI core pipe spans and AI CPU spans that ran inside it.
//!
//! A full `.gtrace` of every instruction of every core would be written and read back only to
//! find a handful of task boundaries, so the study takes the records as they are produced. The
//! scheduler records a task's stream span when the task ends, after the spans of the work it
//! did, so the sink buffers pipe and AI CPU spans until the next stream span and attributes
//! those inside that span's window to it. Memory stays bounded by one task's spans.

use std::collections::HashMap;

use gearsim_traces::{Lane, LaneId, LaneKind, Record, StrId, TraceSink};

/// One task as its stream saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskSpan {
    /// Start (ps): when the stream began the task, launch overhead included.
    pub start: u64,
    /// End (ps).
    pub end: u64,
    /// The task's name (`ascend_mbatch_shape_mapindex`, `memcpy_h2d gear dims`, ...).
    pub name: String,
    /// First start and last end of the AI core pipe spans inside the task (its kernel's run).
    pub cores: Option<(u64, u64)>,
    /// First start and last end of the AI CPU spans inside the task (launch included).
    pub aicpu: Option<(u64, u64)>,
}

/// The sink.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    strings: Vec<String>,
    ids: HashMap<String, StrId>,
    lanes: Vec<LaneKind>,
    lane_ids: HashMap<Lane, LaneId>,
    pipe: Vec<(u64, u64)>,
    aicpu: Vec<(u64, u64)>,
    /// Every task, in the order the tasks ended.
    pub tasks: Vec<TaskSpan>,
}

/// The first start and last end of the spans inside `[start, end]`.
fn extent(spans: &[(u64, u64)], start: u64, end: u64) -> Option<(u64, u64)> {
    let inside = spans.iter().filter(|(s, e)| *s >= start && *e <= end);
    let first = inside.clone().map(|(s, _)| *s).min()?;
    let last = inside.map(|(_, e)| *e).max()?;
    Some((first, last))
}

/// The task name in a stream span's detail, `stream S task I: KIND NAME`.
fn task_name(detail: &str) -> &str {
    let after = detail.split_once(": ").map_or(detail, |(_, rest)| rest);
    after.split_once(' ').map_or("", |(_, name)| name)
}

impl Timeline {
    fn kind(&self, lane: LaneId) -> Option<LaneKind> {
        self.lanes.get(usize::from(lane.0)).copied()
    }

    fn text(&self, id: StrId) -> &str {
        self.strings.get(id.0 as usize).map_or("", String::as_str)
    }
}

impl TraceSink for Timeline {
    fn intern(&mut self, s: &str) -> StrId {
        if self.strings.is_empty() {
            self.strings.push(String::new());
            self.ids.insert(String::new(), StrId::EMPTY);
        }
        if let Some(id) = self.ids.get(s) {
            return *id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.to_string());
        self.ids.insert(s.to_string(), id);
        id
    }

    fn lane(&mut self, lane: Lane) -> LaneId {
        if let Some(id) = self.lane_ids.get(&lane) {
            return *id;
        }
        let id = LaneId(self.lanes.len() as u16);
        self.lanes.push(lane.kind);
        self.lane_ids.insert(lane, id);
        id
    }

    fn record(&mut self, record: Record) {
        let Record::Span {
            lane,
            start,
            end,
            detail,
            ..
        } = record
        else {
            return;
        };
        match self.kind(lane) {
            Some(LaneKind::Pipe) => self.pipe.push((start, end)),
            Some(LaneKind::AiCpu) => self.aicpu.push((start, end)),
            Some(LaneKind::Stream) => {
                let span = TaskSpan {
                    start,
                    end,
                    name: task_name(self.text(detail)).to_string(),
                    cores: extent(&self.pipe, start, end),
                    aicpu: extent(&self.aicpu, start, end),
                };
                self.pipe.clear();
                self.aicpu.clear();
                self.tasks.push(span);
            }
            _ => {}
        }
    }

    fn meta(&mut self, _key: &str, _value: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_come_from_the_detail() {
        assert_eq!(
            task_name("stream 1 task 0: AiCoreKernel ascend_mbatch_shape_mapindex"),
            "ascend_mbatch_shape_mapindex"
        );
        assert_eq!(
            task_name("stream 0 task 1: Memcpy memcpy_h2d gear dims"),
            "memcpy_h2d gear dims"
        );
        assert_eq!(task_name("stream 0 task 1: Memcpy"), "");
    }

    #[test]
    fn work_inside_a_task_is_attributed_to_it() {
        let mut t = Timeline::default();
        let core = t.lane(Lane {
            process: "core0".into(),
            thread: "SCALAR".into(),
            kind: LaneKind::Pipe,
        });
        let stream = t.lane(Lane {
            process: "streams".into(),
            thread: "stream 1".into(),
            kind: LaneKind::Stream,
        });
        let name = t.intern("AiCoreKernel");
        let detail = t.intern("stream 1 task 0: AiCoreKernel k");
        for (s, e) in [(5, 9), (120, 130), (150, 170)] {
            t.record(Record::Span {
                lane: core,
                name,
                start: s,
                end: e,
                pc: 0,
                detail: StrId::EMPTY,
            });
        }
        t.record(Record::Span {
            lane: stream,
            name,
            start: 100,
            end: 200,
            pc: 0,
            detail,
        });
        assert_eq!(t.tasks.len(), 1);
        assert_eq!(t.tasks[0].name, "k");
        // The span at 5..9 belongs to an earlier task and is not counted.
        assert_eq!(t.tasks[0].cores, Some((120, 170)));
        assert_eq!(t.tasks[0].aicpu, None);
    }
}
