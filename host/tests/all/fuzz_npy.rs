//! Fuzz targets of the `.npy` reader (`npy::parse`): random bytes, damaged copies of files
//! `npy::encode` writes for every element type and awkward shapes (empty, scalar, a zero dim,
//! version 2.0 headers), and headers assembled from near-valid pieces — every key, NumPy's
//! dialects, huge and negative dims, deep brackets, odd quoting.
//!
//! Each case must be an error naming the file, or a tensor whose data is exactly what its shape
//! and type need and which encodes to bytes that parse back to the same tensor; never a panic,
//! an allocation the file does not back, or a long run. `PROPTEST_CASES=20000 cargo test -p
//! gearsim-host fuzz_npy` runs them longer.

use std::path::Path;

use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_host::npy;
use proptest::prelude::*;

use crate::mutate::{boundary_value, fuzz_config, mutated, mutations, timed};

const FILE: &str = "fuzz.npy";

/// Parses `bytes` and checks what comes back.
fn check(bytes: &[u8]) {
    match npy::parse(bytes, Path::new(FILE)) {
        Ok(t) => {
            let count: i64 = t.dims.iter().product();
            assert!(t.dims.iter().all(|d| *d >= 0));
            assert_eq!(t.data.len() as i64, count * t.dtype.size() as i64);
            let again = npy::parse(&npy::encode(&t), Path::new(FILE)).unwrap();
            assert_eq!(again, t);
        }
        Err(e) => assert!(e.to_string().starts_with(FILE), "{e}"),
    }
}

/// A consistent tensor of any type and a small shape.
fn tensor() -> impl Strategy<Value = Tensor> {
    (
        0..DataType::ALL.len(),
        proptest::collection::vec(0i64..4, 0..4),
        any::<u64>(),
    )
        .prop_map(|(t, dims, seed)| {
            let dtype = DataType::ALL[t];
            let n = dims.iter().product::<i64>() as usize * dtype.size();
            let data = (0..n)
                .map(|i| {
                    let b = (seed >> (i % 8 * 8)) as u8 ^ i as u8;
                    if dtype == DataType::Bool { b & 1 } else { b }
                })
                .collect();
            Tensor::new(dtype, dims, data).unwrap()
        })
}

/// A dict value NumPy might write, or nearly.
fn header_value() -> impl Strategy<Value = String> {
    let dim = prop_oneof![
        (0i64..5).prop_map(|d| d.to_string()),
        boundary_value().prop_map(|d| d.to_string()),
        boundary_value().prop_map(|d| format!("-{d}")),
        Just("3L".to_string()),
        Just("99999999999999999999999999999".to_string()),
    ];
    prop_oneof![
        Just("'<f4'".to_string()),
        Just("'|u1'".to_string()),
        Just("'>i8'".to_string()),
        Just("'=f2'".to_string()),
        Just("'|b1'".to_string()),
        Just("\"<f8\"".to_string()),
        Just("'<c16'".to_string()),
        Just("[('a', '<f4')]".to_string()),
        Just("True".to_string()),
        Just("False".to_string()),
        Just("None".to_string()),
        proptest::collection::vec(dim, 0..5).prop_map(|d| match d.len() {
            1 => format!("({},)", d[0]),
            _ => format!("({})", d.join(", ")),
        }),
        (1usize..40).prop_map(|n| format!("{}1{}", "(".repeat(n), ")".repeat(n))),
        (1usize..40).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n))),
        "'[^']{0,12}'",
        "\\PC{0,10}",
    ]
}

/// A header dict from near-valid pieces, in any key order, with repeats and strays.
fn header() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("'descr'"),
        Just("'fortran_order'"),
        Just("'shape'"),
        Just("'extra'"),
        Just("\"shape\""),
        Just("1"),
    ];
    (
        proptest::collection::vec((key, header_value()), 0..5),
        any::<bool>(),
    )
        .prop_map(|(entries, comma)| {
            let body: Vec<String> = entries.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("{{{}{}}}", body.join(", "), if comma { ", " } else { "" })
        })
}

/// A file around `dict`: magic, a version, the header length and some data.
fn framed(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let mut out = npy::MAGIC.to_vec();
    let text = format!("{dict}\n");
    if version == 1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[version, 0]);
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    out
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn random_bytes_are_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        timed("random .npy bytes", || check(&bytes));
    }

    #[test]
    fn random_bytes_after_the_magic_are_rejected(
        version in 0u8..4,
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = npy::MAGIC.to_vec();
        bytes.extend_from_slice(&[version, 0]);
        bytes.extend_from_slice(&rest);
        timed("random .npy after the magic", || check(&bytes));
    }

    #[test]
    fn damaged_files_are_rejected_or_read_consistently(t in tensor(), damage in mutations()) {
        let bytes = mutated(&npy::encode(&t), &damage);
        timed("damaged .npy", || check(&bytes));
    }

    #[test]
    fn assembled_headers_are_rejected_or_read_consistently(
        version in 1u8..4,
        dict in header(),
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let bytes = framed(version, &dict, &data);
        timed("assembled .npy header", || check(&bytes));
    }
}
