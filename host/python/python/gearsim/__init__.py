"""gearsim from Python: compile ONNX models with atc's options, run them with ais_bench's
``InferSession`` API on a simulated Ascend-like chip, and read msprof-style profiles and traces.

    >>> import gearsim
    >>> gearsim.compile("cnn.onnx", "cnn", input_shape="input:-1,3,32,32",
    ...                 dynamic_batch_size="1,2,4")                       # doctest: +SKIP
    >>> s = gearsim.InferSession("cnn.om")                               # doctest: +SKIP
    >>> y = s.infer([x], mode="dymbatch")                                # doctest: +SKIP
    >>> s.last_run["ops"][0]["Task Duration(us)"]                        # doctest: +SKIP

Errors raise :class:`GearsimError`, whose ``.code`` is GE's E-code or ACL's return code when
there is one. Simulations release the GIL; Ctrl-C stops a long one (the session is then
closed).
"""

import json
import warnings

import numpy as np

from . import _native
from ._native import GearsimError

__all__ = ["GearsimError", "InferSession", "TensorDesc", "Trace", "compile"]

_GEARSIM_OF = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(np.float64): "f64",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint8): "u8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64",
    np.dtype(np.bool_): "bool",
}
try:  # bfloat16 comes with ml_dtypes when it is installed (onnx and jax bring it)
    import ml_dtypes

    _GEARSIM_OF[np.dtype(ml_dtypes.bfloat16)] = "bf16"
except ImportError:  # pragma: no cover - depends on the environment
    pass
_NUMPY_OF = {v: k for k, v in _GEARSIM_OF.items()}

_MODES = ("static", "dymbatch", "dymhw", "dymdims", "dymshape")
_GEAR_MODE = {"dymbatch": "batch", "dymhw": "image_size", "dymdims": "dims"}


def _error(message, code=None):
    e = GearsimError(message)
    e.code = code
    e.message = message
    return e


def compile(model, output, *, input_shape=None, dynamic_batch_size=None,
            dynamic_image_size=None, dynamic_dims=None, soc_version="ascend910",
            getnext_sink=False, hybrid=False, **atc_options):
    """Compiles the ONNX file ``model`` into ``output.om`` as ``gearsim compile`` (atc) does,
    with the same checks and E-codes; other atc options (``precision_mode``,
    ``fusion_switch_file``, ``input_format``, ``insert_op_conf``, ...) go in ``atc_options``,
    and ``set={"section.key": value}`` changes chip values as ``--set`` does.
    Returns the compile report as a dict (``om``, ``kernels``, ``gears``, sizes, notes)."""
    options = dict(atc_options)
    options.update(
        input_shape=input_shape,
        dynamic_batch_size=dynamic_batch_size,
        dynamic_image_size=dynamic_image_size,
        dynamic_dims=dynamic_dims,
        soc_version=soc_version,
        getnext_sink=getnext_sink,
        hybrid=hybrid,
    )
    return json.loads(_native.compile(str(model), str(output), options))


class TensorDesc:
    """An input or output of a model: ``name``, ``shape`` (-1 for a gear axis),
    ``datatype`` (a numpy dtype), ``format``, and ``size`` in bytes at the largest gear."""

    def __init__(self, d):
        self.name = d["name"]
        self.shape = list(d["dims"])
        self.max_shape = list(d["max_dims"])
        self.datatype = _NUMPY_OF.get(d["dtype"], d["dtype"])
        self.format = d["format"]
        self.size = d["bytes"]

    def __repr__(self):
        return (f"TensorDesc(name={self.name!r}, shape={self.shape}, "
                f"datatype={self.datatype}, format={self.format!r})")


def _views(outputs, names):
    arrays = []
    for (dtype, shape, data), name in zip(outputs, names):
        np_dtype = _NUMPY_OF.get(dtype)
        if np_dtype is None:
            warnings.warn(f"output `{name}` is {dtype}, which numpy lacks: returned as raw bytes")
            arrays.append(data)
            continue
        arrays.append(data.view(np_dtype).reshape(shape))
    return arrays


