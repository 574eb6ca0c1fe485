//! The file writer replaces its destination only with a finished trace.

use gearsim_traces::{LaneKind, TraceError, TraceFile, TraceFileWriter, TraceSink};

use crate::{dir_listing, lane, scratch_dir, span};

fn fill(w: &mut TraceFileWriter, n: u64) {
    let l = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
    let name = w.intern("vmul");
    for i in 0..n {
        w.record(span(l, name, i * 4, i * 4 + 2));
    }
}

#[test]
fn dropping_without_finish_leaves_the_destination_intact() {
    let dir = scratch_dir("file_writer_drop");
    let dest = dir.join("run.gtrace");
    std::fs::write(&dest, "previous run").unwrap();
    let mut w = TraceFileWriter::create(&dest).unwrap();
    assert_eq!(w.dest(), dest);
    // Enough records that some reached the temporary file.
    fill(&mut w, 100_000);
    let temp = w.temp_path().to_path_buf();
    assert!(temp.exists());
    assert!(
        temp.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("run.gtrace.tmp-")
    );
    drop(w);
    assert!(!temp.exists());
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "previous run");
    assert_eq!(dir_listing(&dir), vec!["run.gtrace"]);
}

#[test]
fn finish_replaces_the_destination() {
    let dir = scratch_dir("file_writer_finish");
    let dest = dir.join("run.gtrace");
    std::fs::write(&dest, "previous run").unwrap();
    let mut w = TraceFileWriter::create(&dest).unwrap();
    fill(&mut w, 10);
    assert_eq!(w.record_count(), 10);
    w.finish().unwrap();
    assert_eq!(dir_listing(&dir), vec!["run.gtrace"]);
    let trace = TraceFile::open(&dest).unwrap();
    assert_eq!(trace.records().count(), 10);
}

#[test]
fn failed_finish_leaves_the_destination_intact_and_no_temporary_file() {
    let dir = scratch_dir("file_writer_fail");
    // A directory cannot be replaced by a file, so the final rename fails.
    let dest = dir.join("run.gtrace");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("inside"), "keep me").unwrap();
    let mut w = TraceFileWriter::create(&dest).unwrap();
    fill(&mut w, 10);
    match w.finish() {
        Err(TraceError::Rename { from, to, .. }) => {
            assert_eq!(to, dest);
            assert!(!from.exists());
        }
        other => panic!("expected a rename error, got {other:?}"),
    }
    assert_eq!(dir_listing(&dir), vec!["run.gtrace"]);
    assert_eq!(
        std::fs::read_to_string(dest.join("inside")).unwrap(),
        "keep me"
    );
}

#[test]
fn creating_in_a_missing_directory_fails_cleanly() {
    let dir = scratch_dir("file_writer_missing");
    match TraceFileWriter::create(dir.join("no/such/dir/run.gtrace")) {
        Err(TraceError::Io {
            action: "create", ..
        }) => {}
        other => panic!("expected an Io error, got {other:?}"),
    }
    assert!(dir_listing(&dir).is_empty());
}
