//! The calibration workloads as ONNX models: torchvision's ResNet-18 and ResNet-50 (v1.5: the
//! stride of a bottleneck sits on its 3×3 convolution) and MobileNetV2 with seeded random
//! weights, in the form `torch.onnx.export` gives an eval-mode model — each BatchNorm folded
//! into the convolution before it (a bias), then `Relu` (or ReLU6 as `Clip(0, 6)`), `MaxPool`,
//! residual `Add`, `GlobalAveragePool`, `Flatten` and `Gemm`. Timing does not depend on values, so random weights reproduce the measured
//! setup; they are scaled (He initialisation) so that a full-mode run stays finite.
//!
//! Built here rather than downloaded or exported so that `gearsim calibrate` needs nothing but
//! the binary: the structure is a public fact, the weights are made up.

use gearsim_compiler::onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};
use prost::Message as _;

/// A network the calibration table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Net {
    /// torchvision `resnet18`: BasicBlocks [2, 2, 2, 2].
    ResNet18,
    /// torchvision `resnet50` (v1.5): Bottlenecks [3, 4, 6, 3].
    ResNet50,
    /// torchvision `mobilenet_v2` (width 1.0): a 3×3/2 stem, 17 inverted residual blocks
    /// (1×1 expansion, 3×3 depthwise, 1×1 projection; ReLU6 after the first two) and a 1×1
    /// 1280-channel convolution before the classifier.
    MobileNetV2,
    /// BERT-base's encoder (`bertbase`): 12 layers of hidden size 768, 12 heads and a
    /// 3072-wide feed-forward at sequence length 128, post-LayerNorm as in the original BERT,
    /// GELU written with Erf as an opset-17 export writes it. The input is the embeddings' sum
    /// (`[batch, 128, 768]`; the lookup is left out) and no attention mask is applied.
    BertBase,
    /// One fp16 GEMM `m×k · k×n` (`gemmMxNxK` in the targets table): calibration.md §2's
    /// single-kernel rows.
    Gemm {
        /// Rows of the result.
        m: u32,
        /// Columns of the result.
        n: u32,
        /// The reduced dimension.
        k: u32,
    },
    /// One bf16 GEMM `m×k · k×n` of two inputs (`bgemmMxNxK` in the targets table): the
    /// bf16 figure of calibration.md §2's K11.
    Bf16Gemm {
        /// Rows of the result.
        m: u32,
        /// Columns of the result.
        n: u32,
        /// The reduced dimension.
        k: u32,
    },
    /// One int8 GEMM with a per-channel dequantisation (`qgemmMxNxK` in the targets table):
    /// `y[m, n] = f16(a[m, k] · w[k, n]) · scale[n]`, `a` int8 at run time, `w` an int8
    /// weight, as a quantised linear layer exports (MatMulInteger, Cast, Mul): calibration.md
    /// §2's K9 and K10.
    QuantGemm {
        /// Rows of the result.
        m: u32,
        /// Columns of the result.
        n: u32,
        /// The reduced dimension.
        k: u32,
    },
    /// One fp16 3×3 convolution, stride 1, padding 1, no bias (`convNxCxHxWxO` in the targets
    /// table): an `n×c×h×w` input to `o` channels, the shape of a hand-tiled NC1HWC0 kernel's
    /// measurements (the X2 rows; only the convolution's own kernel is timed).
    Conv {
        /// Images.
        n: u32,
        /// Input channels.
        c: u32,
        /// Input (and output) rows.
        h: u32,
        /// Input (and output) columns.
        w: u32,
        /// Output channels.
        o: u32,
    },
    /// calibration.md §2's K20 (`mixstartup`): an element-wise Add (a vector-core kernel) and a
    /// MatMul of its result with a bias (a MIX kernel), whose start-up delays are compared.
    MixStartup,
    /// One copy of `bytes` (`h2dBYTES`, `d2dBYTES`): calibration.md §2's K13 and K14.
    Copy {
        /// Which way.
        direction: CopyDirection,
        /// Bytes copied.
        bytes: u64,
    },
}

/// A single-product workload from its `m`, `n`, `k`.
type ProductNet = fn(u32, u32, u32) -> Net;

/// The direction of a copy row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyDirection {
    /// Host to device over PCIe (`h2d`).
    HostToDevice,
    /// Device to device on the SDMA engines (`d2d`): HBM read and written.
    DeviceToDevice,
}

impl CopyDirection {
    /// Both, in name order.
    pub const ALL: [CopyDirection; 2] =
        [CopyDirection::HostToDevice, CopyDirection::DeviceToDevice];

    /// `h2d` / `d2d`, the prefix of a copy row's name.
    pub fn prefix(self) -> &'static str {
        match self {
            CopyDirection::HostToDevice => "h2d",
            CopyDirection::DeviceToDevice => "d2d",
        }
    }
}

impl Net {
    /// The whole networks (not the single-kernel and copy workloads), by name.
    pub const NETWORKS: [Net; 4] = [
        Net::ResNet18,
        Net::ResNet50,
        Net::MobileNetV2,
        Net::BertBase,
    ];