class InferSession:
    """A compiled model loaded on its own simulated device, with ais_bench's API.

    ``timing_only`` simulates time without computing values (outputs are then zeros);
    ``profile`` names a directory that receives msprof-style ``op_summary.csv``,
    ``task_time.csv`` and ``summary.json`` after every run; ``trace`` a ``.gtrace`` file
    written when the session is closed, recorded at ``trace_level`` ``"task"``, ``"kernel"``
    (one span per kernel block on each core, pipe busy shares) or ``"instruction"``; ``set``
    changes chip values as ``--set`` does, e.g. ``{"scheduler.kernel_launch_ns": 2500}`` (the
    key must be in the preset and the value of its type)."""

    def __init__(self, model_path, soc_version=None, timing_only=False, profile=None,
                 trace=None, trace_level="kernel", set=None):
        self._native = _native.Session(
            str(model_path), soc_version, bool(timing_only),
            None if profile is None else str(profile),
            None if trace is None else str(trace),
            str(trace_level),
            None if set is None else dict(set),
        )
        self._desc = json.loads(self._native.describe())
        n = self._desc["data_inputs"]
        self._inputs = [TensorDesc(d) for d in self._desc["inputs"][:n]]
        self._outputs = [TensorDesc(d) for d in self._desc["outputs"]]
        #: The last run: gear, cur_dynamic_dims, times (device, execute, host, end to end, in
        #: us), H2D / D2H bytes and transfers, path and reason, phases, per-op profile (msprof's
        #: op_summary columns), NPU compute time over the runs so far.
        self.last_run = None

    # ---- ais_bench's descriptors -----------------------------------------------------------

    def get_inputs(self):
        """The model's data inputs, in order."""
        return list(self._inputs)

    def get_outputs(self):
        """The model's outputs, in order."""
        return list(self._outputs)

    @property
    def gears(self):
        """The gears in order (each a list: the batch, ``[h, w]``, or the dims), or ``[]``."""
        return [list(g) for g in (self._desc["gears"] or [])]

    @property
    def gear_mode(self):
        """``"batch"``, ``"image_size"``, ``"dims"`` or None for a model without gears."""
        return self._desc["gear_mode"]

    @property
    def is_sink(self):
        """Whether the model was compiled for GetNext sink mode."""
        return self._desc["sink"]

    # ---- running ---------------------------------------------------------------------------

    def _feeds(self, feeds):
        if isinstance(feeds, dict):
            names = [d.name for d in self._inputs]
            unknown = [k for k in feeds if k not in names]
            if unknown:
                raise _error(f"[100000] no input named {unknown[0]!r} (inputs: {names})", "100000")
            missing = [k for k in names if k not in feeds]
            if missing:
                raise _error(f"[100000] input {missing[0]!r} is not fed", "100000")
            feeds = [feeds[k] for k in names]
        if isinstance(feeds, np.ndarray):
            feeds = [feeds]
        feeds = list(feeds)
        if len(feeds) != len(self._inputs):
            raise _error(
                f"[100000] model `{self._desc['name']}` takes {len(self._inputs)} input(s) "
                f"({', '.join(d.name for d in self._inputs)}), got {len(feeds)}", "100000")
        out = []
        for i, (x, d) in enumerate(zip(feeds, self._inputs)):
            if not isinstance(x, np.ndarray):
                raise _error(f"[100000] input {i} (`{d.name}`): expected a numpy array, "
                             f"got {type(x).__name__}", "100000")
            if x.dtype != d.datatype:
                raise _error(f"[100000] input {i} (`{d.name}`): the model takes {d.datatype}, "
                             f"got {x.dtype}", "100000")
            x = np.ascontiguousarray(x)
            out.append((_GEARSIM_OF[x.dtype], list(x.shape), x.reshape(-1).view(np.uint8)))
        return out

    def _check_mode(self, mode):
        if mode not in _MODES:
            raise _error(f"infer: mode must be one of {', '.join(_MODES)}, got {mode!r}")
        gear = self.gear_mode
        if mode == "static" and gear is not None:
            raise _error(f"infer: the model has {gear} gears {self.gears}: use mode="
                         f"{[k for k, v in _GEAR_MODE.items() if v == gear][0]!r}")
        if mode in _GEAR_MODE and _GEAR_MODE[mode] != gear:
            raise _error(f"infer: mode={mode!r} needs a model with {_GEAR_MODE[mode]} gears; "
                         f"this one has {gear or 'none'}")
        if mode == "dymshape" and not self._desc["hybrid"]:
            raise _error("infer: mode='dymshape' runs the dynamic-shape path, which needs a "
                         "model compiled with hybrid=True")

    def _finish(self, outputs, report):
        self.last_run = json.loads(report)
        return _views(outputs, [d.name for d in self._outputs])

    def infer(self, feeds, mode="static", pad_to_gear=False):
        """Runs the model once on ``feeds`` (arrays in input order, or a dict by input name)
        and returns the outputs as numpy arrays at the gear's real shapes. ``mode`` is
        ais_bench's: ``static`` for a model without gears, ``dymbatch`` / ``dymhw`` /
        ``dymdims`` for one with batch / image-size / dims gears (the gear follows the
        inputs' shapes), ``dymshape`` for a hybrid model's dynamic-shape path. A sink model's
        item goes through its data queue.

        ``pad_to_gear`` (dynamic batch): a batch between two gears is padded with zero rows
        up to the next larger gear, run there, and its outputs cut back; ``last_run["padded"]``
        says from and to and the share wasted. The model must pass the padding check (its
        rows independent, every output following the batch), run once per session on the
        device; one that fails raises with the reason."""
        self._check_mode(mode)
        if pad_to_gear and mode != "dymbatch":
            raise _error(f"infer: pad_to_gear pads the batch, so it needs mode='dymbatch', "
                         f"got {mode!r}")
        fed = self._feeds(feeds)
        return self._finish(*self._native.run(fed, mode == "dymshape", bool(pad_to_gear)))

    def enqueue(self, feeds):
        """Sink mode: hands one item to the model's data queue (the copies overlap whatever the
        device is doing)."""
        self._native.enqueue(self._feeds(feeds))

    def run_queued(self):
        """Sink mode: runs the model on the oldest queued item; returns its outputs."""
        return self._finish(*self._native.run_queued())

    def summary(self):
        """ais_bench's summary over every run so far: NPU compute time ``min_ms`` / ``max_ms``
        / ``mean_ms`` / ``median_ms``, ``loops``, ``batch`` and ``throughput``
        (1000 * batch / mean), or None before the first run."""
        return json.loads(self._native.summary())

    def close(self):
        """Finishes the trace file, if any, and frees the device."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Trace:
    """A ``.gtrace`` file (from ``gearsim run --trace`` or ``InferSession(trace=...)``),
    validated and memory-mapped. Each table is a list of dicts: one line into pandas."""

    def __init__(self, path):
        self._native = _native.Trace(str(path))

    def summary(self):
        """Records, spans and the time window (us)."""
        return json.loads(self._native.summary())

    def lanes(self):
        """Per lane: process, thread, kind, spans, busy_us, busy_share of the window."""
        return json.loads(self._native.lanes())

    def ops(self):
        """Every kernel task (op): name, kind, stream, start_us, duration_us."""
        return json.loads(self._native.ops())

    def export(self, path, format="perfetto_proto", level="instruction", window=None,
               cores=None):
        """Writes the trace for ui.perfetto.dev: ``format`` ``"perfetto_proto"`` (Perfetto's
        protobuf, several times smaller) or ``"perfetto"`` (JSON); ``level`` ``"task"``,
        ``"kernel"`` (a span per kernel per core, per-pipe busy counters) or
        ``"instruction"``; ``window`` ``(start_us, end_us)``; ``cores`` a list of core
        numbers. Returns the bytes written."""
        return self._native.export(str(path), format, level,
                                   None if window is None else tuple(window),
                                   None if cores is None else list(cores))

    def phases(self):
        """Per phase of the model runs (H2D, GetNext, GetDynamicDims, MapIndex, branch, D2H):
        count and total us."""
        return json.loads(self._native.phases())
