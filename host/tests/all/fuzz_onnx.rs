//! Fuzz targets of the ONNX reader and of the whole compiler behind it: random bytes, and
//! damaged copies of every committed model (`tests/models/*.onnx`, `tests/models/torch/*.onnx`)
//! — truncations, bit flips, overwritten words and protobuf length prefixes replaced by huge
//! varints — through `onnx::import`, then through `pipeline::compile` with the model's own gear
//! options, and what compiles through the `.om` writer and reader.
//!
//! Each case must give an error naming the file or a consistent result (an imported graph that
//! passes the IR check, a `.om` that reads back with the description the compiler made), never
//! panic, and finish quickly. `PROPTEST_CASES=20000 cargo test -p gearsim-host fuzz_onnx` runs
//! them longer.

use std::path::PathBuf;
use std::sync::OnceLock;

use gearsim_compiler::onnx::import;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, MapIndexEngine, TableLayout, compile};
use gearsim_host::atc;
use gearsim_isa::om::OmFile;
use gearsim_sim::ChipConfig;
use proptest::prelude::*;

use crate::mutate::{Mutation, boundary_value, fuzz_config, mutated, mutations, timed};

/// A committed model and the atc options it compiles with.
pub struct Seed {
    /// File name under `tests/models`.
    pub name: &'static str,
    /// `--input_shape`.
    pub input_shape: Option<&'static str>,
    /// `--dynamic_batch_size`, `--dynamic_image_size` or `--dynamic_dims`, by name.
    pub gears: Option<(&'static str, &'static str)>,
}

/// Every committed model, with options that take it through the gear passes where it has
/// symbolic dims.
pub const SEEDS: [Seed; 9] = [
    Seed {
        name: "tiny_add.onnx",
        input_shape: None,
        gears: None,
    },
    Seed {
        name: "tiny_typed.onnx",
        input_shape: None,
        gears: None,
    },
    Seed {
        name: "gear_dims.onnx",
        input_shape: Some("data:1,1,40,-1;label:1,-1;mask:-1,-1"),
        gears: Some(("dims", "20,20,1,1;40,40,2,2;80,60,4,4")),
    },
    Seed {
        name: "gear_batch.onnx",
        input_shape: Some("x:-1,4,8,8"),
        gears: Some(("batch", "1,2,4")),
    },
    Seed {
        name: "gear_image.onnx",
        input_shape: Some("img:1,3,-1,-1"),
        gears: Some(("image", "16,16;32,24")),
    },
    Seed {
        name: "cnn.onnx",
        input_shape: Some("input:-1,3,32,32"),
        gears: Some(("batch", "1,4")),
    },
    Seed {
        name: "transformer.onnx",
        input_shape: Some("x:1,-1,64"),
        gears: Some(("dims", "5;16")),
    },
    Seed {
        name: "torch/cnn_torch.onnx",
        input_shape: Some("input:-1,3,32,32"),
        gears: Some(("batch", "1,2")),
    },
    Seed {
        name: "torch/transformer_torch.onnx",
        input_shape: Some("x:1,-1,64"),
        gears: Some(("dims", "16;32")),
    },
];

impl Seed {
    /// The file's bytes (read once per test binary).
    pub fn bytes(&self) -> &'static [u8] {
        static CACHE: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        let all = CACHE.get_or_init(|| {
            SEEDS
                .iter()
                .map(|s| std::fs::read(models_dir().join(s.name)).unwrap())
                .collect()
        });
        let i = SEEDS.iter().position(|s| s.name == self.name).unwrap();
        &all[i]
    }

    /// The options `gearsim compile` would be given for it.
    pub fn options(&self) -> CompileOptions {
        let mut gear = GearOptions {
            input_shape: self.input_shape.map(str::to_string),
            ..GearOptions::default()
        };
        match self.gears {
            Some(("batch", g)) => gear.dynamic_batch_size = Some(g.to_string()),
            Some(("image", g)) => gear.dynamic_image_size = Some(g.to_string()),
            Some((_, g)) => gear.dynamic_dims = Some(g.to_string()),
            None => {}
        }
        CompileOptions {
            gear,
            getnext_sink: false,
            table_layout: TableLayout::GearMajor,
            mapindex_engine: MapIndexEngine::AiCore,
            fusion: Default::default(),
            precision: Default::default(),
            target: atc::target(&ChipConfig::preset("ascend910").unwrap()),
        }
    }
}

/// `tests/models`.
pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/models")
}

