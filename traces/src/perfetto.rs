//! Export to the Chrome / Perfetto JSON trace format, streamed straight from a [`TraceFile`].
//!
//! The output is one JSON object, `{"displayTimeUnit":"ns","metadata":{..},"traceEvents":[..]}`,
//! with one event per line. Each distinct lane process name becomes a pid (numbered from 1 in
//! order of first appearance in the lane table) and each lane a tid (lane index + 1); metadata
//! events name them and keep tracks in lane order. Times are microseconds printed exactly from
//! integer picoseconds (`1234567` ps is `1.234567`).

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::atomic::TempFile;
use crate::view::{Event, Filter, View};
use crate::{TraceError, TraceFile};

/// Writes `trace` as Chrome / Perfetto JSON to `out`, streaming (the JSON is never held in
/// memory as a whole). The output depends only on the trace's contents.
pub fn export_perfetto(trace: &TraceFile, out: &mut impl Write) -> io::Result<()> {
    export_perfetto_filtered(trace, Filter::all(), out)
}

/// [`export_perfetto`] of what `filter` shows (see [`View`]).
pub fn export_perfetto_filtered(
    trace: &TraceFile,
    filter: Filter,
    out: &mut impl Write,
) -> io::Result<()> {
    let view = View::new(trace, filter);
    let mut w = Events {
        w: BufWriter::with_capacity(1 << 16, out),
        first: true,
    };
    w.w.write_all(b"{\"displayTimeUnit\":\"ns\",\"metadata\":{")?;
    for (i, (key, value)) in trace.meta().into_iter().enumerate() {
        if i > 0 {
            w.w.write_all(b",")?;
        }
        json_str(&mut w.w, key)?;
        w.w.write_all(b":")?;
        json_str(&mut w.w, value)?;
    }
    w.w.write_all(b"},\"traceEvents\":[")?;

    // Track names and order.
    let lanes = &view.lanes;
    let mut pid_of_process: HashMap<&str, u32> = HashMap::new();
    let mut pids = Vec::with_capacity(lanes.len());
    for (index, lane) in lanes.iter().enumerate() {
        let next = u32::try_from(pid_of_process.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let pid = *pid_of_process.entry(lane.process.as_str()).or_insert(next);
        if pid == next {
            let o = w.begin()?;
            write!(
                o,
                "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":"
            )?;
            json_str(o, &lane.process)?;
            o.write_all(b"}}")?;
            let o = w.begin()?;
            write!(
                o,
                "{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{pid},\
                 \"args\":{{\"sort_index\":{}}}}}",
                pid - 1
            )?;
        }
        pids.push(pid);
        let tid = index + 1;
        let o = w.begin()?;
        write!(
            o,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\
             \"args\":{{\"name\":"
        )?;
        json_str(o, &lane.thread)?;
        o.write_all(b"}}")?;
        let o = w.begin()?;
        write!(
            o,
            "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\
             \"args\":{{\"sort_index\":{index}}}}}"
        )?;
    }
    // View lanes are always in range; the fallback only keeps this total.
    let pid = |lane: usize| pids.get(lane).copied().unwrap_or(0);
    let tid = |lane: usize| lane + 1;

    view.for_each(|event| -> io::Result<()> {
        match event {
            Event::Span {
                lane,
                name,
                cat,
                start,
                end,
                pc,
                detail,
            } => {
                let o = w.begin()?;
                o.write_all(b"{\"name\":")?;
                json_str(o, &name)?;
                o.write_all(b",\"cat\":")?;
                json_str(o, &cat)?;
                o.write_all(b",\"ph\":\"X\",\"ts\":")?;
                micros(o, start)?;
                o.write_all(b",\"dur\":")?;
                micros(o, end.saturating_sub(start))?;
                write!(
                    o,
                    ",\"pid\":{},\"tid\":{},\"args\":{{",
                    pid(lane),
                    tid(lane)
                )?;
                if let Some(pc) = pc {
                    write!(o, "\"pc\":{pc}")?;
                    detail_arg(o, detail)?;
                }
                o.write_all(b"}}")?;
            }
            Event::Instant {
                lane,
                name,
                cat,
                at,
                arg,
                detail,
            } => {
                let o = w.begin()?;
                o.write_all(b"{\"name\":")?;
                json_str(o, name)?;
                write!(o, ",\"cat\":\"{cat}\",\"ph\":\"i\",\"s\":\"t\",\"ts\":")?;
                micros(o, at)?;
                write!(
                    o,
                    ",\"pid\":{},\"tid\":{},\"args\":{{\"arg\":{arg}",
                    pid(lane),
                    tid(lane)
                )?;
                detail_arg(o, detail)?;
                o.write_all(b"}}")?;
            }
            Event::Counter {
                lane,
                name,
                at,
                value,
            } => {
                let o = w.begin()?;
                o.write_all(b"{\"name\":")?;
                json_str(o, &name)?;
                o.write_all(b",\"ph\":\"C\",\"ts\":")?;
                micros(o, at)?;
                write!(
                    o,
                    ",\"pid\":{},\"tid\":{},\"args\":{{",
                    pid(lane),
                    tid(lane)
                )?;
                json_str(o, &name)?;
                write!(o, ":{value}}}}}")?;
            }
            Event::Flow { name, id, from, to } => {
                for (ph, (lane, at)) in [("s", from), ("f", to)] {
                    let o = w.begin()?;
                    o.write_all(b"{\"name\":")?;
                    json_str(o, name)?;
                    write!(o, ",\"cat\":\"flow\",\"ph\":\"{ph}\",")?;
                    if ph == "f" {
                        o.write_all(b"\"bp\":\"e\",")?;
                    }
                    write!(o, "\"id\":{id},\"ts\":")?;
                    micros(o, at)?;
                    write!(o, ",\"pid\":{},\"tid\":{}}}", pid(lane), tid(lane))?;
                }
            }
        }
        Ok(())
    })?;
    w.w.write_all(b"\n]}\n")?;
    w.w.flush()
}

/// Exports `trace` to the file `dest` through a temporary file that is renamed into place only
/// when complete; on error nothing is left behind and an existing `dest` is untouched.
pub fn export_perfetto_file(trace: &TraceFile, dest: &Path) -> Result<(), TraceError> {
    export_perfetto_file_filtered(trace, Filter::all(), dest)
}

/// [`export_perfetto_file`] of what `filter` shows.
pub fn export_perfetto_file_filtered(
    trace: &TraceFile,
    filter: Filter,
    dest: &Path,
) -> Result<(), TraceError> {
    let (temp, file) = TempFile::create(dest)?;
    let mut out = &file;
    export_perfetto_filtered(trace, filter, &mut out).map_err(|source| TraceError::Io {
        path: temp.path().to_path_buf(),
        action: "write",
        source,
    })?;
    temp.sync(file)?;
    Ok(temp.persist()?)
}

/// The event array being written: handles the separators between events.
struct Events<W: Write> {
    w: W,
    first: bool,
}

impl<W: Write> Events<W> {
    /// Starts the next event on its own line and returns the writer to put it on.
    fn begin(&mut self) -> io::Result<&mut W> {
        self.w.write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        Ok(&mut self.w)
    }
}

/// Writes picoseconds as exact microseconds: `<ps / 10^6>.<ps % 10^6, six digits>`.
fn micros(w: &mut impl Write, ps: u64) -> io::Result<()> {
    write!(w, "{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// Writes `,"detail":"…"` unless the detail is empty.
fn detail_arg(w: &mut impl Write, detail: &str) -> io::Result<()> {
    if detail.is_empty() {
        return Ok(());
    }
    w.write_all(b",\"detail\":")?;
    json_str(w, detail)
}

/// Writes `s` as a JSON string literal: quotes and backslashes escaped, control characters as
/// `\u00XX`, everything else (valid UTF-8 already) as is.
fn json_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(b"\"")?;
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'"' && b != b'\\' && b >= 0x20 {
            continue;
        }
        w.write_all(&bytes[start..i])?;
        match b {
            b'"' => w.write_all(b"\\\"")?,
            b'\\' => w.write_all(b"\\\\")?,
            _ => write!(w, "\\u{b:04x}")?,
        }
        start = i + 1;
    }
    w.write_all(&bytes[start..])?;
    w.write_all(b"\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(s: &str) -> String {
        let mut v = Vec::new();
        json_str(&mut v, s).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn escapes() {
        assert_eq!(esc("plain"), "\"plain\"");
        assert_eq!(esc("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(esc("\n\u{1}\u{1f}"), "\"\\u000a\\u0001\\u001f\"");
        assert_eq!(esc("é→"), "\"é→\"");
    }

    #[test]
    fn micros_are_exact() {
        let m = |ps| {
            let mut v = Vec::new();
            micros(&mut v, ps).unwrap();
            String::from_utf8(v).unwrap()
        };
        assert_eq!(m(0), "0.000000");
        assert_eq!(m(1), "0.000001");
        assert_eq!(m(1_234_567), "1.234567");
        assert_eq!(m(u64::MAX), "18446744073709.551615");
    }
}
