//! The `.gtrace` writer: a [`TraceSink`] that streams records to any seekable byte sink, and a
//! file variant that only replaces its destination once the trace is complete. The file
//! variant checksums and writes its record buffers on a thread of its own, so a simulation
//! that traces every instruction does not wait on the file system.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;

use zerocopy::IntoBytes;

use crate::atomic::TempFile;
use crate::format::{
    Checksum, FLAG_COMPLETE, HEADER_SIZE, LANE_ENTRY_SIZE, MAX_LANES, META_ENTRY_SIZE, RECORD_SIZE,
    RawHeader, RawLane, RawMeta, RawRecord,
};
use crate::{Lane, LaneId, LaneKind, Level, Record, StrId, TraceError, TraceSink};

/// Records are collected in memory until this many bytes are pending, then written in one go.
const FLUSH_AT: usize = 1 << 18;
/// Full record buffers a writer thread may have queued before the producer waits for it
/// (with the one being filled and the one being written, at most 6 × 256 KiB in memory).
const QUEUED_BUFFERS: usize = 4;

/// The string table's hasher: a multiply-rotate over 8-byte words (the Fx hash). Interning
/// hashes every instruction's text when a kernel is loaded under an instruction-level trace,
/// where SipHash was a tenth of the run; ids follow first use, so the hash never shows in a
/// trace, and a local tool's own strings need no flooding resistance.
#[derive(Debug, Default, Clone, Copy)]
struct BuildWordHasher;

impl std::hash::BuildHasher for BuildWordHasher {
    type Hasher = WordHasher;
    fn build_hasher(&self) -> WordHasher {
        WordHasher(0)
    }
}

#[derive(Debug)]
struct WordHasher(u64);

