"""Exports the two whole-model conformance models from PyTorch and stores onnxruntime's outputs.

    python3 tests/models/make_torch_models.py      # needs torch, onnx, onnxruntime, numpy

Writes into tests/models/torch/:
  cnn_torch.onnx          a torchvision-style CNN (MobileNetV2-like): stem conv + BN + ReLU6,
                          inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project,
                          residual add), max pool, global average pool, linear; batch dynamic.
  transformer_torch.onnx  a transformer encoder layer (multi-head softmax attention, LayerNorm,
                          GELU MLP, residuals) on [1, S, 64]; sequence length dynamic.
  qkv_encoder_torch.onnx  a 2-block transformer encoder on token ids [B, S] (embedding, one
                          fused Linear(d, 3d) for Q, K and V split with .chunk(3, dim=-1),
                          softmax attention, GELU MLP, pre-LayerNorm); batch and sequence
                          dynamic (the legacy exporter computes the chunk bounds from Shape).
  gpt_torch.onnx          a 2-block GPT-2-style decoder on token ids [B, T] (token and position
                          embeddings with torch.arange, causal mask from torch.tril and
                          masked_fill, fused c_attn split, tanh GELU with torch.pow, pre-
                          LayerNorm, tied-free LM head); batch and sequence dynamic.
  yolo_torch.onnx         a YOLOv5-style detector (Conv + BN + SiLU, C3 blocks with residual
                          bottlenecks, SPPF's chained 5x5 max pools, a top-down neck with
                          nn.Upsample(scale_factor=2) (Resize) and Concat, two detection heads
                          reshaped per anchor, permuted and passed through a sigmoid); image
                          height and width dynamic.
  unet_torch.onnx         a U-Net (two 2x2-pool encoder levels, Conv + GroupNorm + ReLU blocks,
                          skip connections by Concat, a ConvTranspose 2x2 stride-2 decoder level
                          and a bilinear F.interpolate one); image height and width dynamic.
  bert_torch.onnx         Hugging Face transformers' BertModel (2 layers, hidden 64, random
                          weights) exported by the dynamo exporter (torch.export) at opset 18:
                          input_ids and attention_mask [B, 64], batch dynamic; its mask path
                          uses GatherElements, GatherND, IsNaN, Range, Max and Where.
                          Needs transformers and onnxscript as well.
  <model>_<gear>_input_<i>.npy / _output_<i>.npy
                          seeded random inputs per gear and onnxruntime's outputs for them.

Weights are random (seeded); the models are in eval mode. The committed files are what the
Rust test reads, so the test needs none of these packages.
"""

import math
import os

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch")
OPSET = 17

CNN_GEARS = [1, 2, 4]
TRANSFORMER_GEARS = [16, 32, 64]


class InvertedResidual(nn.Module):
    def __init__(self, c_in, c_out, stride, expand):
        super().__init__()
        hidden = c_in * expand
        self.use_residual = stride == 1 and c_in == c_out
        self.block = nn.Sequential(
            nn.Conv2d(c_in, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        )

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_residual else y


class TorchCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        )
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 1, 2),
            InvertedResidual(16, 24, 2, 2),
            InvertedResidual(24, 24, 1, 2),
        )
        self.pool = nn.MaxPool2d(2, 2)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10))

    def forward(self, x):
        return self.head(self.pool(self.blocks(self.stem(x))))


class EncoderLayer(nn.Module):
    def __init__(self, d=64, heads=4, ff=128):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.act = nn.GELU()

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)

        def heads(t):
            return t.reshape(b, s, self.heads, self.dh).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        att = torch.softmax(q @ k.transpose(-2, -1) / (self.dh ** 0.5), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.ff2(self.act(self.ff1(x))))


