//! Task descriptors round-trip through their 64-byte form; bad kinds and fields are errors.

use gearsim_isa::task::*;
use proptest::prelude::*;
use zerocopy::{FromBytes, IntoBytes};

fn task() -> impl Strategy<Value = Task> {
    (0..TaskKind::ALL.len(), any::<[u64; 4]>()).prop_map(|(k, v)| {
        let u = |i: usize| v[i] as u32;
        match TaskKind::ALL[k] {
            TaskKind::AiCoreKernel => Task::AiCoreKernel(AiCoreKernel {
                kernel: v[0],
                args: v[2],
                block_dim: u(1),
                l2ctrl: 0,
                l2_sections: 0,
            }),
            TaskKind::AiCpuKernel => Task::AiCpuKernel(AiCpuKernel {
                kernel: u(0),
                block_dim: u(1),
                args: v[2],
                args_size: u(3),
            }),
            TaskKind::EventRecord => Task::EventRecord(EventRecord { event: u(0) }),
            TaskKind::StreamWaitEvent => Task::StreamWaitEvent(StreamWaitEvent { event: u(0) }),
            TaskKind::Memcpy => Task::Memcpy(Memcpy {
                kind: [
                    MemcpyKind::HostToDevice,
                    MemcpyKind::DeviceToHost,
                    MemcpyKind::DeviceToDevice,
                ][(v[3] % 3) as usize],
                dst: v[0],
                src: v[1],
                size: v[2],
            }),
            TaskKind::ModelExecute => Task::ModelExecute(ModelExecute { model: u(0) }),
            TaskKind::NotifyWait => Task::NotifyWait(NotifyWait { notify: u(0) }),
            TaskKind::NotifyRecord => Task::NotifyRecord(NotifyRecord { notify: u(0) }),
            TaskKind::StreamSwitch => Task::StreamSwitch(StreamSwitch {
                cond_ptr: v[0],
                value: v[1] as i64,
                cond: SwitchCond::Ge,
                true_stream: u(2),
            }),
            TaskKind::StreamActive => Task::StreamActive(StreamActive { stream: u(0) }),
            TaskKind::LabelSet => Task::LabelSet(LabelSet { label: u(0) }),
            TaskKind::LabelGoto => Task::LabelGoto(LabelGoto { label: u(0) }),
            TaskKind::Memset => Task::Memset(Memset {
                dst: v[0],
                size: v[1],
                value: u(2),
            }),
            TaskKind::ModelEndGraph => Task::ModelEndGraph(ModelEndGraph { model: u(0) }),
            TaskKind::LabelSwitchByIndex => Task::LabelSwitchByIndex(LabelSwitchByIndex {
                index_ptr: v[0],
                max: u(1),
                label_list: v[2],
            }),
        }
    })
}

proptest! {
    #[test]
    fn descriptors_round_trip(t in task(), id in any::<u32>()) {
        let d = t.encode(id);
        prop_assert_eq!(d.as_bytes().len(), TASK_BYTES);
        let back = TaskDescriptor::read_from_bytes(d.as_bytes()).unwrap();
        prop_assert_eq!(back.task_id.get(), id);
        prop_assert_eq!(back.decode().unwrap(), t);
    }
}

#[test]
fn bad_descriptors_are_errors() {
    let mut d = Task::LabelSet(LabelSet { label: 3 }).encode(9);
    d.kind.set(999);
    assert_eq!(
        d.decode().unwrap_err().to_string(),
        "task 9: unknown task kind 999"
    );
    let mut d = Task::Memcpy(Memcpy {
        kind: MemcpyKind::HostToDevice,
        dst: 1,
        src: 2,
        size: 3,
    })
    .encode(4);
    d.payload[0] = 7;
    assert_eq!(
        d.decode().unwrap_err().to_string(),
        "task 4 (Memcpy): field `kind` = 7 is not valid"
    );
    let mut d = Task::LabelSet(LabelSet { label: 3 }).encode(5);
    d.payload[40] = 1;
    assert_eq!(
        d.decode().unwrap_err().to_string(),
        "task 5 (LabelSet): reserved bytes are not zero"
    );
}
