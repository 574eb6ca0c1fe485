//! `.npy` files: round trips of every IR type and awkward shapes, byte-exact agreement with
//! what NumPy writes (files spelled out byte by byte below, as `numpy.save` produces them),
//! every version and header dialect NumPy has written, a typed error naming the file for
//! each kind of bad input, no panic on any truncation or header bit flip, and writes that
//! never leave a partial or clobbered file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_host::npy::{self, NpyError};

/// A fresh, empty directory for one test.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("npy")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A `.npy` file assembled from explicitly given parts, so the expected bytes in these tests
/// do not come from the code under test: magic, version, the header length field as written
/// (2 or 4 bytes), the dict text, the number of padding spaces before the final newline, and
/// the data.
fn npy_file(
    version: [u8; 2],
    length_field: &[u8],
    dict: &str,
    spaces: usize,
    data: &[u8],
) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&version);
    out.extend_from_slice(length_field);
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', spaces));
    out.push(b'\n');
    out.extend_from_slice(data);
    out
}

fn tensor(dtype: DataType, dims: &[i64], data: Vec<u8>) -> Tensor {
    Tensor::new(dtype, dims.to_vec(), data).unwrap()
}

/// Deterministic bytes that are valid elements of `dtype` (bools 0/1).
fn sample_bytes(dtype: DataType, count: usize) -> Vec<u8> {
    let n = count * dtype.size();
    (0..n)
        .map(|i| match dtype {
            DataType::Bool => (i % 3 == 1) as u8,
            _ => (i * 37 + 11) as u8,
        })
        .collect()
}

fn parse(bytes: &[u8]) -> Result<Tensor, NpyError> {
    npy::parse(bytes, Path::new("in/x.npy"))
}

/// `np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3))`: the dict, 20 spare spaces
/// for the first axis to grow plus 38 of padding, the newline at byte 127.
fn numpy_f32_2x3() -> Vec<u8> {
    let data: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    npy_file(
        [1, 0],
        &[118, 0],
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        58,
        &data,
    )
}