class QkvBlock(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def heads(t):
            return t.view(b, s, self.heads, self.dh).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        att = torch.softmax(q @ k.transpose(-2, -1) / (self.dh ** 0.5), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class QkvEncoder(nn.Module):
    def __init__(self, vocab=100, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(QkvBlock(d), QkvBlock(d))
        self.ln = nn.LayerNorm(d)

    def forward(self, ids):
        return self.ln(self.blocks(self.emb(ids)))


QKV_GEARS = [(1, 8), (2, 16), (4, 32)]
QKV_VOCAB = 100


def qkv_encoder():
    """The fused-QKV encoder and its references, from their own seeds (independent of the
    other models, so regenerating one leaves the others' files alone)."""
    torch.manual_seed(1)
    token_model("qkv_encoder_torch", QkvEncoder(QKV_VOCAB), QKV_GEARS, 1)


class NewGelu(nn.Module):
    def forward(self, x):
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))


class GptBlock(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.d, self.heads = d, heads
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.act = NewGelu()

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln1(x)).split(self.d, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.tril(torch.ones(t, t)).view(1, 1, t, t)
        att = torch.softmax(att.masked_fill(mask == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.proj(self.act(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab=100, d=64, max_t=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_t, d)
        self.h = nn.Sequential(GptBlock(d), GptBlock(d))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(0, t, dtype=torch.long)
        return self.head(self.ln_f(self.h(self.wte(ids) + self.wpe(pos))))


def token_model(name, model, gears, seed):
    """Exports a model on token ids [B, T] (batch and sequence dynamic) with the legacy
    exporter and stores onnxruntime's outputs per gear, from its own seed."""
    rng = np.random.default_rng(seed)
    path = os.path.join(HERE, f"{name}.onnx")
    axes = {0: "batch", 1: "seq"}
    export(model, torch.zeros(2, 16, dtype=torch.int64), path, "ids", axes, axes)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b, s in gears:
        ids = rng.integers(0, QKV_VOCAB, (b, s)).astype(np.int64)
        (y,) = session.run(None, {"ids": ids})
        np.save(os.path.join(HERE, f"{name}_{b}x{s}_input_0.npy"), ids)
        np.save(os.path.join(HERE, f"{name}_{b}x{s}_output_0.npy"), y.astype(np.float32))


def gpt():
    torch.manual_seed(2)
    token_model("gpt_torch", Gpt(QKV_VOCAB), QKV_GEARS, 2)


class ConvBnSilu(nn.Module):
    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        super().__init__()
        self.cv1 = ConvBnSilu(c, c, 1)
        self.cv2 = ConvBnSilu(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    def __init__(self, cin, cout, n=1, shortcut=True):
        super().__init__()
        h = cout // 2
        self.cv1 = ConvBnSilu(cin, h)
        self.cv2 = ConvBnSilu(cin, h)
        self.m = nn.Sequential(*(Bottleneck(h, shortcut) for _ in range(n)))
        self.cv3 = ConvBnSilu(2 * h, cout)

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class Sppf(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        h = cin // 2
        self.cv1 = ConvBnSilu(cin, h)
        self.cv2 = ConvBnSilu(4 * h, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat((x, y1, y2, self.pool(y2)), 1))


class Yolo(nn.Module):
    """A small YOLOv5-style detector: P3 (stride 8) and P4 (stride 16) heads."""

    ANCHORS = 3
    CLASSES = 4

    def __init__(self):
        super().__init__()
        self.stem = ConvBnSilu(3, 16, 3, 2)
        self.down1 = ConvBnSilu(16, 32, 3, 2)
        self.c3_1 = C3(32, 32)
        self.down2 = ConvBnSilu(32, 64, 3, 2)
        self.c3_2 = C3(64, 64, 2)
        self.down3 = ConvBnSilu(64, 128, 3, 2)
        self.c3_3 = C3(128, 128)
        self.sppf = Sppf(128, 128)
        self.lat = ConvBnSilu(128, 64)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.c3_4 = C3(128, 64, shortcut=False)
        self.head3 = nn.Conv2d(64, self.ANCHORS * (5 + self.CLASSES), 1)
        self.head4 = nn.Conv2d(128, self.ANCHORS * (5 + self.CLASSES), 1)

    def detect(self, x):
        b, _, h, w = x.shape
        x = x.view(b, self.ANCHORS, 5 + self.CLASSES, h, w).permute(0, 1, 3, 4, 2)
        return x.sigmoid().reshape(b, -1, 5 + self.CLASSES)

    def forward(self, x):
        p3 = self.c3_2(self.down2(self.c3_1(self.down1(self.stem(x)))))
        p4 = self.sppf(self.c3_3(self.down3(p3)))
        lat = self.lat(p4)
        n3 = self.c3_4(torch.cat((self.up(lat), p3), 1))
        return torch.cat((self.detect(self.head3(n3)), self.detect(self.head4(p4))), 1)


YOLO_GEARS = [(64, 64), (96, 128), (128, 160)]


def yolo(rng):
    torch.manual_seed(3)
    model = Yolo().eval()
    with torch.no_grad():
        randomize_batch_norm(model, rng)
    path = os.path.join(HERE, "yolo_torch.onnx")
    image = {2: "height", 3: "width"}
    export(model, torch.zeros(1, 3, 64, 64), path, "images", image, {1: "boxes"})
    references(
        "yolo_torch", path, "images", [(f"{h}x{w}", (1, 3, h, w)) for h, w in YOLO_GEARS], rng
    )


class DoubleConv(nn.Module):
    def __init__(self, cin, cout, groups=4):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(cin, cout, 3, 1, 1, bias=False),
            nn.GroupNorm(groups, cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.GroupNorm(groups, cout),
            nn.ReLU(),
        )

    def forward(self, x):
        return self.block(x)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = DoubleConv(3, 16)
        self.enc2 = DoubleConv(16, 32)
        self.mid = DoubleConv(32, 64)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, 2)
        self.dec2 = DoubleConv(64, 32)
        self.reduce1 = nn.Conv2d(32, 16, 1)
        self.dec1 = DoubleConv(32, 16)
        self.head = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat((self.up2(m), e2), 1))
        up1 = nn.functional.interpolate(
            self.reduce1(d2), scale_factor=2.0, mode="bilinear", align_corners=False
        )
        return self.head(self.dec1(torch.cat((up1, e1), 1)))


UNET_GEARS = [(32, 32), (48, 64), (64, 96)]


def unet(rng):
    torch.manual_seed(4)
    model = UNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm):
                c = m.num_channels
                m.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, c).astype(np.float32)))
                m.bias.copy_(torch.from_numpy(rng.uniform(-0.2, 0.2, c).astype(np.float32)))
    path = os.path.join(HERE, "unet_torch.onnx")
    image = {2: "height", 3: "width"}
    export(model, torch.zeros(1, 3, 32, 32), path, "image", image, image)
    references(
        "unet_torch", path, "image", [(f"{h}x{w}", (1, 3, h, w)) for h, w in UNET_GEARS], rng
    )


BERT_GEARS = [1, 2, 4]
BERT_SEQ = 64


def bert(rng):
    from transformers import BertConfig, BertModel

    torch.manual_seed(5)
    config = BertConfig(
        vocab_size=QKV_VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=BERT_SEQ,
    )

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config).eval()

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = Hidden().eval()
    path = os.path.join(HERE, "bert_torch.onnx")
    batch = torch.export.Dim("batch", min=1, max=8)
    example = torch.zeros(2, BERT_SEQ, dtype=torch.int64)
    torch.onnx.export(
        model,
        (example, torch.ones_like(example)),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["hidden"],
        dynamic_shapes={"input_ids": {0: batch}, "attention_mask": {0: batch}},
        opset_version=18,
        dynamo=True,
        external_data=False,
    )
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b in BERT_GEARS:
        ids = rng.integers(0, QKV_VOCAB, (b, BERT_SEQ)).astype(np.int64)
        # Each sequence padded after its own length.
        mask = (np.arange(BERT_SEQ)[None, :] < rng.integers(8, BERT_SEQ + 1, (b, 1))).astype(np.int64)
        (y,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        np.save(os.path.join(HERE, f"bert_torch_{b}_input_0.npy"), ids)
        np.save(os.path.join(HERE, f"bert_torch_{b}_input_1.npy"), mask)
        np.save(os.path.join(HERE, f"bert_torch_{b}_output_0.npy"), y.astype(np.float32))


def export(model, example, path, input_name, input_axes, output_axes):
    """The legacy exporter at OPSET: one input, output "output", the named dynamic axes."""
    model.eval()
    torch.onnx.export(
        model,
        (example,),
        path,
        input_names=[input_name],
        output_names=["output"],
        dynamic_axes={input_name: input_axes, "output": output_axes},
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )


def randomize_batch_norm(model, rng):
    # Fresh BatchNorm layers are the identity; give them statistics worth testing.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, c).astype(np.float32)))
            m.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, c).astype(np.float32)))
            m.weight.data.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, c).astype(np.float32)))
            m.bias.data.copy_(torch.from_numpy(rng.uniform(-0.2, 0.2, c).astype(np.float32)))


