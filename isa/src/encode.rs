//! Fixed-width binary encoding of instructions, derived from the table.
//!
//! Every instruction is one 16-byte [`Word`]: byte 0 is the opcode, bytes 1..16 hold the
//! operand fields packed least-significant-bit first in declaration order. Bits past the last
//! field must be zero, so every word has exactly one meaning and `encode(decode(w)) == w`.

use thiserror::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::operand::{DType, FieldKind};
use crate::spec::{MAX_FIELDS, PAYLOAD_BITS, WORD_BYTES};
use crate::table::{Instruction, Opcode};

/// One encoded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Word {
    /// The opcode byte.
    pub opcode: u8,
    /// Operand bits, little-endian.
    pub payload: [u8; WORD_BYTES - 1],
}

/// An instruction whose operands do not fit their fields or break a table constraint.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// A field value is wider than the field.
    #[error("{mnemonic}: operand `{field}` = {value} does not fit in {bits} bits")]
    FieldWidth {
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// Field name.
        field: &'static str,
        /// The value, as a signed number for signed fields.
        value: i128,
        /// The field width.
        bits: u32,
    },
    /// The operands break a rule of the instruction (unsupported type, bad conversion).
    #[error("{mnemonic}: {reason}")]
    Constraint {
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A word that is not a valid instruction.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The opcode byte names no instruction.
    #[error("word {index} (byte offset {offset:#x}): unknown opcode {opcode:#04x} in {word}")]
    UnknownOpcode {
        /// Word index in the program.
        index: usize,
        /// Byte offset of the word.
        offset: usize,
        /// The opcode byte.
        opcode: u8,
        /// The whole word in hex.
        word: String,
    },
    /// A field holds a value that names nothing, or bits past the last field are set.
    #[error("word {index} (byte offset {offset:#x}, {mnemonic}): {reason} in {word}")]
    BadOperand {
        /// Word index in the program.
        index: usize,
        /// Byte offset of the word.
        offset: usize,
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// What is wrong.
        reason: String,
        /// The whole word in hex.
        word: String,
    },
    /// The byte length is not a whole number of words.
    #[error("program is {len} bytes, not a multiple of the {WORD_BYTES}-byte instruction word")]
    Length {
        /// Byte length.
        len: usize,
    },
}