impl WordHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl std::hash::Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.add(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Writes a `.gtrace` trace to `W`.
///
/// [`TraceWriter::new`] writes a placeholder header (without the "complete" flag) at the
/// writer's current position; records then stream out through an internal buffer, and
/// [`TraceWriter::finish`] appends the lane, metadata and string tables and rewrites the header.
/// Strings and lanes are kept in memory (they are few); records are not.
///
/// The [`TraceSink`] methods cannot return errors, so the first I/O error (or format limit hit)
/// is stored, later output is dropped, and [`TraceWriter::finish`] returns that error.
pub struct TraceWriter<W: Write + Seek> {
    /// The output with its checksum, or the thread that owns them while records stream
    /// ([`TraceWriter::off_thread`]).
    out: Output<W>,
    /// The file name used in error messages.
    name: PathBuf,
    /// Stream position of the header (all offsets in the file are relative to it).
    base: u64,
    /// Encoded body bytes not yet handed to `out`.
    buf: Vec<u8>,
    /// Body bytes handed to `out` so far.
    written: u64,
    record_count: u64,
    /// String lookup; the order of ids lives in `string_table`.
    strings: HashMap<Box<str>, StrId, BuildWordHasher>,
    /// The encoded string table (length-prefixed strings in id order).
    string_table: Vec<u8>,
    string_count: u32,
    lanes: Vec<RawLane>,
    lane_ids: HashMap<(StrId, StrId, LaneKind), LaneId>,
    meta: Vec<RawMeta>,
    meta_index: HashMap<StrId, usize>,
    error: Option<TraceError>,
    /// What producers are asked to record.
    level: Level,
    /// The format minor version the lanes so far need.
    minor: u16,
}

impl<W: Write + Seek> std::fmt::Debug for TraceWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("name", &self.name)
            .field("records", &self.record_count)
            .field("strings", &self.string_count)
            .field("lanes", &self.lanes.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<W: Write + Seek> TraceWriter<W> {
    /// Starts a trace at `out`'s current position by writing a placeholder header.
    pub fn new(out: W) -> Result<TraceWriter<W>, TraceError> {
        TraceWriter::with_name(out, PathBuf::from("<stream>"))
    }

    /// Like [`TraceWriter::new`], naming the output `name` in error messages.
    pub(crate) fn with_name(mut out: W, name: PathBuf) -> Result<TraceWriter<W>, TraceError> {
        let io_err = |action, source| TraceError::Io {
            path: name.clone(),
            action,
            source,
        };
        let base = out.stream_position().map_err(|e| io_err("seek in", e))?;
        out.write_all(RawHeader::placeholder().as_bytes())
            .map_err(|e| io_err("write", e))?;
        let mut w = TraceWriter {
            out: Output::Here(Body::new(out)),
            name: name.clone(),
            base,
            buf: Vec::with_capacity(FLUSH_AT + RECORD_SIZE as usize),
            written: 0,
            record_count: 0,
            strings: HashMap::default(),
            string_table: Vec::new(),
            string_count: 0,
            lanes: Vec::new(),
            lane_ids: HashMap::new(),
            meta: Vec::new(),
            meta_index: HashMap::new(),
            error: None,
            level: Level::Instruction,
            minor: 0,
        };
        // String 0 is always the empty string.
        w.add_string("");
        Ok(w)
    }

    /// Hands the output to a thread of its own, which checksums and writes each full record
    /// buffer while the producer goes on; the bytes, and the errors `finish` returns, are
    /// those of writing in place. If no thread can be started, the writer stays as it was.
    pub fn off_thread(mut self) -> TraceWriter<W>
    where
        W: Send + 'static,
    {
        self.out = match std::mem::replace(&mut self.out, Output::Gone) {
            Output::Here(body) => match Background::start(body) {
                Ok(background) => Output::Thread(background),
                Err(body) => Output::Here(body),
            },
            other => other,
        };
        self
    }

    /// Records written so far.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Asks producers to record at `level` (the default is [`Level::Instruction`]: everything)
    /// and notes a task or kernel level in the metadata as `trace_level` (no note means
    /// instruction level, as in every trace written before levels existed).
    pub fn set_level(&mut self, level: Level) {
        self.level = level;
        if level != Level::Instruction {
            self.meta("trace_level", level.name());
        }
    }

    /// Strings interned so far (including the empty string).
    pub fn string_count(&self) -> u32 {
        self.string_count
    }

    /// Lanes registered so far.
    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// Writes the lane, metadata and string tables, then the final header with the "complete"
    /// flag, and returns the output positioned at the end of the trace.
    ///
    /// Returns the first error met while tracing, if any; the output then holds an unfinished
    /// trace that readers reject.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush_buf();
        self.bring_back();
        let lanes_offset = u64::from(HEADER_SIZE) + self.record_count * u64::from(RECORD_SIZE);
        let lane_count = self.lanes.len();
        let meta_offset = lanes_offset + lane_count as u64 * u64::from(LANE_ENTRY_SIZE);
        let meta_count = self.meta.len();
        let strings_offset = meta_offset + meta_count as u64 * u64::from(META_ENTRY_SIZE);
        let strings_bytes = self.string_table.len() as u64;
        let file_size = strings_offset + strings_bytes;

        let lanes = std::mem::take(&mut self.lanes);
        self.emit(lanes.as_bytes());
        let meta = std::mem::take(&mut self.meta);
        self.emit(meta.as_bytes());
        let string_table = std::mem::take(&mut self.string_table);
        self.emit(&string_table);

        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.written + u64::from(HEADER_SIZE) != file_size {
            // This would be a bug in this module, but report it rather than write a bad file.
            return Err(self.io_error(
                "finish",
                std::io::Error::other(format!(
                    "internal error: expected {file_size} bytes written, found {}",
                    self.written + u64::from(HEADER_SIZE)
                )),
            ));
        }
        let (Ok(lane_count), Ok(meta_count)) =
            (u32::try_from(lane_count), u32::try_from(meta_count))
        else {
            return Err(TraceError::Limit {
                path: self.name.clone(),
                what: format!("{lane_count} lanes or {meta_count} metadata entries exceed u32"),
            });
        };

        let Output::Here(body) = std::mem::replace(&mut self.out, Output::Gone) else {
            return Err(self.io_error("write", lost_writer()));
        };
        let mut header = RawHeader::placeholder();
        header.flags = FLAG_COMPLETE.into();
        header.record_count = self.record_count.into();
        header.lanes_offset = lanes_offset.into();
        header.lane_count = lane_count.into();
        header.meta_count = meta_count.into();
        header.meta_offset = meta_offset.into();
        header.strings_offset = strings_offset.into();
        header.string_count = self.string_count.into();
        header.strings_bytes = strings_bytes.into();
        header.file_size = file_size.into();
        header.checksum = body.checksum.finish().into();
        header.version_minor = self.minor.into();
        header.seal();

        let mut out = body.out;
        let result = (|| {
            out.flush().map_err(|e| ("write", e))?;
            out.seek(SeekFrom::Start(self.base))
                .map_err(|e| ("seek in", e))?;
            out.write_all(header.as_bytes()).map_err(|e| ("write", e))?;
            out.seek(SeekFrom::Start(self.base + file_size))
                .map_err(|e| ("seek in", e))?;
            out.flush().map_err(|e| ("write", e))
        })();
        match result {
            Ok(()) => Ok(out),
            Err((action, source)) => Err(self.io_error(action, source)),
        }
    }

    /// Takes the output back from its thread once the thread has written everything queued,
    /// with the checksum it kept and the first error it met.
    fn bring_back(&mut self) {
        self.out = match std::mem::replace(&mut self.out, Output::Gone) {
            Output::Thread(mut background) => match background.join() {
                Some(mut body) => {
                    if let Some(source) = body.error.take() {
                        let e = self.io_error("write", source);
                        self.fail(e);
                    }
                    Output::Here(body)
                }
                None => {
                    let e = self.io_error("write", lost_writer());
                    self.fail(e);
                    Output::Gone
                }
            },
            other => other,
        };
    }

    fn io_error(&self, action: &'static str, source: std::io::Error) -> TraceError {
        TraceError::Io {
            path: self.name.clone(),
            action,
            source,
        }
    }

    /// Remembers the first error; everything after it is dropped.
    fn fail(&mut self, e: TraceError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    fn limit(&mut self, what: String) {
        self.fail(TraceError::Limit {
            path: self.name.clone(),
            what,
        });
    }

    /// Hands body bytes to the output, updating the checksum.
    fn emit(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            let failed = match &mut self.out {
                Output::Here(body) => {
                    body.put(bytes);
                    body.error.take()
                }
                Output::Thread(_) | Output::Gone => Some(lost_writer()),
            };
            if let Some(source) = failed {
                let e = self.io_error("write", source);
                self.fail(e);
            }
        }
        self.written += bytes.len() as u64;
    }

    /// Writes out the pending record buffer, or queues it for the writer thread (which
    /// hands back an empty one to fill next).
    fn flush_buf(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if let Output::Thread(background) = &mut self.out {
            self.written += buf.len() as u64;
            self.buf = if self.error.is_none() {
                background.write(buf)
            } else {
                buf
            };
        } else {
            self.emit(&buf);
            self.buf = buf;
        }
        self.buf.clear();
    }

    fn add_string(&mut self, s: &str) -> StrId {
        let Ok(len) = u32::try_from(s.len()) else {
            self.limit(format!(
                "string of {} bytes exceeds the format's limit of {} bytes",
                s.len(),
                u32::MAX
            ));
            return StrId::EMPTY;
        };
        if self.string_count == u32::MAX {
            self.limit(format!("more than {} distinct strings", u32::MAX - 1));
            return StrId::EMPTY;
        }
        let id = StrId(self.string_count);
        self.string_count += 1;
        self.string_table.extend_from_slice(&len.to_le_bytes());
        self.string_table.extend_from_slice(s.as_bytes());
        self.strings.insert(s.into(), id);
        id
    }

    /// Debug builds check each record the way the reader will; a failure is a producer bug.
    fn debug_check(&self, record: &Record) {
        if cfg!(debug_assertions) {
            let check = RawRecord::encode(record).decode(self.lanes.len(), self.string_count);
            debug_assert!(check.is_ok(), "invalid trace record {record:?}: {check:?}");
        }
    }
}

impl<W: Write + Seek> TraceSink for TraceWriter<W> {
    fn intern(&mut self, s: &str) -> StrId {
        match self.strings.get(s) {
            Some(&id) => id,
            None => self.add_string(s),
        }
    }

    fn lane(&mut self, lane: Lane) -> LaneId {
        let process = self.intern(&lane.process);
        let thread = self.intern(&lane.thread);
        let key = (process, thread, lane.kind);
        if let Some(&id) = self.lane_ids.get(&key) {
            return id;
        }
        let Ok(id) = u16::try_from(self.lanes.len()) else {
            self.limit(format!("more than {MAX_LANES} lanes"));
            return LaneId(u16::MAX);
        };
        self.minor = self.minor.max(lane.kind.since_minor());
        self.lanes.push(RawLane {
            process: process.0.into(),
            thread: thread.0.into(),
            kind: (lane.kind as u16).into(),
            reserved: 0.into(),
        });
        self.lane_ids.insert(key, LaneId(id));
        LaneId(id)
    }

    #[inline]
    fn record(&mut self, record: Record) {
        self.debug_check(&record);
        self.buf
            .extend_from_slice(RawRecord::encode(&record).as_bytes());
        self.record_count += 1;
        if self.buf.len() >= FLUSH_AT {
            self.flush_buf();
        }
    }

    fn meta(&mut self, key: &str, value: &str) {
        let key = self.intern(key);
        let value = self.intern(value);
        match self.meta_index.get(&key) {
            Some(&i) => self.meta[i].value = value.0.into(),
            None => {
                self.meta_index.insert(key, self.meta.len());
                self.meta.push(RawMeta {
                    key: key.0.into(),
                    value: value.0.into(),
                });
            }
        }
    }

    fn level(&self) -> Level {
        self.level
    }
}

/// Where a [`TraceWriter`]'s body bytes go.
enum Output<W> {
    /// Written by the producer's thread.
    Here(Body<W>),
    /// Owned by a writer thread until `finish` takes it back.
    Thread(Background<W>),
    /// Only while moving between the two (or after the writer thread was lost).
    Gone,
}

/// The output, the checksum over every body byte handed to it, and the first error it met
/// (after which nothing more is written): the in-place writer's, or its thread's.
struct Body<W> {
    out: W,
    checksum: Checksum,
    error: Option<std::io::Error>,
}

impl<W: Write> Body<W> {
    fn new(out: W) -> Body<W> {
        Body {
            out,
            checksum: Checksum::new(),
            error: None,
        }
    }

    /// Checksums and writes `bytes`, unless a write has failed.
    fn put(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            self.checksum.update(bytes);
            if let Err(e) = self.out.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }
}

/// A writer thread: full record buffers go to it in order, and come back empty for reuse.
struct Background<W> {
    full: Option<SyncSender<Vec<u8>>>,
    /// Behind a lock only so that a writer can be shared between threads (as a Python
    /// session's is); one thread uses it.
    empty: Mutex<Receiver<Vec<u8>>>,
    thread: Option<JoinHandle<Option<Body<W>>>>,
}

impl<W: Write + Send + 'static> Background<W> {
    /// Starts the thread with the output and its checksum so far; gives them back if the
    /// thread cannot be started.
    fn start(body: Body<W>) -> Result<Background<W>, Body<W>> {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(QUEUED_BUFFERS);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel();
        // The output is handed over once the thread runs, so a failed spawn leaves it here.
        let (give, given) = std::sync::mpsc::sync_channel::<Body<W>>(1);
        let spawned = std::thread::Builder::new()
            .name("trace writer".into())
            .spawn(move || {
                let mut body = given.recv().ok()?;
                for mut buf in full_rx {
                    body.put(&buf);
                    buf.clear();
                    // The producer may have stopped taking buffers back; that is fine.
                    let _ = empty_tx.send(buf);
                }
                Some(body)
            });
        let Ok(thread) = spawned else {
            return Err(body);
        };
        // The thread waits for this; a send fails only if it has gone, and then gives it back.
        if let Err(std::sync::mpsc::SendError(back)) = give.send(body) {
            let _ = thread.join();
            return Err(back);
        }
        Ok(Background {
            full: Some(full_tx),
            empty: Mutex::new(empty_rx),
            thread: Some(thread),
        })
    }
}