/// Where the length prefixes of a protobuf message's length-delimited fields are: `(offset,
/// size)` of each prefix varint, found by walking the wire format and descending into every
/// payload that itself parses as a message.
pub fn length_prefixes(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    walk(bytes, 0, 0, &mut out);
    out
}

fn varint(bytes: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *bytes.get(at + i)?;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Walks one message; `false` when `bytes` is not one (its prefixes are then not kept).
fn walk(bytes: &[u8], base: usize, depth: usize, out: &mut Vec<(usize, usize)>) -> bool {
    let mut at = 0;
    let mut found = Vec::new();
    while at < bytes.len() {
        let Some((tag, n)) = varint(bytes, at) else {
            return false;
        };
        at += n;
        if tag >> 3 == 0 {
            return false;
        }
        match tag & 7 {
            0 => match varint(bytes, at) {
                Some((_, n)) => at += n,
                None => return false,
            },
            1 => at += 8,
            5 => at += 4,
            2 => {
                let Some((len, n)) = varint(bytes, at) else {
                    return false;
                };
                found.push((base + at, n));
                at += n;
                let Some(end) = usize::try_from(len).ok().and_then(|l| at.checked_add(l)) else {
                    return false;
                };
                let Some(payload) = bytes.get(at..end) else {
                    return false;
                };
                if depth < 16 {
                    let mut inner = Vec::new();
                    if walk(payload, base + at, depth + 1, &mut inner) {
                        found.extend(inner);
                    }
                }
                at = end;
            }
            _ => return false,
        }
    }
    if at != bytes.len() {
        return false;
    }
    out.extend(found);
    true
}

fn encode_varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Damage that knows the protobuf wire format: a length prefix replaced by another value
/// (huge, zero, off by a little), or any byte-level [`Mutation`].
#[derive(Debug, Clone)]
pub enum ProtoDamage {
    /// Replace length prefix number `.0` (modulo their count) with this length.
    Length(usize, u64),
    /// Add this (wrapping) to length prefix number `.0` (modulo their count).
    LengthOffBy(usize, i8),
    /// Byte-level damage.
    Bytes(Mutation),
}

/// Any [`ProtoDamage`].
pub fn proto_damage() -> impl Strategy<Value = ProtoDamage> {
    prop_oneof![
        2 => (any::<usize>(), boundary_value()).prop_map(|(i, v)| ProtoDamage::Length(i, v)),
        1 => (any::<usize>(), any::<i8>()).prop_map(|(i, d)| ProtoDamage::LengthOffBy(i, d)),
        3 => crate::mutate::mutation().prop_map(ProtoDamage::Bytes),
    ]
}

/// `seed` with the damage applied in order.
pub fn damaged(seed: &[u8], damage: &[ProtoDamage]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for d in damage {
        let (which, new) = match d {
            ProtoDamage::Bytes(m) => {
                m.apply(&mut bytes);
                continue;
            }
            ProtoDamage::Length(i, v) => (i, Some(*v)),
            ProtoDamage::LengthOffBy(i, _) => (i, None),
        };
        let prefixes = length_prefixes(&bytes);
        if prefixes.is_empty() {
            continue;
        }
        let (at, n) = prefixes[which % prefixes.len()];
        let old = varint(&bytes, at).map_or(0, |(v, _)| v);
        let value = match (new, d) {
            (Some(v), _) => v,
            (None, ProtoDamage::LengthOffBy(_, delta)) => {
                old.wrapping_add_signed(i64::from(*delta))
            }
            (None, _) => old,
        };
        bytes.splice(at..at + n, encode_varint(value));
    }
    bytes
}

/// One field of a protobuf message, as the wire format has it.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    Varint(u64, u64),
    Fixed64(u64, [u8; 8]),
    Fixed32(u64, [u8; 4]),
    /// A length-delimited payload that is not itself a message (a string, packed numbers, raw
    /// tensor data).
    Bytes(u64, Vec<u8>),
    /// A length-delimited payload that parses as a message.
    Message(u64, Vec<Field>),
}