impl Word {
    /// The word in hex, opcode first.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(2 * WORD_BYTES);
        for b in self.as_bytes() {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    fn payload_bits(&self) -> u128 {
        let mut bytes = [0u8; 16];
        bytes[..WORD_BYTES - 1].copy_from_slice(&self.payload);
        u128::from_le_bytes(bytes)
    }
}

impl Instruction {
    /// Checks the table's type list and the instruction's own operand rules.
    pub fn validate(&self) -> Result<(), String> {
        let spec = self.spec();
        if !spec.types.is_empty()
            && let Some(i) = spec.field_index("ty")
        {
            let mut raw = [0u64; MAX_FIELDS];
            self.raw_fields(&mut raw);
            let ty = usize::try_from(raw[i])
                .ok()
                .and_then(|i| DType::ALL.get(i).copied());
            if !ty.is_some_and(|t| spec.types.contains(&t)) {
                let allowed: Vec<&str> = spec.types.iter().map(|t| t.name()).collect();
                return Err(format!(
                    "element type {} is not supported (expected one of {})",
                    ty.map_or("?", DType::name),
                    allowed.join(", ")
                ));
            }
        }
        if let Instruction::CopyL0cToGm(f) = self
            && f.quant != crate::Quant::None
            && f.ty == DType::I32
        {
            return Err(format!(
                "quant={} dequantises to a float type, not i32",
                f.quant
            ));
        }
        // An instruction with a destination and a source type converts between them.
        if let (Some(d), Some(s)) = (spec.field_index("dst_ty"), spec.field_index("src_ty")) {
            let mut raw = [0u64; MAX_FIELDS];
            self.raw_fields(&mut raw);
            let ty = |i: usize| {
                usize::try_from(raw[i])
                    .ok()
                    .and_then(|i| DType::ALL.get(i).copied())
            };
            if let (Some(dst), Some(src)) = (ty(d), ty(s))
                && !conversion_supported(dst, src)
            {
                let known: Vec<String> = CONVERSIONS
                    .iter()
                    .map(|(d, s)| format!("{s}->{d}"))
                    .collect();
                return Err(format!(
                    "conversion {src} -> {dst} is not supported (supported: {})",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// The conversions `vconv` supports, as (destination, source).
pub const CONVERSIONS: &[(DType, DType)] = {
    use DType::{F16, F32, I32, U8};
    &[
        (F32, F16),
        (F16, F32),
        (I32, F32),
        (F32, I32),
        (I32, F16),
        (F16, I32),
        (F16, U8),
    ]
};

/// Whether `vconv` supports converting `src` to `dst`.
pub fn conversion_supported(dst: DType, src: DType) -> bool {
    CONVERSIONS.contains(&(dst, src))
}

/// Encodes one instruction.
pub fn encode(instr: &Instruction) -> Result<Word, EncodeError> {
    let spec = instr.spec();
    let mut raw = [0u64; MAX_FIELDS];
    let n = instr.raw_fields(&mut raw);
    let mut bits: u128 = 0;
    let mut shift = 0u32;
    for (field, &value) in spec.fields.iter().zip(&raw[..n]) {
        if !field.fits(value) {
            let shown = match field.kind {
                FieldKind::Signed => i128::from(value as i64),
                _ => i128::from(value),
            };
            return Err(EncodeError::FieldWidth {
                mnemonic: spec.mnemonic,
                field: field.name,
                value: shown,
                bits: field.bits,
            });
        }
        let mask = if field.bits == 64 {
            u64::MAX
        } else {
            (1u64 << field.bits) - 1
        };
        bits |= u128::from(value & mask) << shift;
        shift += field.bits;
    }
    instr.validate().map_err(|reason| EncodeError::Constraint {
        mnemonic: spec.mnemonic,
        reason,
    })?;
    let le = bits.to_le_bytes();
    let mut payload = [0u8; WORD_BYTES - 1];
    payload.copy_from_slice(&le[..WORD_BYTES - 1]);
    Ok(Word {
        opcode: spec.opcode,
        payload,
    })
}

/// Decodes one word; `index` is its position in the program (for error messages).
pub fn decode(word: &Word, index: usize) -> Result<Instruction, DecodeError> {
    let offset = index * WORD_BYTES;
    let opcode = Opcode::from_u8(word.opcode).ok_or_else(|| DecodeError::UnknownOpcode {
        index,
        offset,
        opcode: word.opcode,
        word: word.hex(),
    })?;
    let spec = opcode.spec();
    let bad = |reason: String| DecodeError::BadOperand {
        index,
        offset,
        mnemonic: spec.mnemonic,
        reason,
        word: word.hex(),
    };
    let bits = word.payload_bits();
    let mut raw = [0u64; MAX_FIELDS];
    let mut shift = 0u32;
    for (slot, field) in raw.iter_mut().zip(spec.fields) {
        let mask: u128 = (1u128 << field.bits) - 1;
        let mut v = ((bits >> shift) & mask) as u64;
        if field.kind == FieldKind::Signed && field.bits < 64 && (v >> (field.bits - 1)) & 1 == 1 {
            v |= u64::MAX << field.bits;
        }
        *slot = v;
        shift += field.bits;
    }
    if shift < PAYLOAD_BITS && (bits >> shift) != 0 {
        return Err(bad(format!(
            "bits {shift}..{PAYLOAD_BITS} past the last operand are not zero"
        )));
    }
    let instr = Instruction::from_raw_fields(opcode, &raw[..spec.fields.len()]).ok_or_else(|| {
        let which = spec
            .fields
            .iter()
            .zip(&raw)
            .find(|(f, v)| matches!(f.kind, FieldKind::Enum(names) if **v as usize >= names.len()))
            .map_or_else(|| "an operand".to_string(), |(f, v)| format!("operand `{}` = {v}", f.name));
        bad(format!("{which} names no value"))
    })?;
    instr.validate().map_err(bad)?;
    Ok(instr)
}

/// Encodes a sequence of instructions into bytes.
pub fn encode_all(instrs: &[Instruction]) -> Result<Vec<u8>, (usize, EncodeError)> {
    let mut out = Vec::with_capacity(instrs.len() * WORD_BYTES);
    for (i, instr) in instrs.iter().enumerate() {
        out.extend_from_slice(encode(instr).map_err(|e| (i, e))?.as_bytes());
    }
    Ok(out)
}

/// Decodes a byte string of whole words.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<Instruction>, DecodeError> {
    let words =
        <[Word]>::ref_from_bytes(bytes).map_err(|_| DecodeError::Length { len: bytes.len() })?;
    words
        .iter()
        .enumerate()
        .map(|(i, w)| decode(w, i))
        .collect()
}