#[test]
fn encode_matches_numpy_byte_for_byte() {
    let f32_2x3 = Tensor::from_f32s(vec![2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(npy::encode(&f32_2x3), numpy_f32_2x3());

    // np.save(f, np.float64(1.5)): a 0-d array has no axis to grow.
    let scalar = tensor(DataType::F64, &[], 1.5f64.to_le_bytes().to_vec());
    let expected = npy_file(
        [1, 0],
        &[118, 0],
        "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
        62,
        &1.5f64.to_le_bytes(),
    );
    assert_eq!(npy::encode(&scalar), expected);

    // np.save(f, np.array([True, False, False, True])).
    let flags = tensor(DataType::Bool, &[4], vec![1, 0, 0, 1]);
    let expected = npy_file(
        [1, 0],
        &[118, 0],
        "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }",
        60,
        &[1, 0, 0, 1],
    );
    assert_eq!(npy::encode(&flags), expected);

    // np.save(f, np.zeros((0, 3), np.int64)): no data at all.
    let empty = tensor(DataType::I64, &[0, 3], vec![]);
    let expected = npy_file(
        [1, 0],
        &[118, 0],
        "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3), }",
        58,
        &[],
    );
    assert_eq!(npy::encode(&empty), expected);

    // Twenty axes: a header past the first 128 bytes, padded to 192.
    let ones = [1i64; 20];
    let wide = tensor(DataType::F16, &ones, vec![0, 0x3c]);
    let dict = format!(
        "{{'descr': '<f2', 'fortran_order': False, 'shape': ({}1), }}",
        "1, ".repeat(19)
    );
    assert_eq!(dict.len(), 113);
    let expected = npy_file([1, 0], &[182, 0], &dict, 20 + 48, &[0, 0x3c]);
    assert_eq!(expected.len(), 192 + 2);
    assert_eq!(npy::encode(&wide), expected);

    // A header that would end exactly on the boundary gets a whole block of padding, as
    // NumPy's `_wrap_header` computes it (64 - 0 % 64 = 64 spaces).
    let dims = [1i64, 10, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    let t = tensor(DataType::U8, &dims, sample_bytes(DataType::U8, 100));
    let dict = "{'descr': '|u1', 'fortran_order': False, \
                'shape': (1, 10, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }";
    assert_eq!(dict.len() + 20, 117);
    let expected = npy_file([1, 0], &[182, 0], dict, 20 + 64, &t.data);
    assert_eq!(npy::encode(&t), expected);
}

#[test]
fn every_type_and_shape_round_trips() {
    let dir = scratch_dir("round_trip");
    let shapes: [&[i64]; 7] = [&[], &[0], &[1], &[7], &[2, 3], &[2, 0, 4], &[1, 2, 1, 3, 1]];
    // The ml_dtypes types are written as raw void elements, which name no type to read back.
    let readable: Vec<DataType> = DataType::ALL
        .into_iter()
        .filter(|d| !npy::descr(*d).contains('V'))
        .collect();
    for dtype in readable.iter().copied() {
        for (i, dims) in shapes.iter().enumerate() {
            let count = dims.iter().product::<i64>() as usize;
            let t = tensor(dtype, dims, sample_bytes(dtype, count));
            let bytes = npy::encode(&t);
            let data_start = bytes.len() - t.data.len();
            assert_eq!(
                data_start % 64,
                0,
                "{dtype:?} {dims:?}: data at {data_start}"
            );
            assert_eq!(bytes[data_start - 1], b'\n');
            assert_eq!(parse(&bytes).unwrap(), t, "{dtype:?} {dims:?}");

            let path = dir.join(format!("{}_{i}.npy", dtype.name()));
            npy::write(&path, &t).unwrap();
            assert_eq!(
                npy::read(&path).unwrap(),
                t,
                "{dtype:?} {dims:?} via a file"
            );
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
        }
    }
    // Nothing but the written files: no temporary file is left behind.
    assert_eq!(listing(&dir).len(), readable.len() * shapes.len());
    assert!(listing(&dir).iter().all(|n| n.ends_with(".npy")));
}

#[test]
fn every_version_and_header_dialect_reads() {
    let want = Tensor::from_f32s(vec![2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let data = want.data.to_vec();
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

    // write_array(f, a, version=(2, 0)) and (3, 0): a 4-byte length, data still at 128.
    for version in [[2, 0], [3, 0]] {
        let bytes = npy_file(version, &[116, 0, 0, 0], dict, 56, &data);
        assert_eq!(bytes.len(), 128 + 24);
        assert_eq!(parse(&bytes).unwrap(), want, "version {version:?}");
    }

    // Python 2 NumPy: long integers with an `L`, 16-byte alignment, no growth padding.
    let py2 = npy_file(
        [1, 0],
        &[70, 0],
        "{'descr': '<i8', 'fortran_order': False, 'shape': (3L,), }",
        11,
        &[1u64, 2, 3].map(u64::to_le_bytes).concat(),
    );
    assert_eq!(py2.len(), 80 + 24);
    assert_eq!(parse(&py2).unwrap(), Tensor::from_i64s(vec![3], &[1, 2, 3]));

    // Other writers: double quotes, keys in another order, no trailing comma, newlines.
    let other = npy_file(
        [1, 0],
        &[69, 0],
        "{\"shape\": (2,\n 3), \"fortran_order\": False, \"descr\": \"<f4\"}",
        10,
        &data,
    );
    assert_eq!(parse(&other).unwrap(), want);

    // Byte-order marks: '|' and '=' and none for wide types, any mark for single bytes.
    let cases: [(&str, DataType, &[u8]); 8] = [
        ("|i1", DataType::I8, &[0xff]),
        ("<i1", DataType::I8, &[0xff]),
        (">i1", DataType::I8, &[0xff]),
        ("|u1", DataType::U8, &[7]),
        ("<b1", DataType::Bool, &[1]),
        ("=i2", DataType::I16, &[1, 2]),
        ("|f2", DataType::F16, &[0, 0x3c]),
        ("i4", DataType::I32, &[1, 2, 3, 4]),
    ];
    for (descr, dtype, data) in cases {
        let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1,), }}");
        let len = (dict.len() + 1) as u8;
        let bytes = npy_file([1, 0], &[len, 0], &dict, 0, data);
        assert_eq!(
            parse(&bytes).unwrap(),
            tensor(dtype, &[1], data.to_vec()),
            "{descr}"
        );
    }
}

/// A version 1.0 file around a header dict (no padding) and data.
fn with_header(dict: &str, data: &[u8]) -> Vec<u8> {
    let len = u16::try_from(dict.len() + 1).unwrap().to_le_bytes();
    npy_file([1, 0], &len, dict, 0, data)
}

/// The error `bytes` give, checked to name the file.
fn error_of(bytes: &[u8]) -> (NpyError, String) {
    let e = parse(bytes).expect_err("the input is invalid");
    let text = e.to_string();
    assert!(text.starts_with("in/x.npy: "), "{text}");
    (e, text)
}

#[test]
fn bad_framing_is_a_typed_error() {
    let good = numpy_f32_2x3();

    let (e, text) = error_of(b"PK\x03\x04 a zip file");
    assert!(matches!(e, NpyError::BadMagic { .. }), "{text}");
    assert!(
        text.contains("expected the magic bytes \\x93NUMPY, got \"PK\\x03\\x04"),
        "{text}"
    );
    let (e, text) = error_of(b"");
    assert!(
        matches!(e, NpyError::Truncated { part: "magic", .. }),
        "{text}"
    );

    let (e, text) = error_of(&good[..9]);
    assert!(
        matches!(
            e,
            NpyError::Truncated {
                part: "header length",
                ..
            }
        ),
        "{text}"
    );
    let (e, text) = error_of(&good[..100]);
    assert!(matches!(
        e,
        NpyError::Truncated {
            part: "header",
            needed: 128,
            got: 100,
            ..
        }
    ));
    assert!(
        text.contains("the header ends at byte 128, got a file of 100 bytes"),
        "{text}"
    );

    let mut v4 = good.clone();
    v4[6] = 4;
    let (e, text) = error_of(&v4);
    assert!(matches!(
        e,
        NpyError::Version {
            major: 4,
            minor: 0,
            ..
        }
    ));
    assert!(
        text.contains("version 4.0: expected 1.0, 2.0 or 3.0"),
        "{text}"
    );

    // A 4 GiB header length in a small file: an error, not an allocation.
    let mut huge = good.clone();
    huge[6] = 2;
    huge.splice(8..10, [0xff, 0xff, 0xff, 0xff]);
    let (e, _) = error_of(&huge);
    assert!(matches!(
        e,
        NpyError::Truncated {
            part: "header",
            needed: 4_294_967_307,
            ..
        }
    ));

    // Version 3.0 headers are UTF-8.
    let mut v3 = npy_file(
        [3, 0],
        &[116, 0, 0, 0],
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        56,
        &good[128..],
    );
    v3[20] = 0xff;
    let (e, text) = error_of(&v3);
    assert!(
        matches!(e, NpyError::HeaderSyntax { offset: 8, .. }),
        "{text}"
    );
}

#[test]
fn bad_headers_are_typed_errors() {
    let data4 = [0u8; 4];
    let syntax = [
        ("'descr': '<f4'", "'{' opening the header dict"),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ",
            "a value",
        ),
        ("{'descr' '<f4'}", "':' after a dict key"),
        ("{'descr': '<f4 }", "a closing quote"),
        ("{'descr': '<f4', 'fortran_order': false}", "a literal"),
        ("{'shape': (1 1)}", "',' or ')'"),
        ("{'shape': (0x1,)}", "a decimal integer"),
        ("{'shape': (1.0,)}", "a decimal integer"),
        (
            "{'descr': '<f4'} trailing",
            "only spaces and a newline after the dict",
        ),
        (
            "{'descr': '<f4'}\0",
            "only spaces and a newline after the dict",
        ),
    ];
    for (dict, expected) in syntax {
        let (e, text) = error_of(&with_header(dict, &data4));
        assert!(matches!(e, NpyError::HeaderSyntax { .. }), "{dict}: {text}");
        assert!(
            text.contains(&format!("expected {expected}")),
            "{dict}: {text}"
        );
        assert!(text.contains("got "), "{text}");
    }
    let nested = format!("{{'shape': {}1{}}}", "(".repeat(100), ",)".repeat(100));
    let (e, text) = error_of(&with_header(&nested, &data4));
    assert!(matches!(e, NpyError::HeaderSyntax { .. }), "{text}");
    assert!(text.contains("nested at most 16 deep"), "{text}");

    let entries = [
        (
            "{'descr': '<f4', 'fortran_order': False}",
            "shape",
            "no such key",
        ),
        (
            "{'descr': '<f4', 'shape': (1,)}",
            "fortran_order",
            "no such key",
        ),
        (
            "{'fortran_order': False, 'shape': (1,)}",
            "descr",
            "no such key",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
            "extra",
            "an unknown key",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'shape': (1,)}",
            "shape",
            "it twice",
        ),
        (
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
            "fortran_order",
            "int 0",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",
            "shape",
            "list [1]",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': 1}",
            "shape",
            "int 1",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, '2')}",
            "shape",
            "an element str '2'",
        ),
        (
            "{'descr': 4, 'fortran_order': False, 'shape': (1,)}",
            "descr",
            "int 4",
        ),
        ("{1: 2}", "<header>", "the key int 1"),
    ];
    for (dict, key, got) in entries {
        let (e, text) = error_of(&with_header(dict, &data4));
        assert!(
            matches!(&e, NpyError::HeaderEntry { key: k, .. } if k == key),
            "{dict}: {text}"
        );
        assert!(text.contains(&format!("header entry '{key}'")), "{text}");
        assert!(text.contains(&format!("got {got}")), "{dict}: {text}");
    }
}

