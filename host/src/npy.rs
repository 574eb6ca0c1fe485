//! NumPy's `.npy` array files to and from the compiler's [`Tensor`], so test inputs, reference
//! outputs and constants can move between gearsim and Python without a conversion step.
//!
//! ```text
//!   offset 0   \x93NUMPY  major minor  header_len (u16 in 1.0, u32 in 2.0 / 3.0, little-endian)
//!   offset 10 / 12        {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }  spaces  \n
//!   header_len bytes on   the elements, C order, count = product of the shape
//! ```
//!
//! Reading accepts format versions 1.0, 2.0 (wider header length) and 3.0 (UTF-8 header
//! instead of Latin-1), a header written by any NumPy (Python 2's `3L` integers included) and
//! one `descr` per IR element type: `<f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 |b1`, with `<`, `|` or `=`
//! as the byte order (`=` and a missing mark mean native, which gearsim takes to be
//! little-endian like every host it runs on and the simulated device). Everything else is a
//! typed [`NpyError`] naming the file and what was expected: big-endian data, Fortran order,
//! structured or unknown types, a malformed header, a shape that overflows or does not match
//! the data. Nothing is allocated from a header field before it has been checked against the
//! bytes actually present, so a hostile header costs no more than the file itself.
//!
//! Writing produces exactly what `numpy.save` (NumPy 1.23 and later) writes for the same
//! array: version 1.0, the keys in sorted order, the spare spaces NumPy leaves so the first
//! axis can grow in place, and padding so the data starts on a 64-byte boundary. The file is
//! written through `gearsim_traces::atomic` (a synced temporary file in the destination's
//! directory, renamed over it), so a failed write leaves no partial file and never clobbers an
//! existing one.
//!
//! ```
//! use gearsim_isa::tensor::Tensor;
//! use gearsim_host::npy;
//! use std::path::Path;
//!
//! let t = Tensor::from_f32s(vec![2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
//! let bytes = npy::encode(&t);
//! assert_eq!(bytes.len(), 128 + 24); // a 128-byte header, then 6 f32s
//! assert_eq!(npy::parse(&bytes, Path::new("x.npy")).unwrap(), t);
//! ```

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gearsim_isa::tensor::{DataType, Tensor};

/// The six bytes every `.npy` file starts with.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Data starts on a multiple of this many bytes (NumPy's `ARRAY_ALIGN`), so a reader can map
/// the file and use the elements in place.
const ARRAY_ALIGN: usize = 64;

/// NumPy leaves room after the header dict for the first axis to grow to this many digits
/// (`GROWTH_AXIS_MAX_DIGITS`), so arrays can be appended to in place; written to match it.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// The deepest bracket nesting the header parser follows. A real header nests two deep (a
/// dict holding a tuple, or a list of field tuples for structured types); the limit keeps a
/// hostile header from exhausting the stack.
const MAX_NESTING: usize = 16;

/// The keys a header dict holds, each exactly once.
const HEADER_KEYS: [&str; 3] = ["descr", "fortran_order", "shape"];

