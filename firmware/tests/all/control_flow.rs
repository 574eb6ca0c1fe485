//! The Case lowering of gear spec §7 runs on the scheduler: `MapIndex -> LabelSwitchByIndex ->
//! [LabelSet L_i, StreamActive, branch i, LabelGoto L_exit]... -> LabelSet L_exit` picks the
//! gear's branch, only that branch's tasks run, and an unmatched query runs the last branch.

use std::io::Cursor;

use gearsim_firmware::kernels::map_index::{MapIndexShape, TableLayout};
use gearsim_firmware::{Device, DevicePtr};
use gearsim_isa::task::*;
use gearsim_traces::{Record, TraceFile, TraceSink, TraceWriter};

use crate::support::*;

const G: u32 = 5;
const N: u32 = 2;
const TABLE: [i32; 10] = [1, 224, 2, 224, 4, 224, 8, 224, 8, 448];

struct Case {
    x: DevicePtr,
    y: DevicePtr,
    markers: Vec<DevicePtr>,
    aux: Vec<DevicePtr>,
    model: u32,
}

/// Builds the lowered Case as a model: a main stream plus one stream per branch that the
/// branch's StreamActive starts.
fn build<S: TraceSink>(dev: &mut Device<S>, engine: Engine, layout: TableLayout) -> Case {
    let shape = MapIndexShape {
        n: N,
        gears: G,
        layout,
        level_index: false,
    };
    let b = map_index_buffers(dev, &shape, &[0, 0], &TABLE, None);
    let map_index = map_index_task(dev, engine, &shape, &b);
    let exit = dev.create_label().unwrap();
    let branch_labels: Vec<_> = (0..G).map(|_| dev.create_label().unwrap()).collect();
    let list = upload(
        dev,
        &branch_labels
            .iter()
            .flat_map(|l| l.0.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let markers: Vec<_> = (0..G).map(|_| upload(dev, &[0u8; 64])).collect();
    let aux: Vec<_> = (0..G).map(|_| upload(dev, &[0u8; 64])).collect();
    let model = dev.model_count();
    let first_aux = dev.stream_count() + 1;
    let named = |t: Task, n: String| (t, Some(n));
    let mut main = vec![
        named(map_index, "MapIndex".into()),
        named(
            Task::LabelSwitchByIndex(LabelSwitchByIndex {
                index_ptr: b.y.0,
                max: G,
                label_list: list.0,
            }),
            "LabelSwitch".into(),
        ),
    ];
    for i in 0..G {
        main.push(named(
            Task::LabelSet(LabelSet {
                label: branch_labels[i as usize].0,
            }),
            format!("LabelSet_{i}"),
        ));
        main.push(named(
            Task::StreamActive(StreamActive {
                stream: first_aux + i,
            }),
            format!("StreamActive_{i}"),
        ));
        main.push(named(
            Task::Memset(Memset {
                dst: markers[i as usize].0,
                size: 64,
                value: i + 1,
            }),
            format!("branch_{i}"),
        ));
        if i + 1 < G {
            main.push(named(
                Task::LabelGoto(LabelGoto { label: exit.0 }),
                format!("LabelGoto_{i}"),
            ));
        }
    }
    main.push(named(
        Task::LabelSet(LabelSet { label: exit.0 }),
        "LabelSet_Last".into(),
    ));
    main.push(named(
        Task::ModelEndGraph(ModelEndGraph { model }),
        "EndGraph".into(),
    ));
    let mut streams = vec![main];
    for i in 0..G {
        streams.push(vec![named(
            Task::Memset(Memset {
                dst: aux[i as usize].0,
                size: 64,
                value: 0x40 + i,
            }),
            format!("aux_{i}"),
        )]);
    }
    let m = dev.load_model(streams).unwrap();
    assert_eq!(m.0, model);
    Case {
        x: b.x,
        y: b.y,
        markers,
        aux,
        model,
    }
}

fn run_case<S: TraceSink>(dev: &mut Device<S>, case: &Case, query: &[i32]) {
    dev.write(case.x, &i32s(query)).unwrap();
    for p in case.markers.iter().chain(&case.aux) {
        dev.fill(*p, 64, 0).unwrap();
    }
    let s = dev.default_stream().unwrap();
    dev.submit(
        s,
        Task::ModelExecute(ModelExecute { model: case.model }),
        Some("model"),
    )
    .unwrap();
    dev.synchronize(s).unwrap();
}

fn marker<S: TraceSink>(dev: &mut Device<S>, p: DevicePtr) -> u8 {
    let mut b = [0u8; 64];
    dev.read(p, &mut b).unwrap();
    assert!(b.iter().all(|v| *v == b[0]));
    b[0]
}

#[test]
fn every_gear_selects_its_branch_on_every_engine_and_layout() {
    for engine in [Engine::AiCore, Engine::AiCpu] {
        for layout in TableLayout::ALL {
            let mut dev = device("ascend910", gearsim_traces::NullSink);
            let case = build(&mut dev, engine, layout);
            for k in 0..G as usize {
                run_case(&mut dev, &case, &TABLE[2 * k..2 * k + 2]);
                assert_eq!(read_i32(&mut dev, case.y), k as i32);
                for i in 0..G as usize {
                    let (m, a) = (
                        marker(&mut dev, case.markers[i]),
                        marker(&mut dev, case.aux[i]),
                    );
                    if i == k {
                        assert_eq!(
                            (m, a),
                            (i as u8 + 1, 0x40 + i as u8),
                            "{engine:?} {layout:?} gear {k}"
                        );
                    } else {
                        assert_eq!(
                            (m, a),
                            (0, 0),
                            "{engine:?} {layout:?} gear {k}: branch {i} ran"
                        );
                    }
                }
            }
            // No gear matches: MapIndex writes -1, LabelSwitchByIndex reads 0xffffffff and runs the
            // last branch, as the device does.
            run_case(&mut dev, &case, &[3, 224]);
            assert_eq!(read_i32(&mut dev, case.y), -1);
            let ran: Vec<u8> = case.markers.iter().map(|p| marker(&mut dev, *p)).collect();
            assert_eq!(ran, [0, 0, 0, 0, G as u8], "{engine:?} {layout:?}");
        }
    }
}

/// The trace of one run shows MapIndex, the switch and only the chosen branch's tasks.
#[test]
fn the_trace_shows_only_the_chosen_branch() {
    for (query, branch) in [(&TABLE[4..6], 2usize), (&[9, 9][..], G as usize - 1)] {
        let mut dev = device(
            "ascend910",
            TraceWriter::new(Cursor::new(Vec::new())).unwrap(),
        );
        let case = build(&mut dev, Engine::AiCore, TableLayout::GearMajor);
        run_case(&mut dev, &case, query);
        let bytes = dev.into_sink().finish().unwrap().into_inner();
        let trace = TraceFile::from_bytes(bytes).unwrap();
        let lanes = trace.lanes().to_vec();
        let mut executed = Vec::new();
        let mut switch_notes = Vec::new();
        for r in trace.records() {
            match r {
                Record::Span { lane, detail, .. }
                    if lanes[lane.0 as usize].process == "streams" =>
                {
                    executed.push(trace.string(detail).to_string());
                }
                Record::Instant { name, detail, .. } if trace.string(name) == "label_switch" => {
                    switch_notes.push(trace.string(detail).to_string());
                }
                _ => {}
            }
        }
        let names: Vec<&str> = executed
            .iter()
            .filter_map(|d| d.rsplit(' ').next())
            .collect();
        let want_tail = if branch + 1 < G as usize {
            vec![
                format!("LabelSet_{branch}"),
                format!("StreamActive_{branch}"),
                format!("branch_{branch}"),
                format!("LabelGoto_{branch}"),
                "LabelSet_Last".into(),
                "EndGraph".into(),
            ]
        } else {
            vec![
                format!("LabelSet_{branch}"),
                format!("StreamActive_{branch}"),
                format!("branch_{branch}"),
                "LabelSet_Last".into(),
                "EndGraph".into(),
            ]
        };
        for name in ["MapIndex", "LabelSwitch", &format!("aux_{branch}"), "model"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        for w in &want_tail {
            assert!(names.contains(&w.as_str()), "{w} missing from {names:?}");
        }
        let other_branches = names
            .iter()
            .filter(|n| {
                (n.starts_with("branch_")
                    || n.starts_with("aux_")
                    || n.starts_with("LabelSet_") && **n != "LabelSet_Last")
                    && !n.ends_with(&branch.to_string())
            })
            .count();
        assert_eq!(other_branches, 0, "tasks of other branches ran: {names:?}");
        assert_eq!(switch_notes.len(), 1);
        if branch + 1 == G as usize {
            assert!(
                switch_notes[0]
                    .contains("index -1 (4294967295) is out of range [0, 5): last label"),
                "{}",
                switch_notes[0]
            );
        }
    }
}