#[test]
fn unusable_types_and_layouts_are_typed_errors() {
    let header =
        |descr: &str| format!("{{'descr': {descr}, 'fortran_order': False, 'shape': (1,), }}");
    for descr in [
        "'<c8'",
        "'<U3'",
        "'|O'",
        "'|S5'",
        "'<M8[ns]'",
        "'<f16'",
        "''",
        "'<'",
        "'<f'",
    ] {
        let (e, text) = error_of(&with_header(&header(descr), &[0; 8]));
        assert!(
            matches!(e, NpyError::UnknownDtype { .. }),
            "{descr}: {text}"
        );
        assert!(
            text.contains(&format!(
                "unknown dtype {descr}: expected one of '<f4' (f32)"
            )),
            "{text}"
        );
    }
    for descr in ["'<V2'", "'|V1'"] {
        let (e, text) = error_of(&with_header(&header(descr), &[0; 8]));
        assert!(matches!(e, NpyError::UnsupportedDtype { .. }), "{text}");
        assert!(
            text.contains(&format!("dtype {descr} (raw void elements")),
            "{text}"
        );
    }
    let (e, text) = error_of(&with_header(
        &header("[('a', '<f4'), ('b', '<i4')]"),
        &[0; 8],
    ));
    assert!(matches!(e, NpyError::UnsupportedDtype { .. }), "{text}");
    assert!(text.contains("structured type"), "{text}");

    let (e, text) = error_of(&with_header(&header("'>f4'"), &[0; 4]));
    assert!(matches!(e, NpyError::BigEndian { .. }), "{text}");
    assert!(
        text.contains("dtype '>f4' is big-endian: expected little-endian"),
        "{text}"
    );

    let fortran = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
    let (e, text) = error_of(&with_header(fortran, &[0; 24]));
    assert!(matches!(e, NpyError::FortranOrder { .. }), "{text}");
    assert!(
        text.contains("fortran_order is True: expected a C-order array"),
        "{text}"
    );
}