/// Why a `.npy` file could not be read or written. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The file could not be written; the destination was left as it was.
    #[error("{}: cannot write (the file was left as it was): {source}", .path.display())]
    Write {
        /// The destination.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The tensor handed to `write` is inconsistent, so there is no `.npy` for it.
    #[error("{}: cannot write the tensor: {problem}", .path.display())]
    InvalidTensor {
        /// The destination.
        path: PathBuf,
        /// What is wrong with the tensor, expected vs got.
        problem: String,
    },
    /// The file does not start with the `.npy` magic.
    #[error("{}: not an .npy file: expected the magic bytes \\x93NUMPY, got {got}", .path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first bytes, escaped.
        got: String,
    },
    /// The file ends inside a part its own fields declare.
    #[error(
        "{}: truncated: the {part} ends at byte {needed}, got a file of {got} bytes",
        .path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The part cut short (`magic`, `format version`, `header length`, `header`).
        part: &'static str,
        /// The file length the part needs.
        needed: u64,
        /// The file's length.
        got: u64,
    },
    /// A format version this reader does not know.
    #[error(
        "{}: unsupported .npy format version {major}.{minor}: expected 1.0, 2.0 or 3.0",
        .path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The header is not a Python dict literal.
    #[error(
        "{}: the header is not a valid Python dict literal: at header character {offset}, \
         expected {expected}, got {got}",
        .path.display()
    )]
    HeaderSyntax {
        /// The file.
        path: PathBuf,
        /// Character offset in the header text (after the length field).
        offset: usize,
        /// What would have been valid there.
        expected: &'static str,
        /// What is there, escaped.
        got: String,
    },
    /// The header dict parses but an entry is missing, extra, repeated or of the wrong type.
    #[error("{}: header entry '{key}': expected {expected}, got {got}", .path.display())]
    HeaderEntry {
        /// The file.
        path: PathBuf,
        /// The key (or the whole dict, as `<header>`).
        key: String,
        /// What the entry should be.
        expected: &'static str,
        /// What it is.
        got: String,
    },
    /// A `descr` that names no NumPy type this reader knows.
    #[error("{}: unknown dtype {descr}: expected one of {}", .path.display(), known_descrs())]
    UnknownDtype {
        /// The file.
        path: PathBuf,
        /// The `descr` value as written (Python syntax).
        descr: String,
    },
    /// A real NumPy type the compiler's IR has no element type for.
    #[error(
        "{}: dtype {descr} ({what}) has no element type in the compiler's IR: expected one of {}",
        .path.display(),
        known_descrs()
    )]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The `descr` value as written (Python syntax).
        descr: String,
        /// What NumPy calls the type.
        what: String,
    },
    /// Big-endian elements (the IR holds little-endian bytes only).
    #[error(
        "{}: dtype '{descr}' is big-endian: expected little-endian ('<', '|' or '='); convert \
         with a.astype(a.dtype.newbyteorder('<')) before saving",
        .path.display()
    )]
    BigEndian {
        /// The file.
        path: PathBuf,
        /// The `descr` string.
        descr: String,
    },
    /// Fortran (column-major) element order.
    #[error(
        "{}: fortran_order is True: expected a C-order array (save np.ascontiguousarray(a))",
        .path.display()
    )]
    FortranOrder {
        /// The file.
        path: PathBuf,
    },
    /// A shape entry that is no valid dimension.
    #[error(
        "{}: shape {shape}: dimension {index} is {value}: expected a size from 0 to 2^63-1",
        .path.display()
    )]
    BadDim {
        /// The file.
        path: PathBuf,
        /// The shape as written.
        shape: String,
        /// Which dimension.
        index: usize,
        /// Its value.
        value: i128,
    },
    /// A shape whose byte count does not fit a signed 64-bit integer.
    #[error(
        "{}: shape {shape} of {dtype}: the data size overflows a signed 64-bit integer",
        .path.display()
    )]
    ShapeOverflow {
        /// The file.
        path: PathBuf,
        /// The shape as written.
        shape: String,
        /// The element type.
        dtype: &'static str,
    },
    /// The data after the header is not exactly what the shape and type need.
    #[error(
        "{}: shape {shape} of {dtype} needs {expected} data bytes after the {offset}-byte \
         header, got {got}",
        .path.display()
    )]
    DataLength {
        /// The file.
        path: PathBuf,
        /// The shape as written.
        shape: String,
        /// The element type.
        dtype: &'static str,
        /// Where the data starts.
        offset: u64,
        /// Bytes the shape needs.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// A bool element that is neither 0 nor 1 (kernels assume one of the two).
    #[error("{}: bool element {index} is {value}: expected 0 or 1", .path.display())]
    BadBool {
        /// The file.
        path: PathBuf,
        /// Element index in C order.
        index: u64,
        /// Its byte.
        value: u8,
    },
}

