//! GetNext pops the next item of a data queue into the model's buffers and writes the shape
//! tensors; an empty queue blocks the stream until data arrives or the timeout expires.

use gearsim_firmware::kernels::{
    AiCpuKernelId, GetNextArgs, GetNextOutput, SHAPE_TENSOR_BYTES, decode_shape,
};
use gearsim_firmware::{DeviceError, HostTensor, QueueId};
use gearsim_isa::task::*;
use gearsim_traces::{NullSink, TraceSink};

use crate::support::*;

fn get_next_task<S: TraceSink>(
    dev: &mut gearsim_firmware::Device<S>,
    queue: QueueId,
    outputs: &[GetNextOutput],
    timeout_us: u64,
) -> Task {
    let block = GetNextArgs {
        queue: queue.0,
        timeout_us,
        outputs: outputs.to_vec(),
    }
    .encode();
    let p = upload(dev, &block);
    Task::AiCpuKernel(AiCpuKernel {
        kernel: AiCpuKernelId::GetNext as u32,
        block_dim: 1,
        args: p.0,
        args_size: block.len() as u32,
    })
}

#[test]
fn get_next_delivers_items_in_order_with_their_shapes() {
    let mut dev = device("ascend910", NullSink);
    let q = dev.create_queue(4).unwrap();
    let data = dev.alloc(4096).unwrap();
    let shape = dev.alloc(SHAPE_TENSOR_BYTES).unwrap();
    let out = [GetNextOutput {
        data: data.0,
        capacity: 4096,
        shape: shape.0,
    }];
    let s = dev.create_stream().unwrap();
    // GetNext is submitted before any data exists: it blocks until the item's copy lands.
    let task = get_next_task(&mut dev, q, &out, 0);
    dev.submit(s, task, Some("GetNext")).unwrap();
    let t0 = dev.now();
    dev.enqueue(
        q,
        vec![HostTensor {
            data: vec![5u8; 1024],
            dims: vec![2, 512],
        }],
    )
    .unwrap();
    dev.enqueue(
        q,
        vec![HostTensor {
            data: vec![6u8; 2048],
            dims: vec![4, 8, 64],
        }],
    )
    .unwrap();
    assert_eq!(dev.queue_len(q), Some(2));
    dev.synchronize(s).unwrap();
    let waited = dev.now().0 - t0.0;
    assert!(
        waited >= 3_000_000,
        "GetNext must wait for the PCIe copy (3 us latency), waited {waited} ps"
    );
    let read = |dev: &mut gearsim_firmware::Device<NullSink>, n: usize| {
        let mut b = vec![0u8; n];
        dev.read(data, &mut b).unwrap();
        let mut sb = vec![0u8; SHAPE_TENSOR_BYTES as usize];
        dev.read(shape, &mut sb).unwrap();
        (b, decode_shape(&sb).unwrap())
    };
    let (b, dims) = read(&mut dev, 1024);
    assert_eq!((b, dims), (vec![5u8; 1024], vec![2, 512]));
    let task = get_next_task(&mut dev, q, &out, 0);
    dev.submit(s, task, None).unwrap();
    dev.synchronize(s).unwrap();
    let (b, dims) = read(&mut dev, 2048);
    assert_eq!((b, dims), (vec![6u8; 2048], vec![4, 8, 64]));
    assert_eq!(dev.queue_len(q), Some(0));
}

#[test]
fn an_empty_queue_times_out_or_deadlocks() {
    let mut dev = device("ascend910", NullSink);
    let q = dev.create_queue(1).unwrap();
    let data = dev.alloc(64).unwrap();
    let shape = dev.alloc(SHAPE_TENSOR_BYTES).unwrap();
    let out = [GetNextOutput {
        data: data.0,
        capacity: 64,
        shape: shape.0,
    }];
    let s = dev.create_stream().unwrap();
    let task = get_next_task(&mut dev, q, &out, 50);
    dev.submit(s, task, None).unwrap();
    match dev.synchronize(s) {
        Err(DeviceError::GetNextTimeout {
            task,
            queue,
            waited_us,
        }) => {
            assert_eq!(
                (task.stream, task.index, queue, waited_us),
                (s.0, 0, q.0, 50)
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let mut dev = device("ascend910", NullSink);
    let q = dev.create_queue(1).unwrap();
    let s = dev.create_stream().unwrap();
    let task = get_next_task(&mut dev, q, &out, 0);
    dev.submit(s, task, None).unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert_eq!(
        e,
        "deadlock: stream 0 task 0 (GetNext) waits for data queue 0, which is empty and has no timeout"
    );
}

#[test]
fn queue_overflow_and_output_mismatches_are_errors() {
    let mut dev = device("ascend910", NullSink);
    let q = dev.create_queue(1).unwrap();
    let item = || {
        vec![HostTensor {
            data: vec![1u8; 100],
            dims: vec![100],
        }]
    };
    dev.enqueue(q, item()).unwrap();
    let e = dev.enqueue(q, item()).unwrap_err();
    assert_eq!(e.to_string(), "data queue 0 is full (1 items)");
    let data = dev.alloc(64).unwrap();
    let shape = dev.alloc(SHAPE_TENSOR_BYTES).unwrap();
    let s = dev.create_stream().unwrap();
    let task = get_next_task(
        &mut dev,
        q,
        &[GetNextOutput {
            data: data.0,
            capacity: 64,
            shape: shape.0,
        }],
        0,
    );
    dev.submit(s, task, None).unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(
        e.contains(
            "stream 0 task 0: GetNext: output 0: the tensor is 100 bytes, the output holds 64"
        ),
        "{e}"
    );
}