#[test]
fn shapes_must_fit_and_match_the_data() {
    let dict = |descr: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
    };
    let (e, text) = error_of(&with_header(&dict("<f4", "(2, -3)"), &[]));
    assert!(
        matches!(
            e,
            NpyError::BadDim {
                index: 1,
                value: -3,
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains("shape (2, -3): dimension 1 is -3"), "{text}");
    let (e, _) = error_of(&with_header(&dict("<f4", "(9223372036854775808,)"), &[]));
    assert!(matches!(e, NpyError::BadDim { .. }));

    // Byte sizes past 2^63, also when a zero axis makes the array empty (NumPy refuses
    // those too, and downstream products of the dims must not overflow).
    let overflowing = [
        "(4294967296, 4294967296)",
        "(2305843009213693952,)",
        "(4294967296, 4294967296, 0)",
        "(0, 9223372036854775807)",
    ];
    for shape in overflowing {
        let (e, text) = error_of(&with_header(&dict("<f4", shape), &[]));
        assert!(
            matches!(e, NpyError::ShapeOverflow { .. }),
            "{shape}: {text}"
        );
        assert!(text.contains(&format!("shape {shape} of f32")), "{text}");
    }
    // A zero anywhere makes the array empty, whatever the other axes claim.
    let zero = with_header(&dict("<f4", "(2305843009213693951, 0)"), &[]);
    assert_eq!(parse(&zero).unwrap().dims, vec![(1 << 61) - 1, 0]);
    // A huge declared shape over a few bytes: an error, nothing allocated for it.
    let (e, text) = error_of(&with_header(&dict("<f8", "(1000000000000,)"), &[0; 16]));
    assert!(
        matches!(
            e,
            NpyError::DataLength {
                expected: 8_000_000_000_000,
                got: 16,
                ..
            }
        ),
        "{text}"
    );
    let good = numpy_f32_2x3();
    let (_, text) = error_of(&good[..good.len() - 1]);
    assert!(
        text.contains("shape (2, 3) of f32 needs 24 data bytes after the 128-byte header, got 23"),
        "{text}"
    );
    let mut long = good.clone();
    long.push(0);
    let (e, _) = error_of(&long);
    assert!(matches!(
        e,
        NpyError::DataLength {
            expected: 24,
            got: 25,
            ..
        }
    ));

    let (e, text) = error_of(&with_header(&dict("|b1", "(3,)"), &[0, 1, 2]));
    assert!(
        matches!(
            e,
            NpyError::BadBool {
                index: 2,
                value: 2,
                ..
            }
        ),
        "{text}"
    );
}

/// Parsing must give an error or a tensor whose data matches its dims, never a panic.
fn check_consistent(bytes: &[u8], what: &str) {
    if let Ok(t) = parse(bytes) {
        let count: i64 = t.dims.iter().product();
        assert!(t.dims.iter().all(|d| *d >= 0), "{what}: {:?}", t.dims);
        assert_eq!(t.data.len() as i64, count * t.dtype.size() as i64, "{what}");
    }
}

#[test]
fn no_truncation_or_header_bit_flip_panics() {
    let files = [
        numpy_f32_2x3(),
        npy::encode(&tensor(DataType::Bool, &[4], vec![1, 0, 0, 1])),
        npy::encode(&tensor(DataType::I16, &[], vec![1, 2])),
        npy::encode(&tensor(DataType::U8, &[0, 5], vec![])),
        npy_file(
            [3, 0],
            &[116, 0, 0, 0],
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            56,
            &[0; 24],
        ),
    ];
    for (f, bytes) in files.iter().enumerate() {
        assert!(parse(bytes).is_ok(), "file {f} is valid");
        for len in 0..bytes.len() {
            assert!(
                parse(&bytes[..len]).is_err(),
                "file {f} cut to {len} bytes parsed"
            );
        }
        let header_end = bytes.len() - parse(bytes).unwrap().data.len();
        for at in 0..header_end {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << bit;
                check_consistent(&flipped, &format!("file {f}, byte {at}, bit {bit}"));
            }
        }
    }
}