/// Parses a message into its fields, descending into payloads that parse as messages; `None`
/// when the bytes are not a message.
fn parse_fields(bytes: &[u8], depth: usize) -> Option<Vec<Field>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let (tag, n) = varint(bytes, at)?;
        at += n;
        let number = tag >> 3;
        if number == 0 {
            return None;
        }
        out.push(match tag & 7 {
            0 => {
                let (v, n) = varint(bytes, at)?;
                at += n;
                Field::Varint(number, v)
            }
            1 => {
                let b = bytes.get(at..at + 8)?.try_into().ok()?;
                at += 8;
                Field::Fixed64(number, b)
            }
            5 => {
                let b = bytes.get(at..at + 4)?.try_into().ok()?;
                at += 4;
                Field::Fixed32(number, b)
            }
            2 => {
                let (len, n) = varint(bytes, at)?;
                at += n;
                let end = at.checked_add(usize::try_from(len).ok()?)?;
                let payload = bytes.get(at..end)?;
                at = end;
                match (depth < 16 && !payload.is_empty())
                    .then(|| parse_fields(payload, depth + 1))
                    .flatten()
                {
                    Some(inner) => Field::Message(number, inner),
                    None => Field::Bytes(number, payload.to_vec()),
                }
            }
            _ => return None,
        });
    }
    Some(out)
}

fn write_fields(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        let (number, wire) = match f {
            Field::Varint(n, _) => (n, 0),
            Field::Fixed64(n, _) => (n, 1),
            Field::Fixed32(n, _) => (n, 5),
            Field::Bytes(n, _) | Field::Message(n, _) => (n, 2),
        };
        out.extend(encode_varint(number << 3 | wire));
        match f {
            Field::Varint(_, v) => out.extend(encode_varint(*v)),
            Field::Fixed64(_, b) => out.extend_from_slice(b),
            Field::Fixed32(_, b) => out.extend_from_slice(b),
            Field::Bytes(_, b) => {
                out.extend(encode_varint(b.len() as u64));
                out.extend_from_slice(b);
            }
            Field::Message(_, inner) => {
                let mut payload = Vec::new();
                write_fields(inner, &mut payload);
                out.extend(encode_varint(payload.len() as u64));
                out.extend(payload);
            }
        }
    }
}

/// A change to one field of a parsed model that keeps the protobuf well formed, so the damage
/// reaches the importer's checks and the compiler stages behind them: a number set to a
/// boundary value (dims, types, attribute values, opsets, indices), a float set to a special
/// value, a field deleted or repeated, a string or payload cut short.
#[derive(Debug, Clone)]
pub enum FieldDamage {
    /// Varint field number `.0` (modulo their count) set to this value.
    Number(usize, u64),
    /// 32-bit field number `.0` set to these float bits.
    Float(usize, u32),
    /// Field number `.0` (of all fields, at any depth) removed.
    Delete(usize),
    /// Field number `.0` repeated right after itself.
    Repeat(usize),
    /// Payload number `.0` cut to this fraction (in 1/256) of its length.
    Cut(usize, u8),
}

/// Any [`FieldDamage`]; numbers include small ones (dims, types, enum codes) and negative ones.
pub fn field_damage() -> impl Strategy<Value = FieldDamage> {
    let number = prop_oneof![
        boundary_value(),
        0u64..40,
        (1i64..1 << 20).prop_map(|v| (-v) as u64),
    ];
    let float = prop_oneof![
        Just(f32::NAN.to_bits()),
        Just(f32::INFINITY.to_bits()),
        Just(f32::NEG_INFINITY.to_bits()),
        Just(f32::MAX.to_bits()),
        Just((-0.0f32).to_bits()),
        Just(1e-45f32.to_bits()),
        any::<u32>(),
    ];
    prop_oneof![
        4 => (any::<usize>(), number).prop_map(|(i, v)| FieldDamage::Number(i, v)),
        1 => (any::<usize>(), float).prop_map(|(i, v)| FieldDamage::Float(i, v)),
        2 => any::<usize>().prop_map(FieldDamage::Delete),
        1 => any::<usize>().prop_map(FieldDamage::Repeat),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, f)| FieldDamage::Cut(i, f)),
    ]
}

/// Visits every field, depth first, with the list that holds it and its index there.
fn visit_fields(
    fields: &mut Vec<Field>,
    f: &mut dyn FnMut(&mut Vec<Field>, usize) -> bool,
) -> bool {
    let mut i = 0;
    while i < fields.len() {
        if f(fields, i) {
            return true;
        }
        if let Some(Field::Message(_, inner)) = fields.get_mut(i)
            && visit_fields(inner, f)
        {
            return true;
        }
        i += 1;
    }
    false
}