def references(name, path, input_name, shapes, rng):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for gear, shape in shapes:
        x = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        (y,) = session.run(None, {input_name: x})
        np.save(os.path.join(HERE, f"{name}_{gear}_input_0.npy"), x)
        np.save(os.path.join(HERE, f"{name}_{gear}_output_0.npy"), y.astype(np.float32))


def main():
    os.makedirs(HERE, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    cnn = TorchCnn()
    with torch.no_grad():
        randomize_batch_norm(cnn, rng)
    path = os.path.join(HERE, "cnn_torch.onnx")
    export(cnn, torch.zeros(1, 3, 32, 32), path, "input", {0: "batch"}, {0: "batch"})
    references("cnn_torch", path, "input", [(b, (b, 3, 32, 32)) for b in CNN_GEARS], rng)
    tf = EncoderLayer()
    path = os.path.join(HERE, "transformer_torch.onnx")
    export(tf, torch.zeros(1, 16, 64), path, "x", {1: "seq"}, {1: "seq"})
    references("transformer_torch", path, "x", [(s, (1, s, 64)) for s in TRANSFORMER_GEARS], rng)
    qkv_encoder()
    gpt()
    yolo(np.random.default_rng(3))
    unet(np.random.default_rng(4))
    bert(np.random.default_rng(5))


if __name__ == "__main__":
    main()
