//! The Chrome / Perfetto JSON export: valid JSON, exact times, escaping, track layout.

use gearsim_traces::{
    LaneKind, Record, TraceFile, TraceSink, export_perfetto, export_perfetto_file,
};
use serde_json::Value;

use crate::{dir_listing, lane, sample_trace, scratch_dir, span, write_trace};

fn export(trace: &TraceFile) -> String {
    let mut out = Vec::new();
    export_perfetto(trace, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn events(json: &Value) -> &Vec<Value> {
    json["traceEvents"].as_array().unwrap()
}

fn with_ph<'a>(json: &'a Value, ph: &str) -> Vec<&'a Value> {
    events(json).iter().filter(|e| e["ph"] == ph).collect()
}

#[test]
fn sample_exports_as_expected() {
    let trace = TraceFile::from_bytes(sample_trace()).unwrap();
    let text = export(&trace);
    let json: Value = serde_json::from_str(&text).unwrap();

    assert_eq!(json["displayTimeUnit"], "ns");
    assert_eq!(json["metadata"]["chip"], "demo \"npu\"");
    assert_eq!(json["metadata"]["clock"], "1 GHz");

    // Two processes (core0, chip) and three lanes: 2 + 2 process and 2 * 3 thread M events.
    let m = with_ph(&json, "M");
    assert_eq!(m.len(), 10);
    let names = |n: &str| -> Vec<(u64, u64, String)> {
        m.iter()
            .filter(|e| e["name"] == n)
            .map(|e| {
                let arg = &e["args"];
                let v = arg.get("name").or(arg.get("sort_index")).unwrap();
                (
                    e["pid"].as_u64().unwrap(),
                    e["tid"].as_u64().unwrap_or(0),
                    v.as_str().map_or_else(|| v.to_string(), String::from),
                )
            })
            .collect()
    };
    assert_eq!(
        names("process_name"),
        vec![(1, 0, "core0".into()), (2, 0, "chip".into())]
    );
    assert_eq!(
        names("thread_name"),
        vec![
            (1, 1, "VECTOR".into()),
            (2, 2, "HBM".into()),
            (1, 3, "SCALAR".into())
        ]
    );
    assert_eq!(
        names("thread_sort_index"),
        vec![(1, 1, "0".into()), (2, 2, "1".into()), (1, 3, "2".into())]
    );

    let x = with_ph(&json, "X");
    assert_eq!(x.len(), 2);
    assert_eq!(x[0]["name"], "vadd");
    assert_eq!(x[0]["cat"], "pipe");
    assert_eq!(
        (x[0]["pid"].as_u64(), x[0]["tid"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(x[0]["args"]["pc"], 7);
    assert_eq!(x[0]["args"]["detail"], "vadd v0, v1, v2\n\t\\ tab");
    assert!(
        x[1]["args"].get("detail").is_none(),
        "empty detail is omitted"
    );
    assert_eq!(x[1]["dur"].as_f64(), Some(0.0));
    // Times are exact decimal microseconds in the text.
    assert!(text.contains("\"ts\":0.001000,\"dur\":1.233567,"), "{text}");
    assert!(text.contains("\"ts\":0.000500,\"dur\":0.000000,"), "{text}");

    let i = with_ph(&json, "i");
    assert_eq!(i.len(), 1);
    assert_eq!(i[0]["s"], "t");
    assert_eq!(i[0]["args"]["arg"], 3);
    assert_eq!(
        (i[0]["pid"].as_u64(), i[0]["tid"].as_u64()),
        (Some(1), Some(3))
    );

    let c = with_ph(&json, "C");
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["name"], "bw");
    assert_eq!(c[0]["args"]["bw"], -5);
    assert_eq!(c[0]["pid"], 2);

    let s = with_ph(&json, "s");
    let f = with_ph(&json, "f");
    assert_eq!((s.len(), f.len()), (1, 1));
    assert_eq!(
        (&s[0]["id"], &f[0]["id"]),
        (&Value::from(9), &Value::from(9))
    );
    assert_eq!(
        (&s[0]["cat"], &f[0]["cat"]),
        (&Value::from("flow"), &Value::from("flow"))
    );
    assert_eq!(f[0]["bp"], "e");
    assert_eq!(
        (s[0]["tid"].as_u64(), f[0]["tid"].as_u64()),
        (Some(3), Some(1))
    );
    assert!(
        text.contains("\"ph\":\"f\",\"bp\":\"e\",\"id\":9,\"ts\":1.000000,"),
        "{text}"
    );

    assert_eq!(events(&json).len(), 10 + 2 + 1 + 1 + 2);
}

#[test]
fn timestamps_are_exact_microseconds() {
    let bytes = write_trace(|w| {
        let l = w.lane(lane("p", "t", LaneKind::Stream));
        let n = w.intern("task");
        w.record(span(l, n, 1_234_567, 1_234_567 + 2_000_001));
        w.record(span(l, n, 7, 999_999));
        w.record(span(l, n, u64::MAX - 1, u64::MAX));
    });
    let text = export(&TraceFile::from_bytes(bytes).unwrap());
    assert!(text.contains("\"ts\":1.234567,\"dur\":2.000001,"), "{text}");
    assert!(text.contains("\"ts\":0.000007,\"dur\":0.999992,"), "{text}");
    assert!(
        text.contains("\"ts\":18446744073709.551614,\"dur\":0.000001,"),
        "{text}"
    );
    serde_json::from_str::<Value>(&text).unwrap();
}

#[test]
fn strings_are_escaped() {
    let nasty = [
        "quote \" backslash \\ slash /",
        "control \u{0}\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}",
        "unicode é → 😀 \u{2028}",
        "",
    ];
    let bytes = write_trace(|w| {
        let l = w.lane(lane(nasty[0], nasty[1], LaneKind::Host));
        for (i, s) in nasty.iter().enumerate() {
            let id = w.intern(s);
            w.meta(s, s);
            w.record(Record::Instant {
                lane: l,
                name: id,
                at: i as u64,
                arg: 0,
                detail: id,
            });
            w.record(Record::Counter {
                lane: l,
                name: id,
                at: i as u64,
                value: i as i64,
            });
        }
    });
    let text = export(&TraceFile::from_bytes(bytes).unwrap());
    assert!(
        text.contains("\\u0000\\u0001\\u0008\\u000c\\u000a\\u000d\\u0009\\u001f"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&text).unwrap();
    for s in nasty {
        assert_eq!(json["metadata"][s], s);
    }
    let m = with_ph(&json, "M");
    assert_eq!(m[0]["args"]["name"], nasty[0]);
    assert_eq!(m[2]["args"]["name"], nasty[1]);
    let instants = with_ph(&json, "i");
    let counters = with_ph(&json, "C");
    for (i, s) in nasty.iter().enumerate() {
        assert_eq!(instants[i]["name"], *s);
        if s.is_empty() {
            assert!(instants[i]["args"].get("detail").is_none());
        } else {
            assert_eq!(instants[i]["args"]["detail"], *s);
        }
        assert_eq!(counters[i]["args"][*s], i as i64);
    }
}

#[test]
fn export_is_deterministic_and_handles_empty_traces() {
    let trace = TraceFile::from_bytes(sample_trace()).unwrap();
    assert_eq!(export(&trace), export(&trace));
    let empty = TraceFile::from_bytes(write_trace(|_| {})).unwrap();
    let text = export(&empty);
    assert_eq!(
        text,
        "{\"displayTimeUnit\":\"ns\",\"metadata\":{},\"traceEvents\":[\n]}\n"
    );
    let json: Value = serde_json::from_str(&text).unwrap();
    assert!(events(&json).is_empty());
}

#[test]
fn export_to_file_goes_through_a_temporary_file() {
    let dir = scratch_dir("perfetto_file");
    let trace = TraceFile::from_bytes(sample_trace()).unwrap();
    let dest = dir.join("out.json");
    std::fs::write(&dest, "old").unwrap();
    export_perfetto_file(&trace, &dest).unwrap();
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), export(&trace));
    assert_eq!(dir_listing(&dir), vec!["out.json"]);

    // A destination that cannot be replaced (a directory): error, nothing left behind.
    let blocked = dir.join("blocked.json");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("keep"), "x").unwrap();
    let err = export_perfetto_file(&trace, &blocked).unwrap_err();
    assert!(err.to_string().contains("cannot rename"), "{err}");
    assert_eq!(dir_listing(&dir), vec!["blocked.json", "out.json"]);
    assert_eq!(dir_listing(&blocked), vec!["keep"]);

    // A destination in a missing directory: error naming the temporary file's place.
    let err = export_perfetto_file(&trace, &dir.join("missing/out.json")).unwrap_err();
    assert!(err.to_string().contains("missing/out.json.tmp-"), "{err}");
}