/// Applies `damage` to the message `seed` (which must parse), re-encoding every length.
pub fn field_damaged(seed: &[u8], damage: &[FieldDamage]) -> Vec<u8> {
    let mut fields = parse_fields(seed, 0).expect("the seed is a protobuf message");
    for d in damage {
        let wanted = |f: &Field| match d {
            FieldDamage::Number(..) => matches!(f, Field::Varint(..)),
            FieldDamage::Float(..) => matches!(f, Field::Fixed32(..)),
            FieldDamage::Delete(_) | FieldDamage::Repeat(_) => true,
            FieldDamage::Cut(..) => matches!(f, Field::Bytes(..)),
        };
        let mut count = 0;
        visit_fields(&mut fields, &mut |list, i| {
            count += usize::from(wanted(&list[i]));
            false
        });
        if count == 0 {
            continue;
        }
        let (FieldDamage::Number(k, _)
        | FieldDamage::Float(k, _)
        | FieldDamage::Delete(k)
        | FieldDamage::Repeat(k)
        | FieldDamage::Cut(k, _)) = d;
        let mut target = k % count;
        visit_fields(&mut fields, &mut |list, i| {
            if !wanted(&list[i]) {
                return false;
            }
            if target > 0 {
                target -= 1;
                return false;
            }
            match (d, &mut list[i]) {
                (FieldDamage::Number(_, v), Field::Varint(_, old)) => *old = *v,
                (FieldDamage::Float(_, bits), Field::Fixed32(_, old)) => {
                    *old = bits.to_le_bytes();
                }
                (FieldDamage::Delete(_), _) => {
                    list.remove(i);
                }
                (FieldDamage::Repeat(_), _) => {
                    let copy = list[i].clone();
                    list.insert(i + 1, copy);
                }
                (FieldDamage::Cut(_, frac), Field::Bytes(_, b)) => {
                    b.truncate(b.len() * usize::from(*frac) / 256);
                }
                _ => {}
            }
            true
        });
    }
    let mut out = Vec::new();
    write_fields(&fields, &mut out);
    out
}

/// Imports `bytes`: an error naming the file, or a graph that passes the IR's check.
fn check_import(bytes: &[u8], file: &str) {
    match import(bytes, file) {
        Ok(imported) => {
            imported.model.graph.check().unwrap();
            let _ = imported.model.graph.dump();
        }
        Err(e) => assert!(e.to_string().starts_with(file), "{e}"),
    }
}

/// Compiles `bytes` with `seed`'s options: an error naming the file, or a model whose `.om`
/// reads back with the description the compiler made.
fn check_compile(bytes: &[u8], seed: &Seed) {
    match compile(bytes, seed.name, &seed.options()) {
        Ok(c) => {
            let om = c.om_bytes().unwrap();
            let file = OmFile::parse(&om).unwrap();
            assert_eq!(file.desc().unwrap(), c.desc);
        }
        Err(e) => assert!(e.to_string().contains(seed.name), "{e}"),
    }
}

/// Regression (fuzzing gear_image.onnx with one varint set to i64::MAX): a dim that large
/// went through shape inference and the Case output's element count overflowed (a panic);
/// tensors beyond `MAX_TENSOR_BYTES` are now an inference error.
#[test]
fn a_huge_dim_is_an_error_not_an_overflow() {
    let seed = SEEDS.iter().find(|s| s.name == "gear_image.onnx").unwrap();
    let bytes = field_damaged(
        seed.bytes(),
        &[FieldDamage::Number(3177456575056065892, i64::MAX as u64)],
    );
    check_compile(&bytes, seed);
    // The same through explicit pads that make a Conv's output too large to plan.
    use crate::onnx_build::{f32_init, model, node};
    use gearsim_compiler::onnx::proto::{AttributeProto, AttributeType};
    use prost::Message as _;
    let mut conv = node("Conv", "conv", &["x", "w"], &["y"]);
    conv.attribute.push(AttributeProto {
        name: "pads".into(),
        ints: vec![0, 0, 1 << 40, 0],
        r#type: AttributeType::Ints as i32,
        ..Default::default()
    });
    let m = model(
        17,
        vec![conv],
        &[("x", &[Some(1), Some(16), Some(8), Some(8)])],
        &[("y", &[Some(1), Some(16), Some(8), Some(8)])],
        vec![f32_init("w", &[16, 16, 1, 1], &[0.5; 256])],
    );
    let tiny = SEEDS.iter().find(|s| s.name == "tiny_add.onnx").unwrap();
    let e = compile(&m.encode_to_vec(), "pads.onnx", &tiny.options())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("pads.onnx: ") && e.contains("at most 1099511627776 bytes (1 TiB)"),
        "{e}"
    );
}