impl<W> Background<W> {
    /// Queues a full buffer (waiting while the thread is `QUEUED_BUFFERS` behind) and returns
    /// an empty one: one the thread has written, or a new one.
    fn write(&mut self, buf: Vec<u8>) -> Vec<u8> {
        if let Some(full) = &self.full {
            // A send fails only when the thread has ended early; `join` then reports it.
            let _ = full.send(buf);
        }
        let written = self.empty.get_mut().map(|empty| empty.try_recv());
        match written {
            Ok(Ok(buf)) => buf,
            Ok(Err(TryRecvError::Empty | TryRecvError::Disconnected)) | Err(_) => {
                Vec::with_capacity(FLUSH_AT + RECORD_SIZE as usize)
            }
        }
    }

    /// Ends the stream and waits for the thread to write what is queued; `None` if the thread
    /// was lost (it panicked, which its loop cannot do, or never got the output).
    fn join(&mut self) -> Option<Body<W>> {
        self.full = None;
        self.thread.take()?.join().ok()?
    }
}

impl<W> Drop for Background<W> {
    /// A writer dropped without `finish` still waits for its thread, so the output is closed
    /// before anything (a temporary file's removal) follows.
    fn drop(&mut self) {
        self.full = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The error `finish` reports when the writer thread did not give the output back.
fn lost_writer() -> std::io::Error {
    std::io::Error::other("the trace writer thread ended without giving the file back")
}

/// Writes a `.gtrace` file through a temporary file next to the destination.
///
/// The destination is replaced (by a rename) only when [`TraceFileWriter::finish`] succeeds.
/// If the writer is dropped without `finish`, or `finish` fails, the temporary file is removed
/// and an existing destination file is left as it was.
#[derive(Debug)]
pub struct TraceFileWriter {
    // Field order matters: the file handle inside `writer` closes before `temp` removes the file.
    writer: TraceWriter<File>,
    temp: TempFile,
}

impl TraceFileWriter {
    /// Starts a trace that will end up at `dest`.
    pub fn create(dest: impl AsRef<Path>) -> Result<TraceFileWriter, TraceError> {
        let (temp, file) = TempFile::create(dest.as_ref())?;
        let writer = TraceWriter::with_name(file, temp.path().to_path_buf())?.off_thread();
        Ok(TraceFileWriter { writer, temp })
    }

    /// Where the trace will be once finished.
    pub fn dest(&self) -> &Path {
        self.temp.dest()
    }

    /// The temporary file being written (it disappears on drop or after `finish`).
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    /// Records written so far.
    pub fn record_count(&self) -> u64 {
        self.writer.record_count()
    }

    /// Asks producers to record at `level`; see [`TraceWriter::set_level`].
    pub fn set_level(&mut self, level: Level) {
        self.writer.set_level(level);
    }

    /// Completes the trace, syncs it to disk and renames it over the destination.
    pub fn finish(self) -> Result<(), TraceError> {
        let TraceFileWriter { writer, temp } = self;
        let file = writer.finish()?;
        temp.sync(file)?;
        Ok(temp.persist()?)
    }
}

impl TraceSink for TraceFileWriter {
    fn intern(&mut self, s: &str) -> StrId {
        self.writer.intern(s)
    }

    fn lane(&mut self, lane: Lane) -> LaneId {
        self.writer.lane(lane)
    }

    #[inline]
    fn record(&mut self, record: Record) {
        self.writer.record(record);
    }

    fn meta(&mut self, key: &str, value: &str) {
        self.writer.meta(key, value);
    }

    fn level(&self) -> Level {
        self.writer.level
    }
}