/// The NumPy type code of an IR element type: kind letter and byte size, as in `descr`. The
/// ml_dtypes types (bfloat16, float8, int4, ...) have no NumPy code: `numpy.save` writes them
/// as raw void elements (`'<V2'`), so they are written that way and cannot be read back
/// without knowing the type (see [`HeaderProblem::UnsupportedDtype`]).
fn numpy_code(dtype: DataType) -> (char, usize) {
    match dtype {
        DataType::U16 => ('u', 2),
        DataType::U32 => ('u', 4),
        DataType::U64 => ('u', 8),
        DataType::BF16
        | DataType::F8E4M3FN
        | DataType::F8E4M3FNUZ
        | DataType::F8E5M2
        | DataType::F8E5M2FNUZ
        | DataType::U4
        | DataType::I4
        | DataType::F4E2M1
        | DataType::F8E8M0
        | DataType::U2
        | DataType::I2 => ('V', dtype.size()),
        DataType::F16 => ('f', 2),
        DataType::F32 => ('f', 4),
        DataType::F64 => ('f', 8),
        DataType::I8 => ('i', 1),
        DataType::I16 => ('i', 2),
        DataType::I32 => ('i', 4),
        DataType::I64 => ('i', 8),
        DataType::U8 => ('u', 1),
        DataType::Bool => ('b', 1),
    }
}

/// The `descr` `numpy.save` writes for an IR element type (`<f4`, `|u1`, ...).
pub fn descr(dtype: DataType) -> String {
    let (kind, size) = numpy_code(dtype);
    // NumPy marks single-byte types "not applicable" rather than little-endian.
    let order = if size == 1 { '|' } else { '<' };
    format!("{order}{kind}{size}")
}

/// Every accepted `descr` with its IR type, for error messages.
fn known_descrs() -> String {
    DataType::ALL
        .iter()
        .filter(|&&d| numpy_code(d).0 != 'V')
        .map(|&d| format!("'{}' ({})", descr(d), d.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads and checks the `.npy` file at `path`.
pub fn read(path: &Path) -> Result<Tensor, NpyError> {
    let bytes = fs::read(path).map_err(|source| NpyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes, path)
}

/// Decodes the bytes of a `.npy` file; `path_for_errors` is the name errors give the file.
pub fn parse(bytes: &[u8], path_for_errors: &Path) -> Result<Tensor, NpyError> {
    let path = || path_for_errors.to_path_buf();
    let file_len = bytes.len() as u64;
    let truncated = |part: &'static str, needed: usize| NpyError::Truncated {
        path: path(),
        part,
        needed: needed as u64,
        got: file_len,
    };

    let head = &bytes[..bytes.len().min(MAGIC.len())];
    if head != &MAGIC[..head.len()] {
        return Err(NpyError::BadMagic {
            path: path(),
            got: escape_bytes(&bytes[..bytes.len().min(8)]),
        });
    }
    if bytes.len() < MAGIC.len() {
        return Err(truncated("magic", MAGIC.len()));
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(&[major, minor]) => (major, minor),
        _ => return Err(truncated("format version", 8)),
    };
    let (length_bytes, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => {
            return Err(NpyError::Version {
                path: path(),
                major,
                minor,
            });
        }
    };
    let header_start = 8 + length_bytes;
    let length_field = bytes
        .get(8..header_start)
        .ok_or_else(|| truncated("header length", header_start))?;
    let header_len = length_field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    // Saturating: on a 32-bit host a 4 GiB length plus the prefix would wrap; saturated, it
    // lies past the end of any file and reads as truncated.
    let data_start = header_start.saturating_add(header_len);
    let header_bytes = bytes
        .get(header_start..data_start)
        .ok_or_else(|| truncated("header", data_start))?;

    let header = decode_header(header_bytes, utf8).map_err(|e| e.into_error(path()))?;
    let dict = Parser::new(&header)
        .header()
        .map_err(|e| e.into_error(path()))?;
    let fields = HeaderFields::from_dict(dict).map_err(|e| e.into_error(path()))?;

    let dtype = dtype_of(&fields.descr).map_err(|e| e.into_error(path()))?;
    if fields.fortran_order {
        return Err(NpyError::FortranOrder { path: path() });
    }
    let shape_text = shape_text(&fields.shape);
    let mut dims = Vec::with_capacity(fields.shape.len());
    for (index, &value) in fields.shape.iter().enumerate() {
        let dim = i64::try_from(value)
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| NpyError::BadDim {
                path: path(),
                shape: shape_text.clone(),
                index,
                value,
            })?;
        dims.push(dim);
    }
    let expected = byte_count(&dims, dtype).ok_or_else(|| NpyError::ShapeOverflow {
        path: path(),
        shape: shape_text.clone(),
        dtype: dtype.name(),
    })?;
    let data = &bytes[data_start..];
    if data.len() as u64 != expected {
        return Err(NpyError::DataLength {
            path: path(),
            shape: shape_text,
            dtype: dtype.name(),
            offset: data_start as u64,
            expected,
            got: data.len() as u64,
        });
    }
    if dtype == DataType::Bool
        && let Some((index, &value)) = data.iter().enumerate().find(|(_, b)| **b > 1)
    {
        return Err(NpyError::BadBool {
            path: path(),
            index: index as u64,
            value,
        });
    }
    Ok(Tensor {
        dtype,
        dims,
        data: Arc::new(data.to_vec()),
    })
}

/// The bytes `numpy.save` writes for `t`: a version 1.0 header padded so the data starts on a
/// 64-byte boundary (version 2.0 only if the header outgrows 1.0's 16-bit length, as NumPy
/// does), then the data as is. `t` is taken to be consistent (data length = product of the
/// dims × element size, no negative dim); [`write()`] checks that first, and [`parse()`] rejects
/// the bytes of an inconsistent tensor.
pub fn encode(t: &Tensor) -> Vec<u8> {
    let dims: Vec<i128> = t.dims.iter().map(|&d| i128::from(d)).collect();
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        descr(t.dtype),
        shape_text(&dims)
    );
    if let Some(first) = t.dims.first() {
        let digits = first.to_string().len();
        dict.push_str(&" ".repeat(GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits)));
    }
    // The newline ends the header; NumPy pads before it, and pads a whole block when the
    // header would already end on the boundary.
    let text_len = dict.len() + 1;
    let padded = |prefix: usize| text_len + ARRAY_ALIGN - (prefix + text_len) % ARRAY_ALIGN;
    let mut out = Vec::with_capacity(12 + padded(12) + t.data.len());
    out.extend_from_slice(MAGIC);
    let header_len = match u16::try_from(padded(10)) {
        Ok(len) => {
            out.extend_from_slice(&[1, 0]);
            out.extend_from_slice(&len.to_le_bytes());
            usize::from(len)
        }
        Err(_) => {
            let len = padded(12);
            out.extend_from_slice(&[2, 0]);
            out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
            len
        }
    };
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + header_len - text_len, b' ');
    out.push(b'\n');
    out.extend_from_slice(&t.data);
    out
}