    /// `resnet18` / `resnet50` / `gemm2048x4096x4000`, as the targets table spells them.
    pub fn name(self) -> String {
        match self {
            Net::ResNet18 => "resnet18".into(),
            Net::ResNet50 => "resnet50".into(),
            Net::MobileNetV2 => "mobilenetv2".into(),
            Net::Gemm { m, n, k } => format!("gemm{m}x{n}x{k}"),
            Net::QuantGemm { m, n, k } => format!("qgemm{m}x{n}x{k}"),
            Net::Bf16Gemm { m, n, k } => format!("bgemm{m}x{n}x{k}"),
            Net::Copy { direction, bytes } => format!("{}{bytes}", direction.prefix()),
            Net::Conv { n, c, h, w, o } => format!("conv{n}x{c}x{h}x{w}x{o}"),
            Net::MixStartup => "mixstartup".into(),
            Net::BertBase => "bertbase".into(),
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Net> {
        for direction in CopyDirection::ALL {
            if let Some(bytes) = s.strip_prefix(direction.prefix()) {
                return bytes
                    .parse()
                    .ok()
                    .filter(|b| *b > 0)
                    .map(|bytes| Net::Copy { direction, bytes });
            }
        }
        let products: [(&str, ProductNet); 3] = [
            ("gemm", |m, n, k| Net::Gemm { m, n, k }),
            ("qgemm", |m, n, k| Net::QuantGemm { m, n, k }),
            ("bgemm", |m, n, k| Net::Bf16Gemm { m, n, k }),
        ];
        // Positive dims joined by `x`.
        let dims = |d: &str| -> Option<Vec<u32>> {
            d.split('x')
                .map(|v| v.parse().ok().filter(|v| *v > 0))
                .collect()
        };
        if let Some(d) = s.strip_prefix("conv") {
            return match dims(d)?[..] {
                [n, c, h, w, o] => Some(Net::Conv { n, c, h, w, o }),
                _ => None,
            };
        }
        for (prefix, net) in products {
            if let Some(d) = s.strip_prefix(prefix) {
                return match dims(d)?[..] {
                    [m, n, k] => Some(net(m, n, k)),
                    _ => None,
                };
            }
        }
        Net::NETWORKS
            .into_iter()
            .chain([Net::MixStartup])
            .find(|n| n.name() == s)
    }

    /// The whole network named `s` (one of [`Net::NETWORKS`]).
    pub fn network(s: &str) -> Option<Net> {
        Net::parse(s).filter(|n| Net::NETWORKS.contains(n))
    }

    /// The names of [`Net::NETWORKS`], comma-separated (for messages).
    pub fn network_names() -> String {
        let names: Vec<String> = Net::NETWORKS.iter().map(|n| n.name()).collect();
        names.join(", ")
    }

    /// Whether the workload is a model (a copy row runs none).
    pub fn is_model(self) -> bool {
        !matches!(self, Net::Copy { .. })
    }

    /// Multiply-accumulates of one image (convolutions and the classifier), of one sequence
    /// (BERT), or of the GEMM.
    pub fn macs_per_image(self) -> u64 {
        match self {
            Net::Gemm { m, n, k } | Net::QuantGemm { m, n, k } | Net::Bf16Gemm { m, n, k } => {
                return u64::from(m) * u64::from(n) * u64::from(k);
            }
            Net::Conv { n, c, h, w, o } => {
                return [n, c, h, w, o, 9].iter().map(|&v| u64::from(v)).product();
            }
            Net::Copy { .. } => return 0,
            Net::MixStartup => return 64 * 64 * 64,
            Net::ResNet18 | Net::ResNet50 | Net::MobileNetV2 | Net::BertBase => {}
        }
        let mut b = Builder::new(DType::F32, 0);
        b.count_only = true;
        self.build_into(&mut b);
        b.macs
    }

    fn build_into(self, b: &mut Builder) {
        let blocks: &[usize] = match self {
            Net::ResNet18 => &[2, 2, 2, 2],
            Net::ResNet50 => &[3, 4, 6, 3],
            Net::BertBase => {
                b.encoder(&BERT_BASE);
                return;
            }
            Net::MobileNetV2 => {
                let x = b.mobilenet_v2();
                b.head(x);
                return;
            }
            Net::Gemm { .. }
            | Net::QuantGemm { .. }
            | Net::Bf16Gemm { .. }
            | Net::Conv { .. }
            | Net::Copy { .. }
            | Net::MixStartup => {
                return;
            }
        };
        let x = b.stem();
        let x = b.layers(x, blocks, self == Net::ResNet50);
        b.head(x);
    }

    /// The ONNX model for `batch` images (`batch` ≤ 0: a `-1` batch axis) in element type
    /// `dtype`, weights drawn from `seed`; a GEMM is one fp16 MatMul of two inputs whatever
    /// the arguments.
    pub fn onnx(self, batch: i64, dtype: DType, seed: u64) -> Vec<u8> {
        match self {
            Net::Gemm { m, n, k } => return gemm_onnx(m, n, k, DType::F16.onnx()),
            Net::Bf16Gemm { m, n, k } => return gemm_onnx(m, n, k, BFLOAT16),
            Net::QuantGemm { m, n, k } => return quant_gemm_onnx(m, n, k, seed),
            Net::Conv { n, c, h, w, o } => return conv_onnx([n, c, h, w, o], seed),
            // A copy runs no model (`is_model`); the smallest GEMM stands in.
            Net::Copy { .. } => return gemm_onnx(1, 1, 1, DType::F16.onnx()),
            Net::MixStartup => return mix_startup_onnx(),
            Net::ResNet18 | Net::ResNet50 | Net::MobileNetV2 | Net::BertBase => {}
        }
        let mut b = Builder::new(dtype, seed);
        self.build_into(&mut b);
        let dims: &[i64] = if self == Net::BertBase {
            &[batch, BERT_BASE.seq, BERT_BASE.hidden]
        } else {
            &[batch, 3, 224, 224]
        };
        let out: &[i64] = if self == Net::BertBase {
            dims
        } else {
            &[batch, 1000]
        };
        b.finish(&self.name(), dims, out)
    }
}

/// The shape of a BERT-style encoder.
#[derive(Debug, Clone, Copy)]
pub struct Encoder {
    /// Layers.
    pub layers: usize,
    /// Sequence length.
    pub seq: i64,
    /// Hidden size.
    pub hidden: i64,
    /// Attention heads.
    pub heads: i64,
    /// Feed-forward width.
    pub ffn: i64,
}

/// BERT-base (Devlin et al. 2018) at sequence length 128.
pub const BERT_BASE: Encoder = Encoder {
    layers: 12,
    seq: 128,
    hidden: 768,
    heads: 12,
    ffn: 3072,
};

/// Element type of the model's inputs, weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// float32 (as exported; atc's precision mode decides what the chip computes in).
    F32,
    /// float16 (a model converted to fp16 before compiling).
    F16,
}

impl DType {
    fn onnx(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::F16 => 10,
        }
    }
}