/// Regression: a size that overflows 64 bits made `TensorDesc::bytes` overflow (a panic in
/// debug builds); it is `None` now.
#[test]
fn tensor_bytes_do_not_overflow() {
    use gearsim_compiler::ir::{DataType, TensorDesc, fixed_shape};
    let d = TensorDesc::new(DataType::F32, fixed_shape(&[1 << 62, 8]));
    assert_eq!(d.bytes(), None);
    let d = TensorDesc::new(DataType::F64, fixed_shape(&[1 << 62]));
    assert_eq!(d.bytes(), None);
    let d = TensorDesc::new(DataType::F32, fixed_shape(&[1 << 60, 2]));
    assert_eq!(d.bytes(), Some(1 << 63));
    let d = TensorDesc::new(DataType::F64, fixed_shape(&[3, 0]));
    assert_eq!(d.bytes(), Some(0));
}

#[test]
fn every_model_parses_as_fields_and_writes_back_identically() {
    for seed in &SEEDS {
        assert_eq!(
            field_damaged(seed.bytes(), &[]),
            seed.bytes(),
            "{}",
            seed.name
        );
    }
}

#[test]
fn length_prefixes_are_found_in_every_model() {
    for seed in &SEEDS {
        let p = length_prefixes(seed.bytes());
        assert!(p.len() > 10, "{}: {} prefixes", seed.name, p.len());
        // Re-encoding each prefix with its own value changes nothing.
        assert_eq!(
            damaged(seed.bytes(), &[ProtoDamage::LengthOffBy(0, 0)]),
            seed.bytes()
        );
    }
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn random_bytes_are_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        timed("random ONNX bytes", || check_import(&bytes, "random.onnx"));
    }

    #[test]
    fn damaged_models_import_or_are_rejected(
        which in 0usize..SEEDS.len(),
        damage in proptest::collection::vec(proto_damage(), 1..4),
    ) {
        let seed = &SEEDS[which];
        let bytes = damaged(seed.bytes(), &damage);
        timed("damaged ONNX import", || check_import(&bytes, seed.name));
    }

    #[test]
    fn byte_damaged_models_import_or_are_rejected(
        which in 0usize..SEEDS.len(),
        damage in mutations(),
    ) {
        let seed = &SEEDS[which];
        let bytes = mutated(seed.bytes(), &damage);
        timed("damaged ONNX import", || check_import(&bytes, seed.name));
    }
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn field_damaged_models_import_or_are_rejected(
        which in 0usize..SEEDS.len(),
        damage in proptest::collection::vec(field_damage(), 1..4),
    ) {
        let seed = &SEEDS[which];
        let bytes = field_damaged(seed.bytes(), &damage);
        timed("field-damaged ONNX import", || check_import(&bytes, seed.name));
    }
}

proptest! {
    #![proptest_config(fuzz_config(64))]

    #[test]
    fn field_damaged_models_compile_or_are_rejected(
        which in 0usize..SEEDS.len(),
        damage in proptest::collection::vec(field_damage(), 1..4),
    ) {
        let seed = &SEEDS[which];
        let bytes = field_damaged(seed.bytes(), &damage);
        timed("field-damaged ONNX compile", || check_compile(&bytes, seed));
    }

    #[test]
    fn damaged_models_compile_or_are_rejected(
        which in 0usize..SEEDS.len(),
        damage in proptest::collection::vec(proto_damage(), 1..4),
    ) {
        let seed = &SEEDS[which];
        let bytes = damaged(seed.bytes(), &damage);
        timed("damaged ONNX compile", || check_compile(&bytes, seed));
    }
}

/// Regression (a 50 000-case fuzz run): ReduceSum's output field repeated, the first copy cut
/// to an empty name, gave the node a second output the graph output read; inference keeps
/// the operator's one output, so the read dangled and the Case pass indexed past the end (a
/// panic). Reading an output the operator does not have is now an inference error.
#[test]
fn reading_an_output_the_op_lacks_is_an_error() {
    let seed = SEEDS.iter().find(|s| s.name == "gear_dims.onnx").unwrap();
    let bytes = field_damaged(
        seed.bytes(),
        &[
            FieldDamage::Repeat(4030543306052388566),
            FieldDamage::Cut(17484777740227974222, 0),
        ],
    );
    check_compile(&bytes, seed);
    let e = compile(&bytes, seed.name, &seed.options())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ReduceSum") && e.contains("at most 1 outputs") && e.contains("output 1"),
        "{e}"
    );
}