/// Writes `t` to `path` as `.npy` (see [`encode`]), replacing the file only once the new one
/// is complete.
pub fn write(path: &Path, t: &Tensor) -> Result<(), NpyError> {
    check_tensor(t).map_err(|problem| NpyError::InvalidTensor {
        path: path.to_path_buf(),
        problem,
    })?;
    gearsim_traces::atomic::write_atomic(path, &encode(t)).map_err(|e| NpyError::Write {
        path: path.to_path_buf(),
        source: e.into_io(),
    })
}

/// Whether `t`'s data is exactly what its dims and type need.
fn check_tensor(t: &Tensor) -> Result<(), String> {
    if let Some((index, d)) = t.dims.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(format!(
            "dimension {index} of {:?} is {d}: expected a size >= 0",
            t.dims
        ));
    }
    match byte_count(&t.dims, t.dtype) {
        Some(n) if n == t.data.len() as u64 => Ok(()),
        Some(n) => Err(format!(
            "a {} tensor of shape {:?} needs {n} data bytes, got {}",
            t.dtype.name(),
            t.dims,
            t.data.len()
        )),
        None => Err(format!(
            "the data size of shape {:?} overflows a signed 64-bit integer",
            t.dims
        )),
    }
}

/// The data bytes of a shape (dims known to be >= 0), `None` when its size does not fit a
/// signed 64-bit integer. As NumPy does, the non-zero dims times the element size must fit even
/// when a zero dim makes the array empty, so no product of the dims overflows downstream.
fn byte_count(dims: &[i64], dtype: DataType) -> Option<u64> {
    let nonzero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size() as i64, |acc, &d| acc.checked_mul(d))?;
    Some(if dims.contains(&0) {
        0
    } else {
        nonzero.unsigned_abs()
    })
}