/// The activation after a convolution.
#[derive(Debug, Clone, Copy)]
enum Act {
    None,
    Relu,
    /// `min(max(x, 0), 6)`.
    Relu6,
}

/// A value flowing through the graph: its name, channels and spatial size.
#[derive(Debug, Clone)]
struct Value {
    name: String,
    c: i64,
    hw: i64,
}

struct Builder {
    dtype: DType,
    rng: u64,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    macs: u64,
    /// Count MACs only (no tensors drawn).
    count_only: bool,
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: 7,
        ..Default::default()
    }
}

/// An integer attribute.
pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: v,
        r#type: 2,
        ..Default::default()
    }
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: v,
        r#type: 1,
        ..Default::default()
    }
}

impl Builder {
    fn new(dtype: DType, seed: u64) -> Builder {
        Builder {
            dtype,
            rng: seed ^ 0x2545_f491_4f6c_dd1d,
            nodes: Vec::new(),
            inits: Vec::new(),
            macs: 0,
            count_only: false,
        }
    }

    /// A uniform draw in [-1, 1) (64-bit LCG, high bits).
    fn draw(&mut self) -> f32 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// An initializer of `dims` with values uniform in ±`scale`.
    fn weight(&mut self, name: &str, dims: &[i64], scale: f32) -> String {
        if self.count_only {
            return name.into();
        }
        let n: i64 = dims.iter().product();
        let mut raw = Vec::with_capacity(n as usize * 4);
        for _ in 0..n {
            let v = self.draw() * scale;
            match self.dtype {
                DType::F32 => raw.extend_from_slice(&v.to_le_bytes()),
                DType::F16 => raw.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            }
        }
        self.inits.push(TensorProto {
            dims: dims.to_vec(),
            data_type: self.dtype.onnx(),
            name: name.into(),
            raw_data: Some(raw),
            ..Default::default()
        });
        name.into()
    }

    fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: Vec<String>,
        attrs: Vec<AttributeProto>,
    ) -> String {
        let out = format!("{name}_output_0");
        self.nodes.push(op_node(op, name, inputs, &out, attrs));
        out
    }

    /// A convolution with its BatchNorm folded in (a bias), optionally followed by ReLU.
    fn conv(&mut self, x: &Value, name: &str, c: i64, k: i64, stride: i64, relu: bool) -> Value {
        let act = if relu { Act::Relu } else { Act::None };
        self.conv_grouped(x, name, (c, k, stride, 1), act)
    }

    /// A convolution of `(out channels, kernel size, stride, groups)` with its BatchNorm
    /// folded in (a bias), then `act`.
    fn conv_grouped(
        &mut self,
        x: &Value,
        name: &str,
        (c, k, stride, groups): (i64, i64, i64, i64),
        act: Act,
    ) -> Value {
        let pad = k / 2;
        let hw = (x.hw + 2 * pad - k) / stride + 1;
        let per_group = x.c / groups;
        self.macs += (c * per_group * k * k * hw * hw) as u64;
        let fan_in = (per_group * k * k) as f32;
        let w = self.weight(
            &format!("{name}.weight"),
            &[c, per_group, k, k],
            (6.0 / fan_in).sqrt(),
        );
        let b = self.weight(&format!("{name}.bias"), &[c], 0.1);
        let y = self.node(
            "Conv",
            &format!("/{name}/Conv"),
            vec![x.name.clone(), w, b],
            vec![
                ints("dilations", &[1, 1]),
                int("group", groups),
                ints("kernel_shape", &[k, k]),
                ints("pads", &[pad, pad, pad, pad]),
                ints("strides", &[stride, stride]),
            ],
        );
        let y = match act {
            Act::None => y,
            Act::Relu => self.node("Relu", &format!("/{name}/Relu"), vec![y], vec![]),
            Act::Relu6 => {
                // torch.onnx exports ReLU6 as Clip with its bounds as inputs.
                let (lo, hi) = (self.scalar("relu6_min", 0.0), self.scalar("relu6_max", 6.0));
                self.node("Clip", &format!("/{name}/Clip"), vec![y, lo, hi], vec![])
            }
        };
        Value { name: y, c, hw }
    }

    /// MobileNetV2's features (Sandler et al. 2018, table 2: expansion t, channels c,
    /// repeats n, stride s), up to the 1280-channel convolution.
    fn mobilenet_v2(&mut self) -> Value {
        const BLOCKS: [(i64, i64, usize, i64); 7] = [
            (1, 16, 1, 1),
            (6, 24, 2, 2),
            (6, 32, 3, 2),
            (6, 64, 4, 2),
            (6, 96, 3, 1),
            (6, 160, 3, 2),
            (6, 320, 1, 1),
        ];
        let x = Value {
            name: "input".into(),
            c: 3,
            hw: 224,
        };
        let mut x = self.conv_grouped(&x, "features.0", (32, 3, 2, 1), Act::Relu6);
        let mut i = 1;
        for (t, c, n, s) in BLOCKS {
            for j in 0..n {
                let stride = if j == 0 { s } else { 1 };
                x = self.inverted_residual(&x, &format!("features.{i}"), c, stride, t);
                i += 1;
            }
        }
        self.conv_grouped(&x, &format!("features.{i}"), (1280, 1, 1, 1), Act::Relu6)
    }

    /// One inverted residual block: expansion by `t` (none when 1), depthwise 3×3 at `stride`,
    /// linear projection to `out`, and the shortcut when the shape is kept.
    fn inverted_residual(&mut self, x: &Value, p: &str, out: i64, stride: i64, t: i64) -> Value {
        let hidden = x.c * t;
        let mut y = x.clone();
        if t != 1 {
            y = self.conv_grouped(&y, &format!("{p}/conv.0"), (hidden, 1, 1, 1), Act::Relu6);
        }
        let y = self.conv_grouped(
            &y,
            &format!("{p}/conv.1"),
            (hidden, 3, stride, hidden),
            Act::Relu6,
        );
        let y = self.conv_grouped(&y, &format!("{p}/conv.2"), (out, 1, 1, 1), Act::None);
        if stride != 1 || x.c != out {
            return y;
        }
        let s = self.node(
            "Add",
            &format!("/{p}/Add"),
            vec![x.name.clone(), y.name.clone()],
            vec![],
        );
        Value { name: s, ..y }
    }

    /// conv1 (7×7/2, BN, ReLU) and the 3×3/2 max pool.
    fn stem(&mut self) -> Value {
        let x = Value {
            name: "input".into(),
            c: 3,
            hw: 224,
        };
        let x = self.conv(&x, "conv1", 64, 7, 2, true);
        let hw = (x.hw + 2 - 3) / 2 + 1;
        let y = self.node(
            "MaxPool",
            "/maxpool/MaxPool",
            vec![x.name],
            vec![
                int("ceil_mode", 0),
                ints("kernel_shape", &[3, 3]),
                ints("pads", &[1, 1, 1, 1]),
                ints("strides", &[2, 2]),
            ],
        );
        Value { name: y, c: 64, hw }
    }

    /// The four stages of BasicBlocks or Bottlenecks.
    fn layers(&mut self, mut x: Value, blocks: &[usize], bottleneck: bool) -> Value {
        for (stage, &n) in blocks.iter().enumerate() {
            let width = 64i64 << stage;
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                let p = format!("layer{}.{i}", stage + 1);
                x = if bottleneck {
                    self.bottleneck(&x, &p, width, stride)
                } else {
                    self.basic(&x, &p, width, stride)
                };
            }
        }
        x
    }

    fn residual(&mut self, p: &str, y: &Value, shortcut: &Value) -> Value {
        let s = self.node(
            "Add",
            &format!("/{p}/Add"),
            vec![y.name.clone(), shortcut.name.clone()],
            vec![],
        );
        let r = self.node("Relu", &format!("/{p}/relu/Relu"), vec![s], vec![]);
        Value {
            name: r,
            c: y.c,
            hw: y.hw,
        }
    }

    fn basic(&mut self, x: &Value, p: &str, c: i64, stride: i64) -> Value {
        let y = self.conv(x, &format!("{p}/conv1"), c, 3, stride, true);
        let y = self.conv(&y, &format!("{p}/conv2"), c, 3, 1, false);
        let shortcut = if stride != 1 || x.c != c {
            self.conv(
                x,
                &format!("{p}/downsample/downsample.0"),
                c,
                1,
                stride,
                false,
            )
        } else {
            x.clone()
        };
        self.residual(p, &y, &shortcut)
    }

    fn bottleneck(&mut self, x: &Value, p: &str, width: i64, stride: i64) -> Value {
        let out = width * 4;
        let y = self.conv(x, &format!("{p}/conv1"), width, 1, 1, true);
        let y = self.conv(&y, &format!("{p}/conv2"), width, 3, stride, true);
        let y = self.conv(&y, &format!("{p}/conv3"), out, 1, 1, false);
        let shortcut = if stride != 1 || x.c != out {
            self.conv(
                x,
                &format!("{p}/downsample/downsample.0"),
                out,
                1,
                stride,
                false,
            )
        } else {
            x.clone()
        };
        self.residual(p, &y, &shortcut)
    }

    /// Global average pool, flatten and the 1000-class fully connected layer.
    fn head(&mut self, x: Value) {
        let p = self.node(
            "GlobalAveragePool",
            "/avgpool/GlobalAveragePool",
            vec![x.name],
            vec![],
        );
        let f = self.node("Flatten", "/Flatten", vec![p], vec![int("axis", 1)]);
        self.macs += (x.c * 1000) as u64;
        let w = self.weight("fc.weight", &[1000, x.c], (1.0 / x.c as f32).sqrt());
        let b = self.weight("fc.bias", &[1000], 0.01);
        // The graph output is named `output`, as the exports of torchvision models name it.
        self.nodes.push(op_node(
            "Gemm",
            "/fc/Gemm",
            vec![f, w, b],
            "output",
            vec![float("alpha", 1.0), float("beta", 1.0), int("transB", 1)],
        ));
    }

    /// The model: graph input `input` of `dims`, output `output` of `out` (a dim <= 0 is the
    /// batch parameter).
    fn finish(self, name: &str, dims: &[i64], out: &[i64]) -> Vec<u8> {
        let elem = self.dtype.onnx();
        model_bytes(
            name,
            self.nodes,
            self.inits,
            vec![value_info("input", elem, dims)],
            vec![value_info("output", elem, out)],
        )
    }

    /// An int64 initializer (shapes and permutations are not weights: no draw, any dtype).
    fn int64s(&mut self, name: &str, values: &[i64]) -> String {
        if !self.count_only && !self.inits.iter().any(|t| t.name == name) {
            self.inits.push(TensorProto {
                dims: vec![values.len() as i64],
                data_type: 7,
                name: name.into(),
                raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                ..Default::default()
            });
        }
        name.into()
    }

    /// A scalar constant of the model's element type.
    fn scalar(&mut self, name: &str, v: f32) -> String {
        if !self.count_only && !self.inits.iter().any(|t| t.name == name) {
            let raw = match self.dtype {
                DType::F32 => v.to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            };
            self.inits.push(TensorProto {
                dims: Vec::new(),
                data_type: self.dtype.onnx(),
                name: name.into(),
                raw_data: Some(raw),
                ..Default::default()
            });
        }
        name.into()
    }

    /// `x · W + b` over the last axis (`rows` rows a sequence, for the MAC count).
    fn linear(&mut self, x: String, p: &str, rows: i64, n_in: i64, n_out: i64) -> String {
        self.macs += (rows * n_in * n_out) as u64;
        let w = self.weight(
            &format!("{p}.weight"),
            &[n_in, n_out],
            (3.0 / n_in as f32).sqrt(),
        );
        let b = self.weight(&format!("{p}.bias"), &[n_out], 0.02);
        let y = self.node("MatMul", &format!("/{p}/MatMul"), vec![x, w], vec![]);
        self.node("Add", &format!("/{p}/Add"), vec![y, b], vec![])
    }

    /// `LayerNormalization(a + b)` over the hidden axis.
    fn add_norm(&mut self, a: String, b: String, p: &str, hidden: i64) -> String {
        let s = self.node("Add", &format!("/{p}/Add"), vec![a, b], vec![]);
        let g = self.weight(&format!("{p}.LayerNorm.weight"), &[hidden], 1.0);
        let beta = self.weight(&format!("{p}.LayerNorm.bias"), &[hidden], 0.02);
        self.node(
            "LayerNormalization",
            &format!("/{p}/LayerNorm/LayerNormalization"),
            vec![s, g, beta],
            vec![int("axis", -1), float("epsilon", 1e-12)],
        )
    }

    /// `x` as `[batch, seq, heads, head]` transposed by `perm`.
    fn split_heads(&mut self, x: String, p: &str, e: &Encoder, perm: &[i64]) -> String {
        let shape = self.int64s("heads_shape", &[0, 0, e.heads, e.hidden / e.heads]);
        let r = self.node("Reshape", &format!("/{p}/Reshape"), vec![x, shape], vec![]);
        self.node(
            "Transpose",
            &format!("/{p}/Transpose"),
            vec![r],
            vec![ints("perm", perm)],
        )
    }

    /// The encoder's layers over the graph input `input`; the last one's result is `output`.
    fn encoder(&mut self, e: &Encoder) {
        let (s, h) = (e.seq, e.hidden);
        let head = h / e.heads;
        let mut x = "input".to_string();
        for i in 0..e.layers {
            let p = format!("encoder/layer.{i}");
            let a = format!("{p}/attention/self");
            let q = self.linear(x.clone(), &format!("{a}/query"), s, h, h);
            let k = self.linear(x.clone(), &format!("{a}/key"), s, h, h);
            let v = self.linear(x.clone(), &format!("{a}/value"), s, h, h);
            let q = self.split_heads(q, &format!("{a}/query"), e, &[0, 2, 1, 3]);
            let k = self.split_heads(k, &format!("{a}/key"), e, &[0, 2, 3, 1]);
            let v = self.split_heads(v, &format!("{a}/value"), e, &[0, 2, 1, 3]);
            self.macs += (2 * e.heads * s * s * head) as u64;
            let scores = self.node("MatMul", &format!("/{a}/MatMul"), vec![q, k], vec![]);
            let scale = self.scalar("head_scale", (head as f32).sqrt());
            let scores = self.node("Div", &format!("/{a}/Div"), vec![scores, scale], vec![]);
            let probs = self.node(
                "Softmax",
                &format!("/{a}/Softmax"),
                vec![scores],
                vec![int("axis", -1)],
            );
            let ctx = self.node("MatMul", &format!("/{a}/MatMul_1"), vec![probs, v], vec![]);
            let ctx = self.node(
                "Transpose",
                &format!("/{a}/Transpose_3"),
                vec![ctx],
                vec![ints("perm", &[0, 2, 1, 3])],
            );
            let hidden_shape = self.int64s("hidden_shape", &[0, 0, h]);
            let ctx = self.node(
                "Reshape",
                &format!("/{a}/Reshape_3"),
                vec![ctx, hidden_shape],
                vec![],
            );
            let o = self.linear(ctx, &format!("{p}/attention/output/dense"), s, h, h);
            let x1 = self.add_norm(o, x, &format!("{p}/attention/output"), h);
            let f = self.linear(x1.clone(), &format!("{p}/intermediate/dense"), s, h, e.ffn);
            // GELU as 0.5 · f · (1 + erf(f / √2)).
            let g = format!("{p}/intermediate/intermediate_act_fn");
            let sqrt2 = self.scalar("sqrt2", std::f32::consts::SQRT_2);
            let one = self.scalar("one", 1.0);
            let half = self.scalar("half", 0.5);
            let d = self.node("Div", &format!("/{g}/Div"), vec![f.clone(), sqrt2], vec![]);
            let d = self.node("Erf", &format!("/{g}/Erf"), vec![d], vec![]);
            let d = self.node("Add", &format!("/{g}/Add"), vec![d, one], vec![]);
            let d = self.node("Mul", &format!("/{g}/Mul"), vec![f, d], vec![]);
            let act = self.node("Mul", &format!("/{g}/Mul_1"), vec![d, half], vec![]);
            let y = self.linear(act, &format!("{p}/output/dense"), s, e.ffn, h);
            x = self.add_norm(y, x1, &format!("{p}/output"), h);
        }
        // The graph output is named `output`.
        if let Some(last) = self.nodes.last_mut() {
            last.output = vec!["output".into()];
        }
    }
}