#[test]
fn writes_are_whole_or_nothing() {
    let dir = scratch_dir("atomic");
    let first = Tensor::from_i32s(vec![2], &[1, 2]);
    let second = Tensor::from_f32s(vec![3], &[1.0, 2.0, 3.0]);
    let path = dir.join("t.npy");
    npy::write(&path, &first).unwrap();
    npy::write(&path, &second).unwrap();
    assert_eq!(npy::read(&path).unwrap(), second);

    // An inconsistent tensor is refused before anything is touched.
    let broken = Tensor {
        dtype: DataType::F32,
        dims: vec![4],
        data: Arc::new(vec![0; 8]),
    };
    let e = npy::write(&path, &broken).unwrap_err();
    assert!(matches!(e, NpyError::InvalidTensor { .. }));
    assert!(e.to_string().contains("needs 16 data bytes, got 8"), "{e}");
    let negative = Tensor {
        dtype: DataType::U8,
        dims: vec![-1],
        data: Arc::new(vec![]),
    };
    assert!(matches!(
        npy::write(&path, &negative),
        Err(NpyError::InvalidTensor { .. })
    ));
    assert_eq!(npy::read(&path).unwrap(), second);

    // A destination that cannot be replaced (a directory): an error naming it, the directory
    // intact and no temporary file left.
    let blocked = dir.join("blocked.npy");
    std::fs::create_dir(&blocked).unwrap();
    let e = npy::write(&blocked, &first).unwrap_err();
    assert!(matches!(e, NpyError::Write { .. }));
    assert!(
        e.to_string().starts_with(&blocked.display().to_string()),
        "{e}"
    );
    assert!(blocked.is_dir());
    assert_eq!(listing(&dir), vec!["blocked.npy", "t.npy"]);

    // A missing directory: nothing is created.
    let missing = dir.join("no/such/dir/t.npy");
    assert!(matches!(
        npy::write(&missing, &first),
        Err(NpyError::Write { .. })
    ));
    assert_eq!(listing(&dir), vec!["blocked.npy", "t.npy"]);

    let e = npy::read(&dir.join("absent.npy")).unwrap_err();
    assert!(matches!(e, NpyError::Read { .. }));
    assert!(e.to_string().contains("absent.npy: cannot read"), "{e}");
}