/// A shape in Python's tuple syntax: `()`, `(3,)`, `(2, 3)`.
fn shape_text(dims: &[i128]) -> String {
    match dims {
        [] => "()".into(),
        [d] => format!("({d},)"),
        _ => {
            let parts: Vec<String> = dims.iter().map(i128::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// Bytes as a Rust-escaped string literal (`"\x93NUMPY"`), for messages.
fn escape_bytes(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "an empty file".into();
    }
    let text: String = bytes
        .iter()
        .flat_map(|b| b.escape_ascii())
        .map(char::from)
        .collect();
    format!("\"{text}\"")
}

/// A header problem found before the path is known to the code that found it.
enum HeaderProblem {
    Syntax {
        offset: usize,
        expected: &'static str,
        got: String,
    },
    Entry {
        key: String,
        expected: &'static str,
        got: String,
    },
    UnknownDtype {
        descr: String,
    },
    UnsupportedDtype {
        descr: String,
        what: String,
    },
    BigEndian {
        descr: String,
    },
}

impl HeaderProblem {
    fn into_error(self, path: PathBuf) -> NpyError {
        match self {
            HeaderProblem::Syntax {
                offset,
                expected,
                got,
            } => NpyError::HeaderSyntax {
                path,
                offset,
                expected,
                got,
            },
            HeaderProblem::Entry { key, expected, got } => NpyError::HeaderEntry {
                path,
                key,
                expected,
                got,
            },
            HeaderProblem::UnknownDtype { descr } => NpyError::UnknownDtype { path, descr },
            HeaderProblem::UnsupportedDtype { descr, what } => {
                NpyError::UnsupportedDtype { path, descr, what }
            }
            HeaderProblem::BigEndian { descr } => NpyError::BigEndian { path, descr },
        }
    }
}

/// The header text as characters: Latin-1 in versions 1.0 and 2.0 (every byte is one
/// character), UTF-8 in 3.0.
fn decode_header(bytes: &[u8], utf8: bool) -> Result<Vec<char>, HeaderProblem> {
    if !utf8 {
        return Ok(bytes.iter().map(|&b| char::from(b)).collect());
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.chars().collect()),
        Err(e) => {
            let valid = bytes.get(..e.valid_up_to()).unwrap_or_default();
            let offset = String::from_utf8_lossy(valid).chars().count();
            let bad = bytes.get(e.valid_up_to()..).unwrap_or_default();
            Err(HeaderProblem::Syntax {
                offset,
                expected: "UTF-8 text (format version 3.0)",
                got: escape_bytes(&bad[..bad.len().min(4)]),
            })
        }
    }
}

/// A Python literal, as far as `.npy` headers use them.
#[derive(Debug, Clone, PartialEq)]
enum PyValue {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<PyValue>),
    List(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
}

impl fmt::Display for PyValue {
    /// Python's `repr`, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn items(f: &mut fmt::Formatter<'_>, items: &[PyValue]) -> fmt::Result {
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
            Ok(())
        }
        match self {
            PyValue::Str(s) => {
                f.write_str("'")?;
                for c in s.chars() {
                    match c {
                        '\'' => f.write_str("\\'")?,
                        '\\' => f.write_str("\\\\")?,
                        c if c.is_control() => write!(f, "{}", c.escape_default())?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("'")
            }
            PyValue::Int(v) => write!(f, "{v}"),
            PyValue::Bool(true) => f.write_str("True"),
            PyValue::Bool(false) => f.write_str("False"),
            PyValue::None => f.write_str("None"),
            PyValue::Tuple(v) => {
                f.write_str("(")?;
                items(f, v)?;
                f.write_str(if v.len() == 1 { ",)" } else { ")" })
            }
            PyValue::List(v) => {
                f.write_str("[")?;
                items(f, v)?;
                f.write_str("]")
            }
            PyValue::Dict(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl PyValue {
    /// The Python type's name, for messages.
    fn type_name(&self) -> &'static str {
        match self {
            PyValue::Str(_) => "str",
            PyValue::Int(_) => "int",
            PyValue::Bool(_) => "bool",
            PyValue::None => "NoneType",
            PyValue::Tuple(_) => "tuple",
            PyValue::List(_) => "list",
            PyValue::Dict(_) => "dict",
        }
    }

    /// `repr` with its type, shortened: `list [('a', '<f4')]`.
    fn describe(&self) -> String {
        let text = self.to_string();
        let short: String = text.chars().take(60).collect();
        let ellipsis = if short.len() < text.len() { "..." } else { "" };
        format!("{} {short}{ellipsis}", self.type_name())
    }
}

/// A recursive-descent parser of the Python literal subset `ast.literal_eval` gives NumPy:
/// str (single or double quotes, simple escapes), decimal int (optionally negative, with
/// Python 2's `L` suffix), `True`, `False`, `None`, tuples, lists and dicts.
struct Parser<'a> {
    text: &'a [char],
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a [char]) -> Parser<'a> {
        Parser {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// The whole header: one dict, then only the whitespace NumPy pads with.
    fn header(mut self) -> Result<Vec<(PyValue, PyValue)>, HeaderProblem> {
        self.skip_space();
        if self.peek() != Some('{') {
            return Err(self.fail("'{' opening the header dict"));
        }
        let PyValue::Dict(entries) = self.value()? else {
            return Err(self.fail("a dict"));
        };
        self.skip_space();
        if self.pos < self.text.len() {
            return Err(self.fail("only spaces and a newline after the dict"));
        }
        Ok(entries)
    }

    fn peek(&self) -> Option<char> {
        self.text.get(self.pos).copied()
    }

    fn fail(&self, expected: &'static str) -> HeaderProblem {
        let rest = self.text.get(self.pos..).unwrap_or_default();
        let got = if rest.is_empty() {
            "the end of the header".to_string()
        } else {
            let snippet: String = rest.iter().take(16).collect();
            format!("{snippet:?}")
        };
        HeaderProblem::Syntax {
            offset: self.pos,
            expected,
            got,
        }
    }

    /// Skips Python's whitespace (newlines are fine inside brackets and around the dict).
    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r' | '\x0c')) {
            self.pos += 1;
        }
    }

    /// Consumes `c` after optional whitespace if it is next.
    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<PyValue, HeaderProblem> {
        self.skip_space();
        match self.peek() {
            Some(q @ ('\'' | '"')) => self.string(q),
            Some(c) if c == '-' || c.is_ascii_digit() => self.int(),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => self.word(),
            Some(open @ ('(' | '[' | '{')) => {
                if self.depth >= MAX_NESTING {
                    return Err(self.fail("brackets nested at most 16 deep"));
                }
                self.depth += 1;
                self.pos += 1;
                let v = match open {
                    '(' => self.tuple(),
                    '[' => self.list(),
                    _ => self.dict(),
                };
                self.depth -= 1;
                v
            }
            _ => {
                Err(self.fail("a value (string, integer, True, False, None, tuple, list or dict)"))
            }
        }
    }

    fn string(&mut self, quote: char) -> Result<PyValue, HeaderProblem> {
        self.pos += 1;
        let mut s = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.fail("a closing quote"));
            };
            match c {
                c if c == quote => {
                    self.pos += 1;
                    return Ok(PyValue::Str(s));
                }
                '\n' => return Err(self.fail("a closing quote before the end of the line")),
                '\\' => {
                    self.pos += 1;
                    let escaped = match self.peek() {
                        Some('\\') => '\\',
                        Some('\'') => '\'',
                        Some('"') => '"',
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some('r') => '\r',
                        Some('0') => '\0',
                        _ => {
                            return Err(
                                self.fail("one of the escapes \\\\ \\' \\\" \\n \\t \\r \\0")
                            );
                        }
                    };
                    s.push(escaped);
                    self.pos += 1;
                }
                c => {
                    s.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn int(&mut self) -> Result<PyValue, HeaderProblem> {
        let negative = self.peek() == Some('-');
        if negative {
            self.pos += 1;
            self.skip_space();
        }
        if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
            return Err(self.fail("a decimal digit"));
        }
        let mut v: i128 = 0;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(10)) {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(i128::from(d)))
                .ok_or_else(|| self.fail("an integer below 2^127"))?;
            self.pos += 1;
        }
        // Python 2 wrote long integers with a suffix, and old NumPy files keep it.
        if matches!(self.peek(), Some('L' | 'l')) {
            self.pos += 1;
        }
        if self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
        {
            return Err(self.fail("a decimal integer (no float, hex or digit separators)"));
        }
        Ok(PyValue::Int(if negative { -v } else { v }))
    }

    fn word(&mut self) -> Result<PyValue, HeaderProblem> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        let word: String = self
            .text
            .get(start..self.pos)
            .unwrap_or_default()
            .iter()
            .collect();
        match word.as_str() {
            "True" => Ok(PyValue::Bool(true)),
            "False" => Ok(PyValue::Bool(false)),
            "None" => Ok(PyValue::None),
            _ => {
                self.pos = start;
                Err(self.fail("a literal (an identifier other than True, False or None is not)"))
            }
        }
    }

    /// Items up to `close`, separated by commas, a trailing comma allowed; also whether the
    /// last item was followed by a comma (which makes `(x,)` a tuple rather than `x`).
    fn items(&mut self, close: char) -> Result<(Vec<PyValue>, bool), HeaderProblem> {
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            if self.eat(close) {
                return Ok((items, trailing_comma));
            }
            if !items.is_empty() && !trailing_comma {
                return Err(self.fail(if close == ')' {
                    "',' or ')'"
                } else {
                    "',' or ']'"
                }));
            }
            items.push(self.value()?);
            trailing_comma = self.eat(',');
        }
    }

    fn tuple(&mut self) -> Result<PyValue, HeaderProblem> {
        let (mut items, trailing_comma) = self.items(')')?;
        // `(x)` is just `x` in parentheses; `(x,)` and `()` are tuples.
        if items.len() == 1 && !trailing_comma {
            return Ok(items.remove(0));
        }
        Ok(PyValue::Tuple(items))
    }

    fn list(&mut self) -> Result<PyValue, HeaderProblem> {
        Ok(PyValue::List(self.items(']')?.0))
    }

    fn dict(&mut self) -> Result<PyValue, HeaderProblem> {
        let mut entries = Vec::new();
        loop {
            if self.eat('}') {
                return Ok(PyValue::Dict(entries));
            }
            let key = self.value()?;
            if !self.eat(':') {
                return Err(self.fail("':' after a dict key"));
            }
            let value = self.value()?;
            entries.push((key, value));
            if !self.eat(',') {
                if self.eat('}') {
                    return Ok(PyValue::Dict(entries));
                }
                return Err(self.fail("',' or '}'"));
            }
        }
    }
}