/// A node of one output.
pub fn op_node(
    op: &str,
    name: &str,
    inputs: Vec<String>,
    output: &str,
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: inputs,
        output: vec![output.into()],
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

/// A graph input or output of element type `elem` (a dim ≤ 0 is the `batch` parameter).
pub fn value_info(n: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    use tensor_shape_proto::dimension::Value as D;
    ValueInfoProto {
        name: n.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(if d > 0 {
                                D::DimValue(d)
                            } else {
                                D::DimParam("batch".into())
                            }),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            })),
        }),
        doc_string: String::new(),
    }
}

/// An opset-17 model of one graph.
pub fn model_bytes(
    name: &str,
    node: Vec<NodeProto>,
    initializer: Vec<TensorProto>,
    input: Vec<ValueInfoProto>,
    output: Vec<ValueInfoProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "gearsim calibrate".into(),
        graph: Some(GraphProto {
            node,
            name: name.into(),
            initializer,
            input,
            output,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// ONNX's element type code of bfloat16.
const BFLOAT16: i32 = 16;

/// One GEMM `y[m, n] = a[m, k] · b[k, n]` of ONNX element type `elem` (fp16 or bf16), both
/// operands graph inputs, as calibration.md §2's kernel rows measure it (their output is fp32;
/// this one's is of the operands' type, see the row notes).
fn gemm_onnx(m: u32, n: u32, k: u32, elem: i32) -> Vec<u8> {
    let f16 = elem;
    let node = op_node("MatMul", "gemm", vec!["a".into(), "b".into()], "y", vec![]);
    let (m, n, k) = (i64::from(m), i64::from(n), i64::from(k));
    model_bytes(
        "gemm",
        vec![node],
        Vec::new(),
        vec![value_info("a", f16, &[m, k]), value_info("b", f16, &[k, n])],
        vec![value_info("y", f16, &[m, n])],
    )
}

/// `y[m, n] = f16(MatMulInteger(a[m, k], w[k, n])) · scale[n]`: an int8 input, seeded int8
/// weights in [-127, 127] and per-channel fp16 scales around 1/(127² k) (so that a full-mode
/// run stays in fp16's range).
fn quant_gemm_onnx(m: u32, n: u32, k: u32, seed: u64) -> Vec<u8> {
    use rand::{RngExt, SeedableRng};
    let (m, n, k) = (i64::from(m), i64::from(n), i64::from(k));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let weights: Vec<u8> = (0..k * n)
        .map(|_| rng.random_range(-127i32..=127) as i8 as u8)
        .collect();
    let base = 1.0 / (127.0 * 127.0 * (k as f32).sqrt());
    let scales: Vec<u8> = (0..n)
        .flat_map(|_| half::f16::from_f32(base * rng.random_range(0.5f32..2.0)).to_le_bytes())
        .collect();
    let init = |name: &str, data_type: i32, dims: Vec<i64>, raw: Vec<u8>| TensorProto {
        dims,
        data_type,
        name: name.into(),
        raw_data: Some(raw),
        ..Default::default()
    };
    let (int8, f16) = (3, DType::F16.onnx());
    let nodes = vec![
        op_node(
            "MatMulInteger",
            "qgemm",
            vec!["a".into(), "w".into()],
            "acc",
            vec![],
        ),
        op_node(
            "Cast",
            "cast",
            vec!["acc".into()],
            "accf",
            vec![int("to", 10)],
        ),
        op_node(
            "Mul",
            "dequant",
            vec!["accf".into(), "scale".into()],
            "y",
            vec![],
        ),
    ];
    model_bytes(
        "qgemm",
        nodes,
        vec![
            init("w", int8, vec![k, n], weights),
            init("scale", f16, vec![n], scales),
        ],
        vec![value_info("a", int8, &[m, k])],
        vec![value_info("y", f16, &[m, n])],
    )
}

/// `y = Conv(x, w)` in fp16: a 3×3 window, stride 1, padding 1, `[n, c, h, w]` to
/// `[n, o, h, w]`, seeded weights scaled as He initialisation scales them. A pointwise
/// convolution (`c` to `c` channels) before it and a GlobalAveragePool after it make its input
/// and output feature maps the layout pass keeps in NC1HWC0, as the measured kernel reads and
/// writes them (a lone convolution between NCHW graph sides runs NCHW); only its kernel is
/// timed (the one with the most products).
fn conv_onnx([n, c, h, w, o]: [u32; 5], seed: u64) -> Vec<u8> {
    let mut b = Builder::new(DType::F16, seed);
    let (n, c, h, w, o) = (
        i64::from(n),
        i64::from(c),
        i64::from(h),
        i64::from(w),
        i64::from(o),
    );
    let he = |fan_in: i64| (6.0 / fan_in as f32).sqrt();
    let conv = |b: &mut Builder, name: &str, x: &str, out: &str, cin: i64, cout: i64, k: i64| {
        let weight = b.weight(&format!("{name}_w"), &[cout, cin, k, k], he(k * k * cin));
        let pad = k / 2;
        op_node(
            "Conv",
            name,
            vec![x.into(), weight],
            out,
            vec![
                ints("kernel_shape", &[k, k]),
                ints("pads", &[pad, pad, pad, pad]),
                ints("strides", &[1, 1]),
            ],
        )
    };
    let nodes = vec![
        conv(&mut b, "before", "x", "x5hd", c, c, 1),
        conv(&mut b, "conv", "x5hd", "y5hd", c, o, 3),
        op_node(
            "GlobalAveragePool",
            "pool",
            vec!["y5hd".into()],
            "y",
            vec![],
        ),
    ];
    let f16 = DType::F16.onnx();
    model_bytes(
        "conv",
        nodes,
        b.inits,
        vec![value_info("x", f16, &[n, c, h, w])],
        vec![value_info("y", f16, &[n, o, 1, 1])],
    )
}

/// `s = x + x; y = s · w + b` over 64×64 fp16: a vector-core kernel, then a MIX kernel (the
/// bias is added on the vector core after the cube's product; a product alone leaves L0C
/// through the FIXPIPE and is a cube-core kernel).
fn mix_startup_onnx() -> Vec<u8> {
    let f16 = DType::F16.onnx();
    let add = op_node("Add", "add", vec!["x".into(), "x".into()], "s", vec![]);
    let matmul = op_node(
        "MatMul",
        "matmul",
        vec!["s".into(), "w".into()],
        "p",
        vec![],
    );
    let bias = op_node("Add", "bias", vec!["p".into(), "b".into()], "y", vec![]);
    let b = TensorProto {
        dims: vec![64],
        data_type: f16,
        name: "b".into(),
        raw_data: Some(
            (0..64)
                .flat_map(|i| half::f16::from_f32(i as f32 / 64.0).to_le_bytes())
                .collect(),
        ),
        ..Default::default()
    };
    model_bytes(
        "mixstartup",
        vec![add, matmul, bias],
        vec![b],
        vec![
            value_info("x", f16, &[64, 64]),
            value_info("w", f16, &[64, 64]),
        ],
        vec![value_info("y", f16, &[64, 64])],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_match_the_published_counts() {
        // torchvision: ResNet-18 1.814 GMACs, ResNet-50 4.089 GMACs per 224×224 image.
        let r18 = Net::ResNet18.macs_per_image() as f64 / 1e9;
        let r50 = Net::ResNet50.macs_per_image() as f64 / 1e9;
        assert!((r18 - 1.814).abs() < 0.01, "{r18}");
        assert!((r50 - 4.089).abs() < 0.02, "{r50}");
    }

    #[test]
    fn mobilenet_v2_has_its_published_size() {
        // Sandler et al. 2018, table 3: 300 M multiply-adds, 3.4 M parameters.
        let net = Net::parse("mobilenetv2").unwrap();
        let macs = net.macs_per_image() as f64 / 1e6;
        assert!((macs - 300.0).abs() < 3.0, "{macs}");
        let m = ModelProto::decode(net.onnx(4, DType::F16, 1).as_slice()).unwrap();
        let g = m.graph.unwrap();
        let count = |op: &str| g.node.iter().filter(|n| n.op_type == op).count();
        assert_eq!(count("Conv"), 52);
        assert_eq!(count("Clip"), 35);
        assert_eq!(count("Add"), 10);
        let depthwise = g
            .node
            .iter()
            .filter(|n| n.attribute.iter().any(|a| a.name == "group" && a.i > 1))
            .count();
        assert_eq!(depthwise, 17);
        let weights: i64 = g
            .initializer
            .iter()
            .filter(|t| !t.dims.is_empty())
            .map(|t| t.dims.iter().product::<i64>())
            .sum();
        assert!((3_400_000..3_550_000).contains(&weights), "{weights}");
    }

    #[test]
    fn bert_base_has_its_published_size() {
        // BERT-base at sequence 128: about 11.2 GMACs (22.3 GFLOPs) a sequence, 85 M
        // encoder weights (without the embeddings and the pooler).
        let b = Net::parse("bertbase").unwrap();
        assert_eq!(b, Net::BertBase);
        assert_eq!(b.macs_per_image(), 11_173_625_856);
        let m = ModelProto::decode(b.onnx(2, DType::F16, 3).as_slice()).unwrap();
        let g = m.graph.unwrap();
        let count = |op: &str| g.node.iter().filter(|n| n.op_type == op).count();
        assert_eq!(count("MatMul"), 12 * 8);
        assert_eq!(count("LayerNormalization"), 24);
        assert_eq!(count("Softmax"), 12);
        assert_eq!(count("Erf"), 12);
        let weights: i64 = g
            .initializer
            .iter()
            .filter(|t| t.data_type == 10 && !t.dims.is_empty())
            .map(|t| t.dims.iter().product::<i64>())
            .sum();
        assert_eq!(weights, 85_054_464);
        assert_eq!(g.node.last().unwrap().output, vec!["output".to_string()]);
        assert_eq!(g.input[0].name, "input");
    }

    #[test]
    fn gemm_names_parse_and_build_one_matmul() {
        let g = Net::parse("gemm2048x4096x4000").unwrap();
        assert_eq!(g.name(), "gemm2048x4096x4000");
        assert_eq!(g.macs_per_image(), 2048 * 4096 * 4000);
        assert_eq!(
            Net::parse("h2d67108864"),
            Some(Net::Copy {
                direction: CopyDirection::HostToDevice,
                bytes: 67_108_864
            })
        );
        assert_eq!(Net::parse("d2d4096").unwrap().name(), "d2d4096");
        for bad in [
            "gemm2048x4096",
            "gemm0x1x1",
            "gemmaxbxc",
            "gemm1x2x3x4",
            "h2d0",
            "h2d",
            "d2d",
        ] {
            assert_eq!(Net::parse(bad), None, "{bad}");
        }
        let m = ModelProto::decode(g.onnx(1, DType::F32, 0).as_slice()).unwrap();
        let graph = m.graph.unwrap();
        assert_eq!(graph.node.len(), 1);
        assert_eq!(graph.node[0].op_type, "MatMul");
        assert_eq!(graph.input.len(), 2);
    }

    #[test]
    fn conv_names_parse_and_build_the_measured_convolution_between_5hd_sides() {
        let c = Net::parse("conv4x128x8x48x1536").unwrap();
        assert_eq!(c.name(), "conv4x128x8x48x1536");
        assert_eq!(c.macs_per_image(), 4 * 128 * 8 * 48 * 1536 * 9);
        for bad in [
            "conv4x128x8x48",
            "conv0x1x1x1x1",
            "conv4x128x8x48x1536x2",
            "convx",
        ] {
            assert_eq!(Net::parse(bad), None, "{bad}");
        }
        let m = ModelProto::decode(c.onnx(1, DType::F32, 3).as_slice()).unwrap();
        let g = m.graph.unwrap();
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Conv", "Conv", "GlobalAveragePool"]);
        let dims: Vec<&[i64]> = g.initializer.iter().map(|t| t.dims.as_slice()).collect();
        assert_eq!(dims, [&[128, 128, 1, 1][..], &[1536, 128, 3, 3][..]]);
        assert!(
            g.initializer
                .iter()
                .all(|t| t.data_type == DType::F16.onnx())
        );
    }

    #[test]
    fn the_models_decode_and_weights_are_seeded() {
        let a = Net::ResNet18.onnx(1, DType::F16, 7);
        let b = Net::ResNet18.onnx(1, DType::F16, 7);
        assert_eq!(a, b);
        let m = ModelProto::decode(a.as_slice()).unwrap();
        let g = m.graph.unwrap();
        // 20 convolutions (BN folded), 17 ReLUs, 8 residual Adds, pool, flatten, Gemm.
        let count = |op: &str| g.node.iter().filter(|n| n.op_type == op).count();
        assert_eq!(count("Conv"), 20);
        assert_eq!(count("Add"), 8);
        assert_eq!(count("Relu"), 17);
        assert_eq!(count("Gemm"), 1);
    }
}