/// The three header entries, each checked for its type.
struct HeaderFields {
    /// `descr`: a type string, or (for structured types) a list that is rejected later.
    descr: PyValue,
    fortran_order: bool,
    shape: Vec<i128>,
}

impl HeaderFields {
    fn from_dict(entries: Vec<(PyValue, PyValue)>) -> Result<HeaderFields, HeaderProblem> {
        let entry = |key: &str, expected: &'static str, got: String| HeaderProblem::Entry {
            key: key.to_string(),
            expected,
            got,
        };
        let mut found: [Option<PyValue>; 3] = [None, None, None];
        for (key, value) in entries {
            let PyValue::Str(name) = &key else {
                return Err(entry(
                    "<header>",
                    "string keys",
                    format!("the key {}", key.describe()),
                ));
            };
            let Some(slot) = HEADER_KEYS.iter().position(|k| k == name) else {
                return Err(entry(
                    name,
                    "only the keys 'descr', 'fortran_order' and 'shape'",
                    "an unknown key".into(),
                ));
            };
            if found[slot].replace(value).is_some() {
                return Err(entry(name, "the key once", "it twice".into()));
            }
        }
        let [descr, fortran_order, shape] = found;
        let descr = descr.ok_or_else(|| {
            entry(
                "descr",
                "a dtype string such as '<f4'",
                "no such key".into(),
            )
        })?;
        let fortran_order = match fortran_order {
            Some(PyValue::Bool(b)) => b,
            Some(other) => return Err(entry("fortran_order", "True or False", other.describe())),
            None => {
                return Err(entry(
                    "fortran_order",
                    "True or False",
                    "no such key".into(),
                ));
            }
        };
        let shape = match shape {
            Some(PyValue::Tuple(items)) => items
                .iter()
                .map(|v| match v {
                    PyValue::Int(i) => Ok(*i),
                    other => Err(entry(
                        "shape",
                        "a tuple of integers",
                        format!("an element {}", other.describe()),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => return Err(entry("shape", "a tuple of integers", other.describe())),
            None => return Err(entry("shape", "a tuple of integers", "no such key".into())),
        };
        Ok(HeaderFields {
            descr,
            fortran_order,
            shape,
        })
    }
}

/// The IR element type a `descr` names.
fn dtype_of(descr: &PyValue) -> Result<DataType, HeaderProblem> {
    let text = match descr {
        PyValue::Str(s) => s,
        PyValue::List(_) => {
            return Err(HeaderProblem::UnsupportedDtype {
                descr: descr.describe(),
                what: "a structured type with named fields".into(),
            });
        }
        other => {
            return Err(HeaderProblem::Entry {
                key: "descr".into(),
                expected: "a dtype string such as '<f4'",
                got: other.describe(),
            });
        }
    };
    let unknown = || HeaderProblem::UnknownDtype {
        descr: descr.to_string(),
    };
    let (order, code) = match text.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (Some(c), &text[c.len_utf8()..]),
        _ => (None, text.as_str()),
    };
    let mut chars = code.chars();
    let kind = chars.next().ok_or_else(unknown)?;
    let size_text = chars.as_str();
    if size_text.is_empty() || !size_text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unknown());
    }
    let size: usize = size_text.parse().map_err(|_| unknown())?;
    if kind == 'V' {
        return Err(HeaderProblem::UnsupportedDtype {
            descr: descr.to_string(),
            what: "raw void elements, as numpy.save writes ml_dtypes' bfloat16, float8 and \
                   int4 arrays; which of those they are is not recorded"
                .to_string(),
        });
    }
    let dtype = DataType::ALL
        .iter()
        .copied()
        .find(|&d| numpy_code(d) == (kind, size));
    let Some(dtype) = dtype else {
        return Err(unknown());
    };
    // A single byte has no byte order, so '>' only matters for wider types.
    if order == Some('>') && size > 1 {
        return Err(HeaderProblem::BigEndian {
            descr: text.clone(),
        });
    }
    Ok(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_literal(text: &str) -> Result<PyValue, HeaderProblem> {
        let chars: Vec<char> = text.chars().collect();
        Parser::new(&chars).value()
    }

    #[test]
    fn literals_parse_like_python() {
        let ok = |text: &str| match parse_literal(text) {
            Ok(v) => v.to_string(),
            Err(_) => format!("error in {text}"),
        };
        assert_eq!(ok("(3)"), "3");
        assert_eq!(ok("(3,)"), "(3,)");
        assert_eq!(ok("( )"), "()");
        assert_eq!(ok("(1, 2 ,)"), "(1, 2)");
        assert_eq!(
            ok("[('a', '<f4'), ('b', '|u1')]"),
            "[('a', '<f4'), ('b', '|u1')]"
        );
        assert_eq!(ok("\"it's\""), "'it\\'s'");
        assert_eq!(ok("(3L, 4l)"), "(3, 4)");
        assert_eq!(ok("- 7"), "-7");
        assert_eq!(ok("{'a': None}"), "{'a': None}");
        for bad in [
            "(1 2)", "Truex", "0x10", "1.5", "'open", "{'a' 1}", "[1,,]", "1_000",
        ] {
            assert!(parse_literal(bad).is_err(), "{bad} parsed");
        }
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert!(parse_literal(&deep).is_err());
    }

    #[test]
    fn descr_covers_every_ir_type_once() {
        for d in DataType::ALL {
            let text = PyValue::Str(descr(d));
            if numpy_code(d).0 == 'V' {
                assert!(
                    matches!(dtype_of(&text), Err(HeaderProblem::UnsupportedDtype { .. })),
                    "{d:?}"
                );
            } else {
                assert!(matches!(dtype_of(&text), Ok(t) if t == d), "{d:?}");
            }
        }
    }
}
